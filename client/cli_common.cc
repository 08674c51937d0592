#include "client/cli_common.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/embedded.h"
#include "common/hw/devices.h"
#include "common/util/files.h"
#include "common/util/process.h"
#include "proto/wire/convert.h"
#include "proto/wire/grpc_status.h"
#include "worker/cpu/cpu_target.h"
#include "worker/job.h"

namespace fusor::cli {
namespace {

// Said after an UNAVAILABLE from a remote scheduler (set once it is dialed).
std::string unavailable_hint;

}  // namespace

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int Fail(const absl::Status& st) {
  std::cerr << "fusor: " << st.message() << " [" << absl::StatusCodeToString(st.code()) << "]\n";
  if (absl::IsUnavailable(st) && !unavailable_hint.empty()) std::cerr << "fusor: " << unavailable_hint << "\n";
  if (fusor::wire::RetryAfter(st)) return 4;  // over a quota: worth retrying after the hint
  return absl::IsNotFound(st) ? 3 : 1;
}

void AddOutputOption(CLI::App* cmd, std::string& output) {
  cmd->add_option("-o,--output", output, "text, or json: a JSON object per line for each answer and each failure")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
}

std::string JsonLine(const google::protobuf::Message& m, const nlohmann::json& extra) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string text;
  (void)google::protobuf::util::MessageToJsonString(m, &text, options);  // fails only on malformed Any fields
  nlohmann::json j = extra;
  j.update(nlohmann::json::parse(text));
  return j.dump();
}

int Fail(const absl::Status& st, bool json, nlohmann::json extra) {
  if (json) {
    extra["error"] = {{"code", absl::StatusCodeToString(st.code())}, {"message", std::string(st.message())}};
    std::cout << extra.dump() << std::endl;
  }
  return Fail(st);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> DialServer(const GlobalOptions& g) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto dialed = fusor::wire::Dial(g.server, g.token, g.tls, args);
  unavailable_hint = g.tls.on()
                         ? "is " + g.server + " up, serving TLS with a certificate --tls-ca signed for that name? "
                                              "A scheduler with mutual TLS also needs --tls-cert and --tls-key"
                         : "is " + g.server + " up? A scheduler serving TLS needs --tls-ca (or --tls)";
  return dialed;
}

fusor::v1::TargetSelector Selector(const GlobalOptions& g) {
  fusor::v1::TargetSelector s;
  s.set_backend(g.backend == "cuda" ? fusor::v1::BACKEND_CUDA : fusor::v1::BACKEND_CPU);
  s.set_fingerprint(g.target_fp);
  return s;
}

std::string WorkloadName(const std::string& path) { return std::filesystem::path(path).stem().string(); }

absl::StatusOr<fusor::hw::TargetDesc> ExplainTarget(const GlobalOptions& g) {
  if (auto device = fusor::hw::LookupDevice(g.target_fp)) return *device;
  if (g.target_fp.empty() || g.target_fp == "local") {
    const std::string scratch = Env("TMPDIR").empty() ? "/tmp" : Env("TMPDIR");
    auto dir = fusor::TempDir::Create(scratch, "fusor-explain-");
    if (!dir.ok()) return dir.status();
    auto target = fusor::worker::DescribeCpu("c++", dir->path());
    if (!target.ok()) return target.status();
    fusor::worker::JobSpec spec;
    spec.kind = fusor::worker::JobKind::kCalibrate;
    spec.target = *target;
    spec.timing.time_budget_s = std::min(g.calibration_s, 0.1);
    fusor::worker::JobOutcome out =
        fusor::worker::RunJobIsolated(spec, fusor::CurrentExecutable("fusor"), scratch);
    if (out.status == fusor::worker::OutcomeStatus::kOk) {
      target->bandwidth_bytes_per_s = out.bandwidth_bytes_per_s;
      target->peak_flops = out.peak_flops;
    }
    return *target;
  }
  // A fingerprint: ask the scheduler (remote, or embedded on --db).
  std::unique_ptr<fusor::client::Embedded> embedded;
  std::shared_ptr<grpc::Channel> channel;
  if (!g.server.empty()) {
    auto dialed = DialServer(g);
    if (!dialed.ok()) return dialed.status();
    channel = *dialed;
  } else {
    fusor::server::SchedulerOptions options;
    options.db_path = g.db_path;
    auto started = fusor::client::Embedded::Start(options, std::nullopt);
    if (!started.ok()) return started.status();
    embedded = std::move(*started);
    channel = embedded->channel();
  }
  auto workers = fusor::client::Client(channel).ListWorkers();
  if (!workers.ok()) return workers.status();
  for (const auto& w : workers->workers()) {
    if (w.target().fingerprint() == g.target_fp) return fusor::wire::TargetFromProto(w.target());
  }
  return absl::NotFoundError(absl::StrCat("no device or registered target called '", g.target_fp, "'"));
}

}  // namespace fusor::cli
