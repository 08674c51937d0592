// What the commands of `fusor` share: the global options, how a failure is
// said (and the exit status it gives), and how the scheduler and the target
// are found.
#pragma once

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/hw/target.h"
#include "fusor/v1/scheduler.pb.h"
#include "proto/wire/channel.h"

namespace fusor::cli {

struct GlobalOptions {
  std::string server;
  std::string token;
  wire::ClientTls tls;
  std::string db_path;
  std::string backend = "cpu";
  std::string target_fp;
  double timeout_s = 3600;
  bool timeout_given = false;  // --timeout was on the command line
  double calibration_s = 0.3;
  double max_spread = 0;  // embedded scheduler: 0 for the default bound
  bool verbose = false;
};

std::string Env(const char* name);

int64_t NowMs();

// Says `st` on stderr; the exit status: 4 over a quota (worth retrying
// after the hint), 3 for NOT_FOUND, else 1.
int Fail(const absl::Status& st);

// -o/--output on `cmd`: text (the default), or json: one JSON object per
// line on standard output for each answer (protobuf's JSON mapping with the
// .proto's field names; 64-bit integers as strings), and for each failure
// {"error": {"code", "message"}}, so that a script reads a line per input.
void AddOutputOption(CLI::App* cmd, std::string& output);
// `m` as one line of JSON with the fields of `extra` (e.g. the file) added.
std::string JsonLine(const google::protobuf::Message& m, const nlohmann::json& extra = nlohmann::json::object());
// Fail(st), having printed `extra` with {"error": ...} as a line of JSON
// when `json`.
int Fail(const absl::Status& st, bool json, nlohmann::json extra = nlohmann::json::object());

// A channel to --server, with the hint said after UNAVAILABLE.
absl::StatusOr<std::shared_ptr<grpc::Channel>> DialServer(const GlobalOptions& g);

v1::TargetSelector Selector(const GlobalOptions& g);

std::string WorkloadName(const std::string& path);

// The target explain describes: a device from the table, this CPU
// (described and briefly calibrated), or a target a worker registered.
absl::StatusOr<hw::TargetDesc> ExplainTarget(const GlobalOptions& g);

}  // namespace fusor::cli
