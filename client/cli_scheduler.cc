#include "client/cli_scheduler.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/model_only.h"
#include "client/report.h"
#include "common/codegen/cpu/cpu_codegen.h"
#include "common/hw/devices.h"
#include "common/util/files.h"
#include "common/util/log.h"
#include "proto/wire/convert.h"

namespace fusor::cli {
namespace {

using fusor::client::Client;

// compile --model-only: no scheduler, no worker, nothing stored.
int CompileModelOnly(const GlobalOptions& g, const std::string& file, const std::string& out_dir,
                     const std::string& schedule) {
  fusor::SetLogLevel("warn");
  if (g.target_fp.empty()) {
    return Fail(absl::InvalidArgumentError("--model-only needs --target: a GPU (" +
                                           absl::StrJoin(fusor::hw::DeviceNames(), ", ") +
                                           "), an arch (sm_80, sm_86, sm_89, sm_90) or local"));
  }
  auto workload = fusor::client::ReadWorkloadFile(file);
  if (!workload.ok()) return Fail(workload.status());
  auto chain = fusor::wire::ChainFromWorkload(*workload);
  if (!chain.ok()) return Fail(chain.status());
  auto target = g.target_fp == "local" ? ExplainTarget(g) : fusor::client::GpuTarget(g.target_fp);
  if (!target.ok()) return Fail(target.status());
  auto out = fusor::client::CompileModelOnly(*chain, *target, WorkloadName(file), out_dir, schedule);
  if (!out.ok()) return Fail(out.status());
  std::cout << "UNMEASURED: ranked by the cost model alone for " << target->device_name << " (" << target->arch
            << "); not stored\n";
  std::cout << "schedule   " << out->schedule << "  ("
            << (out->rank > 0 ? absl::StrCat("model rank ", out->rank) : std::string("given, not in the pruned space"))
            << ", predicted "
            << fusor::client::FormatSeconds(out->predicted_s) << ")\n";
  std::cout << "mapping    " << out->mapping << "\n";
  for (const std::string& s : out->skipped) std::cout << "skipped    " << s << "\n";
  for (size_t i = 0; i < out->files.size(); ++i) std::cout << (i == 0 ? "wrote      " : "           ") << out->files[i] << "\n";
  return 0;
}

// compile --unfused: the baseline's source, as a worker builds it.
int CompileUnfused(const std::string& file, const std::string& out_dir, const std::string& blas) {
  auto workload = fusor::client::ReadWorkloadFile(file);
  if (!workload.ok()) return Fail(workload.status());
  auto chain = fusor::wire::ChainFromWorkload(*workload);
  if (!chain.ok()) return Fail(chain.status());
  // The option's choices are the libraries' names.
  auto kernel = fusor::codegen::EmitCpuUnfusedBaseline(*chain, *fusor::codegen::CpuBlasNamed(blas));
  if (!kernel.ok()) return Fail(kernel.status());
  const nlohmann::json meta = nlohmann::json::parse(kernel->metadata_json);
  const std::string base = out_dir + "/" + WorkloadName(file);
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  for (const auto& [path, text] : {std::pair{base + ".cc", kernel->source}, std::pair{base + ".json", meta.dump(2)}}) {
    if (absl::Status st = fusor::WriteFile(path, text); !st.ok()) return Fail(st);
    std::cout << (path == base + ".cc" ? "wrote      " : "           ") << path << "\n";
  }
  return 0;
}

// The metadata file of a compiled kernel: the kernel's own, with where
// its schedule came from and how it measured.
nlohmann::json CompileMetadata(const fusor::v1::CompileResponse& resp) {
  nlohmann::json j = nlohmann::json::parse(resp.metadata_json());
  j["workload_key"] = resp.result().workload_key();
  j["target_fingerprint"] = resp.result().target().fingerprint();
  j["measured_median_s"] = resp.result().best_measurement().median_s();
  j["baseline_median_s"] = resp.result().baseline_s();
  j["baseline_kind"] = resp.result().baseline_kind();
  j["speedup"] = resp.result().speedup();
  j["from_cache"] = resp.result().from_cache();
  j["schedule"] = resp.result().best().schedule().text();  // "unfused <library>" where fusion did not pay
  if (resp.result().fused_s() > 0) {
    j["fused_median_s"] = resp.result().fused_s();
    j["fused_schedule"] = resp.result().fused_schedule();
  }
  return j;
}

constexpr char kVaryHelp[] =
    "dims whose size changes from call to call (a batch, a sequence): served over the range of sizes around the one "
    "in the file (2..16, 17..64, 65..256, ...), one kernel for the range";
constexpr char kTransferHelp[] =
    "on a miss, where the cache has the same chain at other sizes: measure its schedule at these sizes alone "
    "(validated, timed, confirmed) instead of searching";

}  // namespace

void AddTune(CLI::App& app, TuneCommand& c) {
  c.cmd = app.add_subcommand("tune", "tune workloads (or answer from the cache) and print the results");
  c.cmd->add_option("files", c.files, "workload files (chain text or JSON)")->required()->check(CLI::ExistingFile);
  c.cmd->add_option("--budget", c.budget, "candidates to measure (default: the scheduler's)");
  c.cmd->add_flag("--force", c.force, "tune again even if the cache has an answer");
  c.cmd->add_option("--vary", c.vary, kVaryHelp)->delimiter(',');
  c.cmd->add_flag("--transfer", c.transfer, kTransferHelp);
  AddOutputOption(c.cmd, c.output);
}

int RunTune(Client& client, const GlobalOptions& g, const TuneCommand& c) {
  const bool tty = isatty(STDERR_FILENO);
  const bool json = c.output == "json";
  int rc = 0;
  for (const std::string& file : c.files) {
    const nlohmann::json which = {{"file", file}};
    auto workload = fusor::client::ReadWorkloadFile(file);
    if (!workload.ok()) {
      rc = Fail(workload.status(), json, which);
      continue;
    }
    fusor::v1::TuneRequest req;
    *req.mutable_workload() = *workload;
    for (const std::string& d : c.vary) req.mutable_workload()->add_vary(d);
    *req.mutable_target() = Selector(g);
    req.mutable_options()->set_budget(c.budget);
    req.mutable_options()->set_force(c.force);
    req.mutable_options()->set_transfer(c.transfer);
    std::cerr << "tuning " << file << "\n";
    auto result = client.Tune(
        req,
        [&](const fusor::v1::TuneEvent& e) {
          if (e.has_started()) {
            std::cerr << absl::StrCat("  task ", e.started().task_id(), ": ", e.started().space_size(),
                                      " schedules, ", e.started().space_after_pruning(), " after pruning, measuring ",
                                      e.started().budget(), "\n");
          } else if (e.has_progress()) {
            std::string line = "  " + fusor::client::FormatProgress(e.progress());
            if (tty) {
              std::cerr << "\r\033[K" << line << std::flush;
            } else {
              std::cerr << line << "\n";
            }
          } else if (e.has_result() && tty) {
            std::cerr << "\r\033[K";
          }
        },
        absl::Seconds(g.timeout_s));
    if (!result.ok()) {
      if (tty) std::cerr << "\n";
      rc = Fail(result.status(), json, which);
      continue;
    }
    std::cout << (json ? JsonLine(*result, which) : fusor::client::FormatResult(WorkloadName(file), *result))
              << std::endl;
  }
  return rc;
}

void AddCompile(CLI::App& app, GlobalOptions& g, CompileCommand& c) {
  c.cmd = app.add_subcommand("compile", "write the best kernel's source and metadata");
  c.cmd->add_option("file", c.file, "workload file")->required()->check(CLI::ExistingFile);
  c.cmd->add_option("-o,--out", c.out_dir, "output directory")->capture_default_str();
  c.cmd->add_option("--budget", c.budget, "candidates to measure when tuning first");
  c.cmd->add_flag("--cache-only", c.cache_only, "fail (exit 3) instead of tuning on a cache miss");
  c.cmd->add_flag("--model-only", c.model_only,
                  "rank by the cost model alone for --target (a GPU, an arch such as sm_90, or local) and write "
                  "the top candidate unmeasured; needs no worker and stores nothing");
  c.cmd->add_option("--target", g.target_fp, "with --model-only: a GPU name, an arch (sm_XX) or local");
  c.cmd->add_option("--schedule", c.schedule,
                    "with --model-only and a CPU target: write this schedule's kernel instead of the model's pick (a fused "
                    "schedule, or 'split after T: HEAD | TAIL')");
  c.cmd->add_option("--unfused", c.unfused_blas,
                    "write the unfused baseline (each op in turn, GEMMs through this BLAS) instead of a tuned kernel; "
                    "no tuning, nothing stored")
      ->check(CLI::IsMember({"openblas", "onednn"}));
  c.cmd->add_option("--vary", c.vary, kVaryHelp)->delimiter(',');
  c.cmd->add_flag("--transfer", c.transfer, kTransferHelp);
}

std::optional<int> RunCompileOffline(const GlobalOptions& g, const CompileCommand& c) {
  if (!c.schedule.empty() && !c.model_only) {
    std::cerr << "fusor: compile --schedule needs --model-only\n";
    return 2;
  }
  if (!c.unfused_blas.empty()) return CompileUnfused(c.file, c.out_dir, c.unfused_blas);
  if (c.model_only) return CompileModelOnly(g, c.file, c.out_dir, c.schedule);
  return std::nullopt;
}

int RunCompile(Client& client, const GlobalOptions& g, const CompileCommand& c) {
  auto workload = fusor::client::ReadWorkloadFile(c.file);
  if (!workload.ok()) return Fail(workload.status());
  fusor::v1::CompileRequest req;
  *req.mutable_workload() = *workload;
  for (const std::string& d : c.vary) req.mutable_workload()->add_vary(d);
  *req.mutable_target() = Selector(g);
  req.mutable_options()->set_budget(c.budget);
  req.mutable_options()->set_transfer(c.transfer);
  req.set_cache_only(c.cache_only);
  if (!c.cache_only) std::cerr << "compiling " << c.file << " (tuning first if it is not in the cache)\n";
  auto resp = client.Compile(req, absl::Seconds(g.timeout_s));
  if (!resp.ok()) return Fail(resp.status());
  std::error_code ec;
  std::filesystem::create_directories(c.out_dir, ec);
  if (ec) return Fail(absl::PermissionDeniedError(absl::StrCat("cannot create ", c.out_dir, ": ", ec.message())));
  const std::string name = WorkloadName(c.file);
  const std::string src = c.out_dir + "/" + name + (resp->language() == "cuda" ? ".cu" : ".cc");
  const std::string meta = c.out_dir + "/" + name + ".json";
  const std::string binary = c.out_dir + "/" + name + "." + resp->binary_format();
  const nlohmann::json j = CompileMetadata(*resp);
  std::ofstream(src) << resp->kernel_source();
  std::ofstream(meta) << j.dump(2) << "\n";
  if (!resp->binary().empty()) std::ofstream(binary, std::ios::binary) << resp->binary();
  std::cout << fusor::client::FormatResult(name, resp->result());
  std::cout << "wrote      " << src << "\n           " << meta;
  if (!resp->binary().empty()) std::cout << "\n           " << binary;
  std::cout << std::endl;
  return 0;
}

void AddLookup(CLI::App& app, LookupCommand& c) {
  c.cmd = app.add_subcommand("lookup", "print cached results only (exit 3 on a miss)");
  c.cmd->add_option("files", c.files, "workload files")->required()->check(CLI::ExistingFile);
  c.cmd->add_option("--vary", c.vary, kVaryHelp)->delimiter(',');
  c.cmd->add_flag("--why", c.why,
                  "on a miss (or an answer from another record), name the nearest record and each field of the key "
                  "or target in which it differs");
  AddOutputOption(c.cmd, c.output);
}

int RunLookup(Client& client, const GlobalOptions& g, const LookupCommand& c) {
  const bool json = c.output == "json";
  int rc = 0;
  for (const std::string& file : c.files) {
    const nlohmann::json which = {{"file", file}};
    auto workload = fusor::client::ReadWorkloadFile(file);
    if (!workload.ok()) {
      rc = Fail(workload.status(), json, which);
      continue;
    }
    fusor::v1::LookupRequest req;
    *req.mutable_workload() = *workload;
    for (const std::string& d : c.vary) req.mutable_workload()->add_vary(d);
    *req.mutable_target() = Selector(g);
    req.set_explain(c.why);
    auto resp = client.Lookup(req);
    if (!resp.ok()) {
      rc = Fail(resp.status(), json, which);
      continue;
    }
    if (json) {
      std::cout << JsonLine(*resp, which) << std::endl;  // no "result": a miss
    } else if (resp->has_result()) {
      std::cout << fusor::client::FormatResult(WorkloadName(file), resp->result());
    }
    if (!json && resp->has_why()) std::cout << fusor::client::FormatExplanation(WorkloadName(file), resp->why());
    std::cout << std::flush;
    if (!resp->has_result()) rc = std::max(rc, 3);  // a miss, explained
  }
  return rc;
}

void AddWorkers(CLI::App& app, WorkersCommand& c) {
  c.cmd = app.add_subcommand("workers", "list the workers the scheduler knows");
  AddOutputOption(c.cmd, c.output);
}

int RunWorkers(Client& client, const WorkersCommand& c) {
  const bool json = c.output == "json";
  auto list = client.ListWorkers();
  if (!list.ok()) return Fail(list.status(), json);
  std::cout << (json ? JsonLine(*list) + "\n" : fusor::client::FormatWorkers(*list, NowMs())) << std::flush;
  return 0;
}

void AddHealth(CLI::App& app, HealthCommand& c) {
  c.cmd = app.add_subcommand(
      "health", "with --server: exit 0 when the scheduler's grpc.health.v1 service answers SERVING (a probe that "
                "speaks TLS; --timeout bounds it)");
  AddOutputOption(c.cmd, c.output);
}

int RunHealth(Client& client, const GlobalOptions& g, const HealthCommand& c) {
  const bool json = c.output == "json";
  auto serving = client.Health(absl::Seconds(g.timeout_given ? g.timeout_s : 5));
  if (!serving.ok()) return Fail(serving.status(), json);
  grpc::health::v1::HealthCheckResponse resp;
  resp.set_status(*serving);
  std::cout << (json ? JsonLine(resp) : grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*serving))
            << std::endl;
  return *serving == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

void AddTask(CLI::App& app, TaskCommand& c) {
  c.cmd = app.add_subcommand("task", "show a tuning task");
  c.cmd->add_option("id", c.id, "task id")->required();
  AddOutputOption(c.cmd, c.output);
}

int RunTask(Client& client, const TaskCommand& c) {
  const bool json = c.output == "json";
  auto info = client.GetTask(c.id);
  if (!info.ok()) return Fail(info.status(), json, {{"task_id", c.id}});
  std::cout << (json ? JsonLine(*info) + "\n" : fusor::client::FormatTask(*info)) << std::flush;
  return 0;
}

}  // namespace fusor::cli
