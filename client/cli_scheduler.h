// The commands a scheduler answers (remote, or embedded in this process):
// tune, compile, lookup, workers, health and task. Each is declared on the
// app by Add<Command> and run by Run<Command> once the command line is
// parsed and the scheduler is there.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "client/cli_common.h"
#include "client/client.h"

namespace fusor::cli {

struct TuneCommand {
  CLI::App* cmd = nullptr;
  std::vector<std::string> files;
  int budget = 0;
  bool force = false;
  std::vector<std::string> vary;  // dims served over a range of sizes (v1::Workload.vary)
  bool transfer = false;
  std::string output = "text";  // -o
};
void AddTune(CLI::App& app, TuneCommand& c);
int RunTune(client::Client& client, const GlobalOptions& g, const TuneCommand& c);

struct CompileCommand {
  CLI::App* cmd = nullptr;
  std::string file;
  std::string out_dir = "fusor-out";
  int budget = 0;
  bool cache_only = false;
  bool model_only = false;
  std::string schedule;      // with --model-only
  std::string unfused_blas;  // --unfused
  std::vector<std::string> vary;
  bool transfer = false;
};
// Its --target sets g.target_fp.
void AddCompile(CLI::App& app, GlobalOptions& g, CompileCommand& c);
// compile --model-only and --unfused need no scheduler: their exit status
// (or a usage error's), nullopt for a compile the scheduler answers.
std::optional<int> RunCompileOffline(const GlobalOptions& g, const CompileCommand& c);
int RunCompile(client::Client& client, const GlobalOptions& g, const CompileCommand& c);

struct LookupCommand {
  CLI::App* cmd = nullptr;
  std::vector<std::string> files;
  std::vector<std::string> vary;
  bool why = false;
  std::string output = "text";
};
void AddLookup(CLI::App& app, LookupCommand& c);
int RunLookup(client::Client& client, const GlobalOptions& g, const LookupCommand& c);

struct WorkersCommand {
  CLI::App* cmd = nullptr;
  std::string output = "text";
};
void AddWorkers(CLI::App& app, WorkersCommand& c);
int RunWorkers(client::Client& client, const WorkersCommand& c);

struct HealthCommand {
  CLI::App* cmd = nullptr;
  std::string output = "text";
};
void AddHealth(CLI::App& app, HealthCommand& c);
int RunHealth(client::Client& client, const GlobalOptions& g, const HealthCommand& c);

struct TaskCommand {
  CLI::App* cmd = nullptr;
  std::string id;
  std::string output = "text";
};
void AddTask(CLI::App& app, TaskCommand& c);
int RunTask(client::Client& client, const TaskCommand& c);

}  // namespace fusor::cli
