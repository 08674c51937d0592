// The commands that look at chains and models without a scheduler:
// reference, explain, mappings and extract.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "client/cli_common.h"
#include "common/space/space.h"

namespace fusor::cli {

struct ReferenceCommand {
  CLI::App* cmd = nullptr;
  std::string file;
  uint64_t seed = 1;
  std::string out_dir = "fusor-reference";
};
void AddReference(CLI::App& app, ReferenceCommand& c);
int RunReference(const ReferenceCommand& c);

struct ExplainCommand {
  CLI::App* cmd = nullptr;
  std::string file;
  int top = 10;
  space::SpaceOptions space_options;
};
// Its --target sets g.target_fp.
void AddExplain(CLI::App& app, GlobalOptions& g, ExplainCommand& c);
int RunExplain(const GlobalOptions& g, const ExplainCommand& c);

struct MappingsCommand {
  CLI::App* cmd = nullptr;
  std::vector<std::string> files;
  std::string intrinsic_name;
  bool summary = false;
};
// Its --target sets g.target_fp.
void AddMappings(CLI::App& app, GlobalOptions& g, MappingsCommand& c);
int RunMappings(const GlobalOptions& g, const MappingsCommand& c);

struct ExtractCommand {
  CLI::App* cmd = nullptr;
  std::string file;
  std::vector<std::string> dim_bindings;
  std::string out_dir;
};
void AddExtract(CLI::App& app, ExtractCommand& c);
int RunExtract(const ExtractCommand& c);

}  // namespace fusor::cli
