// fusor: the command-line client. With --server it talks to a remote
// scheduler; without it, it runs an embedded scheduler and a local CPU
// worker on the default database. Flags are read here and nowhere else.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "client/embedded.h"
#include "client/explain.h"
#include "client/extract.h"
#include "client/manifest.h"
#include "client/mappings.h"
#include "client/model_only.h"
#include "client/reference_data.h"
#include "client/report.h"
#include "client/sweep_report.h"
#include "common/codegen/cpu/cpu_codegen.h"
#include "common/util/files.h"
#include "common/util/log.h"
#include "common/util/text.h"
#include "common/hw/devices.h"
#include "common/space/loop_nest.h"
#include "common/space/space.h"
#include "common/util/paths.h"
#include "proto/wire/cli_flags.h"
#include "proto/wire/convert.h"
#include "proto/wire/grpc_status.h"
#include "server/auth.h"
#include "server/db/tuning_db.h"
#include "worker/cpu/cpu_target.h"
#include "worker/job.h"
#include "common/util/process.h"

namespace {

using fusor::client::Client;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Said after an UNAVAILABLE from a remote scheduler (set once it is dialed).
std::string unavailable_hint;

int Fail(const absl::Status& st) {
  std::cerr << "fusor: " << st.message() << " [" << absl::StatusCodeToString(st.code()) << "]\n";
  if (absl::IsUnavailable(st) && !unavailable_hint.empty()) std::cerr << "fusor: " << unavailable_hint << "\n";
  if (fusor::wire::RetryAfter(st)) return 4;  // over a quota: worth retrying after the hint
  return absl::IsNotFound(st) ? 3 : 1;
}

struct GlobalOptions {
  std::string server;
  std::string token;
  fusor::wire::ClientTls tls;
  std::string db_path;
  std::string backend = "cpu";
  std::string target_fp;
  double timeout_s = 3600;
  double calibration_s = 0.3;
  double max_spread = 0;  // embedded scheduler: 0 for the default bound
  bool verbose = false;
};

// A channel to --server, with the hint said after UNAVAILABLE.
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

int Tune(Client& client, const GlobalOptions& g, const std::vector<std::string>& files, int budget, bool force) {
  const bool tty = isatty(STDERR_FILENO);
  int rc = 0;
  for (const std::string& file : files) {
    auto workload = fusor::client::ReadWorkloadFile(file);
    if (!workload.ok()) {
      rc = Fail(workload.status());
      continue;
    }
    fusor::v1::TuneRequest req;
    *req.mutable_workload() = *workload;
    *req.mutable_target() = Selector(g);
    req.mutable_options()->set_budget(budget);
    req.mutable_options()->set_force(force);
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
      rc = Fail(result.status());
      continue;
    }
    std::cout << fusor::client::FormatResult(WorkloadName(file), *result) << std::endl;
  }
  return rc;
}

int Compile(Client& client, const GlobalOptions& g, const std::string& file, const std::string& out_dir, int budget,
            bool cache_only) {
  auto workload = fusor::client::ReadWorkloadFile(file);
  if (!workload.ok()) return Fail(workload.status());
  fusor::v1::CompileRequest req;
  *req.mutable_workload() = *workload;
  *req.mutable_target() = Selector(g);
  req.mutable_options()->set_budget(budget);
  req.set_cache_only(cache_only);
  if (!cache_only) std::cerr << "compiling " << file << " (tuning first if it is not in the cache)\n";
  auto resp = client.Compile(req, absl::Seconds(g.timeout_s));
  if (!resp.ok()) return Fail(resp.status());
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Fail(absl::PermissionDeniedError(absl::StrCat("cannot create ", out_dir, ": ", ec.message())));
  const std::string name = WorkloadName(file);
  const std::string src = out_dir + "/" + name + (resp->language() == "cuda" ? ".cu" : ".cc");
  const std::string meta = out_dir + "/" + name + ".json";
  const std::string binary = out_dir + "/" + name + "." + resp->binary_format();
  nlohmann::json j = nlohmann::json::parse(resp->metadata_json());
  j["workload_key"] = resp->result().workload_key();
  j["target_fingerprint"] = resp->result().target().fingerprint();
  j["measured_median_s"] = resp->result().best_measurement().median_s();
  j["baseline_median_s"] = resp->result().baseline_s();
  j["baseline_kind"] = resp->result().baseline_kind();
  j["speedup"] = resp->result().speedup();
  j["from_cache"] = resp->result().from_cache();
  j["schedule"] = resp->result().best().schedule().text();  // "unfused <library>" where fusion did not pay
  if (resp->result().fused_s() > 0) {
    j["fused_median_s"] = resp->result().fused_s();
    j["fused_schedule"] = resp->result().fused_schedule();
  }
  std::ofstream(src) << resp->kernel_source();
  std::ofstream(meta) << j.dump(2) << "\n";
  if (!resp->binary().empty()) std::ofstream(binary, std::ios::binary) << resp->binary();
  std::cout << fusor::client::FormatResult(name, resp->result());
  std::cout << "wrote      " << src << "\n           " << meta;
  if (!resp->binary().empty()) std::cout << "\n           " << binary;
  std::cout << std::endl;
  return 0;
}

int Lookup(Client& client, const GlobalOptions& g, const std::vector<std::string>& files) {
  int rc = 0;
  for (const std::string& file : files) {
    auto workload = fusor::client::ReadWorkloadFile(file);
    if (!workload.ok()) {
      rc = Fail(workload.status());
      continue;
    }
    fusor::v1::LookupRequest req;
    *req.mutable_workload() = *workload;
    *req.mutable_target() = Selector(g);
    auto result = client.Lookup(req);
    if (!result.ok()) {
      rc = Fail(result.status());
      continue;
    }
    std::cout << fusor::client::FormatResult(WorkloadName(file), *result) << std::endl;
  }
  return rc;
}

// The target explain describes: a device from the table, this CPU
// (described and briefly calibrated), or a target a worker registered.
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
  auto workers = Client(channel).ListWorkers();
  if (!workers.ok()) return workers.status();
  for (const auto& w : workers->workers()) {
    if (w.target().fingerprint() == g.target_fp) return fusor::wire::TargetFromProto(w.target());
  }
  return absl::NotFoundError(absl::StrCat("no device or registered target called '", g.target_fp, "'"));
}

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

int Extract(const std::string& file, const std::vector<std::string>& bindings, const std::string& out_dir) {
  std::map<std::string, int64_t> dims;
  for (const std::string& b : bindings) {
    auto dim = fusor::client::ParseDimBinding(b);
    if (!dim.ok()) {
      Fail(dim.status());
      return 2;  // usage
    }
    dims[dim->first] = dim->second;
  }
  auto extraction = fusor::client::ExtractModel(file, dims);
  if (!extraction.ok()) return Fail(extraction.status());
  std::cout << fusor::client::FormatExtraction(*extraction);
  if (out_dir.empty()) return 0;
  auto written = fusor::client::WriteExtraction(*extraction, out_dir);
  if (!written.ok()) return Fail(written.status());
  for (const std::string& path : *written) std::cout << "wrote " << path << "\n";
  return 0;
}

// The manifest's models, extracted before any scheduler starts so that a
// bad manifest costs nothing.
absl::StatusOr<std::pair<fusor::client::Manifest, std::vector<fusor::client::SweepModel>>> PlanSweep(
    const std::string& path, int budget) {
  auto manifest = fusor::client::LoadManifest(path);
  if (!manifest.ok()) return manifest.status();
  if (budget > 0) manifest->budget = budget;
  std::set<std::string> keys;
  int chains = 0;
  auto models = fusor::client::ExtractManifest(*manifest, [&](const fusor::client::SweepModel& m) {
    for (const auto& c : m.extraction.chains) keys.insert(c.key);
    chains += static_cast<int>(m.extraction.chains.size());
    std::cerr << absl::StrCat("  ", fusor::Echo(m.name), ": ", m.extraction.chains.size(), " chains",
                              m.extraction.rejected.empty()
                                  ? ""
                                  : absl::StrCat(" (", m.extraction.rejected.size(), " candidates not fused)"),
                              "\n");
  });
  if (!models.ok()) return models.status();
  std::cerr << absl::StrCat("sweep ", manifest->name, ": ", models->size(), " models, ", chains, " chains, ",
                            keys.size(), " distinct\n");
  if (chains == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": no model has a fusible chain"));
  return std::make_pair(std::move(*manifest), std::move(*models));
}

int Sweep(Client& client, const GlobalOptions& g, const fusor::client::Manifest& manifest,
          const std::vector<fusor::client::SweepModel>& models, std::string out_dir, bool detach,
          absl::Duration deadline) {
  fusor::v1::SweepRequest req = fusor::client::MakeSweepRequest(manifest, models);
  *req.mutable_target() = Selector(g);
  req.set_detach(detach);
  const bool tty = isatty(STDERR_FILENO);
  int last_done = -1;
  auto last_line = std::chrono::steady_clock::now();
  auto report = client.Sweep(
      req,
      [&](const fusor::v1::SweepEvent& e) {
        if (e.has_started()) {
          const auto& s = e.started();
          std::cerr << absl::StrCat("sweep ", s.sweep_id(), s.resumed() ? " resumed" : " started", ": ", s.chains(),
                                    " distinct chains, budget ", s.budget(), " each, target ",
                                    s.target_fingerprint(),
                                    detach ? "" : "\n  (interrupting is safe: the same command resumes it)", "\n");
        } else if (e.has_progress()) {
          const std::string line = "  " + fusor::client::FormatSweepProgress(e.progress());
          const auto now = std::chrono::steady_clock::now();
          if (tty) {
            std::cerr << "\r\033[K" << line << std::flush;
          } else if (e.progress().done() != last_done || now - last_line > std::chrono::seconds(30)) {
            std::cerr << line << "\n";
            last_line = now;
          }
          last_done = e.progress().done();
        } else if (e.has_report() && tty) {
          std::cerr << "\n";
        }
      },
      deadline);
  if (!report.ok()) {
    if (tty) std::cerr << "\n";
    if (!g.server.empty() && absl::IsDeadlineExceeded(report.status())) {
      std::cerr << "fusor: stopped following the sweep (--timeout); it goes on in the scheduler, and the same "
                   "command follows it again\n";
    }
    return Fail(report.status());
  }
  if (detach) {
    std::cout << "sweep " << report->sweep_id() << " runs in the scheduler; the same command without --detach "
              << "follows it and writes the report\n";
    return 0;
  }
  if (out_dir.empty()) out_dir = "fusor-sweep-" + fusor::SafeName(manifest.name);  // under the working directory
  auto written = fusor::client::WriteSweepReport(*report, models, out_dir);
  if (!written.ok()) return Fail(written.status());
  int failed = 0, cache = 0, tuned = 0;
  for (const auto& r : report->results()) {
    failed += r.state() == "failed";
    cache += r.state() == "cache";
    tuned += r.state() == "tuned";
  }
  std::cout << absl::StrFormat("sweep %s %s: %d chains (%d from the cache, %d tuned, %d failed)\n",
                               report->sweep_id(), report->state(), report->results_size(), cache, tuned, failed);
  std::cout << absl::StrFormat("%-44s %6s %12s %12s %8s\n", "model", "chains", "unfused", "fused", "speedup");
  for (const auto& t : fusor::client::TotalsPerModel(*report)) {
    std::cout << absl::StrFormat("%-44s %6d %12s %12s %8s\n", t.model, t.chains,
                                 fusor::client::FormatSeconds(t.baseline_s), fusor::client::FormatSeconds(t.fused_s),
                                 t.speedup() > 0 ? absl::StrFormat("%.2fx", t.speedup()) : "-");
  }
  for (size_t i = 0; i < written->size(); ++i) std::cout << (i == 0 ? "wrote " : "      ") << (*written)[i] << "\n";
  return failed > 0 ? 1 : 0;
}

// records / db: straight on the database file, no scheduler (a running
// one may keep it: reads and SQLite's online backup do not disturb it).
// records, db and admin: the scheduler's Admin service with --server (an
// admin token), else the --db file itself.
absl::StatusOr<std::unique_ptr<fusor::client::AdminClient>> RemoteAdmin(const GlobalOptions& g) {
  auto channel = DialServer(g);
  if (!channel.ok()) return channel.status();
  return std::make_unique<fusor::client::AdminClient>(*channel);
}

// The database, created if missing (import, tokens).
absl::StatusOr<std::unique_ptr<fusor::db::TuningDb>> OpenOrCreate(const GlobalOptions& g) {
  if (absl::Status st = fusor::EnsureParentDirectory(g.db_path); !st.ok()) return st;
  return fusor::db::TuningDb::Open(g.db_path);
}

absl::StatusOr<std::unique_ptr<fusor::db::TuningDb>> OpenExisting(const GlobalOptions& g) {
  if (!std::filesystem::is_regular_file(g.db_path)) {
    return absl::NotFoundError(absl::StrCat("no tuning database at ", g.db_path));
  }
  return fusor::db::TuningDb::Open(g.db_path);
}

int ExportRecords(const GlobalOptions& g, const std::string& workload, const std::string& out_path) {
  std::ofstream file;
  if (!out_path.empty()) {
    file.open(out_path, std::ios::trunc);
    if (!file) return Fail(absl::PermissionDeniedError(absl::StrCat("cannot write ", out_path)));
  }
  std::ostream& out = out_path.empty() ? std::cout : file;
  int64_t n = 0;
  auto write = [&](const std::string& line) {
    out << line << '\n';
    ++n;
  };
  absl::Status st;
  if (!g.server.empty()) {
    auto admin = RemoteAdmin(g);
    if (!admin.ok()) return Fail(admin.status());
    fusor::v1::ExportRecordsRequest req;
    req.set_target_fingerprint(g.target_fp);
    req.set_workload_key(workload);
    st = (*admin)->ExportRecords(req, write);
  } else {
    auto db = OpenExisting(g);
    if (!db.ok()) return Fail(db.status());
    st = (*db)->ExportRecords({g.target_fp, workload}, write);
  }
  if (!st.ok()) return Fail(st);
  out.flush();
  if (!out) return Fail(absl::InternalError("writing the records failed"));
  std::cerr << "exported " << n << " measurement records" << (out_path.empty() ? "" : " to " + out_path) << "\n";
  return 0;
}

int ImportRecords(const GlobalOptions& g, const std::string& path) {
  auto text = fusor::ReadFile(path, fusor::server::kMaxImportBytes);  // what the scheduler takes in one import
  if (!text.ok()) return Fail(text.status());
  std::vector<std::string> lines = absl::StrSplit(*text, '\n');
  fusor::db::ImportStats stats;
  if (!g.server.empty()) {
    auto admin = RemoteAdmin(g);
    if (!admin.ok()) return Fail(admin.status());
    auto resp = (*admin)->ImportRecords(lines);
    if (!resp.ok()) return Fail(absl::Status(resp.status().code(), absl::StrCat(path, ": ", resp.status().message())));
    stats = {resp->records(), resp->added(), resp->duplicates(), resp->best_updated()};
  } else {
    auto db = OpenOrCreate(g);
    if (!db.ok()) return Fail(db.status());
    auto local = (*db)->ImportRecords(lines, NowMs());
    if (!local.ok()) return Fail(absl::Status(local.status().code(), absl::StrCat(path, ": ", local.status().message())));
    stats = *local;
  }
  std::cout << absl::StrFormat("imported %s into %s: %d records, %d new measurements, %d already here, "
                               "%d best records changed\n",
                               path, g.server.empty() ? g.db_path : g.server, stats.records, stats.added,
                               stats.duplicates, stats.best_updated);
  return 0;
}

int Backup(const GlobalOptions& g, const std::string& to) {
  if (std::filesystem::exists(to)) return Fail(absl::AlreadyExistsError(absl::StrCat(to, " exists; not overwritten")));
  if (!g.server.empty()) {
    // Streamed into TO.part, renamed once whole and checked.
    auto admin = RemoteAdmin(g);
    if (!admin.ok()) return Fail(admin.status());
    const std::string part = to + ".part";
    std::ofstream out(part, std::ios::binary | std::ios::trunc);
    if (!out) return Fail(absl::PermissionDeniedError(absl::StrCat("cannot write ", part)));
    absl::Status st = (*admin)->Backup([&](const std::string& chunk) {
      return static_cast<bool>(out.write(chunk.data(), static_cast<std::streamsize>(chunk.size())));
    });
    out.close();
    if (st.ok() && !out) st = absl::InternalError(absl::StrCat("writing ", part, " failed"));
    if (!st.ok()) {
      std::filesystem::remove(part);
      return Fail(st);
    }
    std::filesystem::rename(part, to);
  } else {
    auto db = OpenExisting(g);
    if (!db.ok()) return Fail(db.status());
    if (absl::Status st = (*db)->BackupTo(to); !st.ok()) return Fail(st);
  }
  auto copy = fusor::db::TuningDb::Open(to);  // checks the copy's integrity
  if (!copy.ok()) return Fail(copy.status());
  auto n = (*copy)->CountMeasurements();
  if (!n.ok()) return Fail(n.status());
  std::cout << "backed up " << (g.server.empty() ? g.db_path : g.server) << " to " << to << " (" << *n
            << " measurements, " << std::filesystem::file_size(to) << " bytes, integrity checked)\n";
  return 0;
}

void PrintTokens(const std::vector<fusor::db::TokenRow>& tokens) {
  std::cout << absl::StrFormat("%-30s %-7s %-24s %s\n", "ID", "ROLE", "NAME", "STATE");
  for (const auto& t : tokens) {
    std::cout << absl::StrFormat("%-30s %-7s %-24s %s\n", t.id, t.role, t.name, t.revoked_ms ? "revoked" : "active");
  }
}

int AdminToken(const GlobalOptions& g, const std::string& action, const std::string& role_name,
               const std::string& name, const std::string& id) {
  std::unique_ptr<fusor::db::TuningDb> db;
  std::unique_ptr<fusor::client::AdminClient> admin;
  if (!g.server.empty()) {
    auto remote = RemoteAdmin(g);
    if (!remote.ok()) return Fail(remote.status());
    admin = std::move(*remote);
  } else {
    auto local = OpenOrCreate(g);
    if (!local.ok()) return Fail(local.status());
    db = std::move(*local);
  }
  if (action == "create") {
    std::string token_id, token;
    if (admin) {
      auto created = admin->CreateToken(role_name, name);
      if (!created.ok()) return Fail(created.status());
      token_id = created->info().id();
      token = created->token();
    } else {
      auto role = fusor::server::ParseRole(role_name);
      if (!role.ok()) return Fail(role.status());
      auto created = fusor::server::CreateToken(*db, *role, name, NowMs());
      if (!created.ok()) return Fail(created.status());
      token_id = created->first.id;
      token = created->second;
    }
    std::cerr << "token " << token_id << " (" << role_name << ", '" << name
              << "'); it is shown once, only its hash is kept:\n";
    std::cout << token << "\n";
    return 0;
  }
  if (action == "revoke") {
    absl::Status st = admin ? admin->RevokeToken(id) : db->RevokeToken(id, NowMs());
    if (!st.ok()) return Fail(st);
    std::cout << "revoked " << id << "\n";
    return 0;
  }
  std::vector<fusor::db::TokenRow> tokens;
  if (admin) {
    auto list = admin->ListTokens();
    if (!list.ok()) return Fail(list.status());
    for (const auto& t : list->tokens()) {
      tokens.push_back({t.id(), t.name(), t.role(), "", t.created_unix_ms(),
                        t.revoked_unix_ms() ? std::optional<int64_t>(t.revoked_unix_ms()) : std::nullopt});
    }
  } else {
    auto list = db->ListTokens();
    if (!list.ok()) return Fail(list.status());
    tokens = std::move(*list);
  }
  PrintTokens(tokens);
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

// reference: fusor's validation inputs and float64 outputs, on disk.
int Reference(const std::string& file, uint64_t seed, const std::string& out_dir) {
  auto workload = fusor::client::ReadWorkloadFile(file);
  if (!workload.ok()) return Fail(workload.status());
  auto chain = fusor::wire::ChainFromWorkload(*workload);
  if (!chain.ok()) return Fail(chain.status());
  auto written = fusor::client::WriteReferenceData(*chain, seed, out_dir);
  if (!written.ok()) return Fail(written.status());
  for (size_t i = 0; i < written->size(); ++i) std::cout << (i == 0 ? "wrote      " : "           ") << (*written)[i] << "\n";
  return 0;
}

int Explain(const GlobalOptions& g, const std::string& file, int top, const fusor::space::SpaceOptions& options) {
  fusor::SetLogLevel("warn");
  auto workload = fusor::client::ReadWorkloadFile(file);
  if (!workload.ok()) return Fail(workload.status());
  auto chain = fusor::wire::ChainFromWorkload(*workload);
  if (!chain.ok()) return Fail(chain.status());
  auto target = ExplainTarget(g);
  if (!target.ok()) return Fail(target.status());
  auto space = fusor::space::BuildSpace(*chain, *target, options);
  if (!space.ok()) return Fail(space.status());
  std::cout << fusor::client::FormatExplain(*chain, *target, *space, top);
  return 0;
}

int Mappings(const GlobalOptions& g, const std::vector<std::string>& files, const std::string& intrinsic_name,
             bool summary) {
  fusor::SetLogLevel("warn");
  std::vector<const fusor::hw::Intrinsic*> intrinsics;
  if (!intrinsic_name.empty()) {
    const fusor::hw::Intrinsic* x = fusor::hw::FindIntrinsic(intrinsic_name);
    if (x == nullptr) return Fail(absl::InvalidArgumentError(absl::StrCat("unknown intrinsic '", intrinsic_name, "'")));
    intrinsics.push_back(x);
  }
  if (summary) std::cout << fusor::client::MappingSummaryHeader();
  for (const std::string& file : files) {
    auto workload = fusor::client::ReadWorkloadFile(file);
    if (!workload.ok()) return Fail(workload.status());
    auto chain = fusor::wire::ChainFromWorkload(*workload);
    if (!chain.ok()) return Fail(chain.status());
    if (intrinsics.empty()) {
      auto target = ExplainTarget(g);
      if (!target.ok()) return Fail(target.status());
      intrinsics = fusor::space::UsableIntrinsics(*chain, *target);
    }
    if (summary) {
      for (const fusor::hw::Intrinsic* x : intrinsics) {
        std::cout << fusor::client::MappingSummaryRows(WorkloadName(file), *chain, *x);
      }
    } else {
      std::cout << "# " << file << "\n" << fusor::client::FormatMappings(*chain, intrinsics);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The isolated child that runs one job of the embedded worker.
  if (argc == 3 && std::string(argv[1]) == "__run-job") return fusor::worker::RunJobMain(argv[2]);

  CLI::App app{"fusor: fused operator chains, tuned in seconds and shared through one tuning database"};
  app.require_subcommand(1);
  GlobalOptions g;
  g.db_path = fusor::DefaultDatabasePath(Env("XDG_DATA_HOME"), Env("HOME"));
  app.add_option("--server", g.server, "scheduler address (host:port); without it, run an embedded scheduler");
  g.token = Env("FUSOR_TOKEN");
  app.add_option("--token", g.token, "with --server: a client-role token (env FUSOR_TOKEN; prefer the env: "
                                     "arguments show in ps)");
  fusor::wire::AddClientTlsFlags(app, g.tls);
  app.add_option("--db", g.db_path, "tuning database of the embedded scheduler")->capture_default_str();
  app.add_option("--backend", g.backend, "target backend")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  app.add_option("--target", g.target_fp,
                 "target fingerprint (default: the backend's registered target); explain also takes local or a device");
  app.add_option("--timeout", g.timeout_s, "seconds to wait for an answer")->capture_default_str();
  app.add_option("--max-spread", g.max_spread,
                 "embedded scheduler: a measurement whose samples' (p90 - p10) / median stays beyond this is noisy, "
                 "never a best record or a baseline (default 0.5)")
      ->check(CLI::PositiveNumber);
  app.add_option("--calibration-seconds", g.calibration_s, "embedded worker: length of each calibration run")
      ->capture_default_str();
  app.add_flag("-v,--verbose", g.verbose, "embedded mode: show the scheduler's and worker's logs");

  int budget = 0;
  bool force = false, cache_only = false;
  std::vector<std::string> files;
  std::string file, out_dir = "fusor-out", task_id;
  CLI::App* tune = app.add_subcommand("tune", "tune workloads (or answer from the cache) and print the results");
  tune->add_option("files", files, "workload files (chain text or JSON)")->required()->check(CLI::ExistingFile);
  tune->add_option("--budget", budget, "candidates to measure (default: the scheduler's)");
  tune->add_flag("--force", force, "tune again even if the cache has an answer");
  CLI::App* compile = app.add_subcommand("compile", "write the best kernel's source and metadata");
  compile->add_option("file", file, "workload file")->required()->check(CLI::ExistingFile);
  compile->add_option("-o,--out", out_dir, "output directory")->capture_default_str();
  compile->add_option("--budget", budget, "candidates to measure when tuning first");
  compile->add_flag("--cache-only", cache_only, "fail (exit 3) instead of tuning on a cache miss");
  bool model_only = false;
  compile->add_flag("--model-only", model_only,
                    "rank by the cost model alone for --target (a GPU, an arch such as sm_90, or local) and write "
                    "the top candidate unmeasured; needs no worker and stores nothing");
  compile->add_option("--target", g.target_fp, "with --model-only: a GPU name, an arch (sm_XX) or local");
  std::string compile_schedule;
  compile->add_option("--schedule", compile_schedule,
                      "with --model-only and a CPU target: write this schedule's kernel instead of the model's pick (a fused "
                      "schedule, or 'split after T: HEAD | TAIL')");
  std::string unfused_blas;
  compile->add_option("--unfused", unfused_blas,
                      "write the unfused baseline (each op in turn, GEMMs through this BLAS) instead of a tuned kernel; "
                      "no tuning, nothing stored")
      ->check(CLI::IsMember({"openblas", "onednn"}));
  CLI::App* lookup = app.add_subcommand("lookup", "print cached results only (exit 3 on a miss)");
  lookup->add_option("files", files, "workload files")->required()->check(CLI::ExistingFile);
  CLI::App* workers = app.add_subcommand("workers", "list the workers the scheduler knows");
  CLI::App* health = app.add_subcommand(
      "health", "with --server: exit 0 when the scheduler's grpc.health.v1 service answers SERVING (a probe that "
                "speaks TLS; --timeout bounds it)");
  CLI::App* task = app.add_subcommand("task", "show a tuning task");
  task->add_option("id", task_id, "task id")->required();
  int top = 10;
  fusor::space::SpaceOptions space_options;
  CLI::App* reference = app.add_subcommand(
      "reference", "write a chain's validation inputs and float64 reference outputs (raw float64 files and "
                   "manifest.json), to check other implementations against");
  uint64_t reference_seed = 1;
  std::string reference_dir = "fusor-reference";
  reference->add_option("file", file, "workload file")->required()->check(CLI::ExistingFile);
  reference->add_option("--seed", reference_seed, "seed of the random inputs")->capture_default_str();
  reference->add_option("-o,--out", reference_dir, "output directory")->capture_default_str();
  CLI::App* explain = app.add_subcommand(
      "explain", "show the schedule space at every pruning stage and the best predicted schedules (no measuring); "
                 "--target takes local (default), a device (" + absl::StrJoin(fusor::hw::DeviceNames(), ", ") +
                     ") or a registered target's fingerprint");
  explain->add_option("file", file, "workload file")->required()->check(CLI::ExistingFile);
  explain->add_option("--top", top, "candidates to list")->capture_default_str();
  explain->add_option("--target", g.target_fp, "local (default), a device name, or a registered fingerprint");
  explain->add_flag("!--no-dedupe", space_options.dedupe, "keep equivalent schedules (rule 1 off)");
  explain->add_flag("!--no-intermediates-rule", space_options.limit_intermediates, "rule 2 off");
  explain->add_flag("!--no-padding-rule", space_options.limit_padding, "rule 3 off");
  explain->add_flag("!--no-scratch-rule", space_options.limit_scratch, "rule 4 off");
  std::string intrinsic_name;
  bool summary = false;
  CLI::App* mappings = app.add_subcommand(
      "mappings", "list every mapping of the chains' sum ops onto the target's intrinsics, valid or why not");
  mappings->add_option("files", files, "workload files")->required()->check(CLI::ExistingFile);
  mappings->add_option("--target", g.target_fp, "local (default), a device name, or a registered fingerprint");
  mappings->add_option("--intrinsic", intrinsic_name, "only this intrinsic (any, whatever the target)");
  mappings->add_flag("--summary", summary, "one markdown row of counts per op");
  std::vector<std::string> dim_bindings;
  std::string extract_dir;
  CLI::App* extract = app.add_subcommand(
      "extract", "list the fusible chains of a model description (examples/models/*.json), optionally as chain files");
  extract->add_option("file", file, "model description (JSON)")->required()->check(CLI::ExistingFile);
  extract->add_option("--dim", dim_bindings, "bind batch, seq or target_seq, e.g. --dim seq=512 (repeatable)");
  extract->add_option("-o,--out", extract_dir, "write each chain to DIR/<chain>.fusor");
  std::string manifest_path, sweep_dir;
  bool detach = false;
  CLI::App* sweep = app.add_subcommand(
      "sweep", "tune every fusible chain of the models in a zoo manifest (YAML or JSON), each distinct chain once, "
               "and write the report; resumes an interrupted sweep");
  sweep->add_option("manifest", manifest_path, "zoo manifest, e.g. examples/zoo.yaml")->required()->check(CLI::ExistingFile);
  sweep->add_option("-o,--out", sweep_dir, "report directory (default: fusor-sweep-<name>)");
  sweep->add_option("--budget", budget, "candidates to measure per chain (default: the manifest's, else the scheduler's)");
  sweep->add_flag("--detach", detach, "with --server: start the sweep and return; it runs in the scheduler");
  CLI::App* records = app.add_subcommand("records", "measurement records of --db as JSON lines, for moving and "
                                                     "merging tuning databases");
  records->require_subcommand(1);
  std::string workload_key, records_path;
  CLI::App* records_export = records->add_subcommand("export", "write every measurement of finished tasks");
  records_export->add_option("--target", g.target_fp, "only this target fingerprint");
  records_export->add_option("--workload", workload_key, "only this workload key");
  records_export->add_option("-o,--out", records_path, "file to write (default: standard output)");
  CLI::App* records_import = records->add_subcommand(
      "import", "add records to --db (all or nothing; ones already here are skipped; best records recomputed)");
  records_import->add_option("file", records_path, "records file (JSON lines)")->required()->check(CLI::ExistingFile);
  CLI::App* db_cmd = app.add_subcommand("db", "maintenance of the tuning database file (--db)");
  db_cmd->require_subcommand(1);
  std::string backup_path;
  CLI::App* backup = db_cmd->add_subcommand("backup", "a consistent copy, also while a scheduler uses the database");
  backup->add_option("to", backup_path, "new file")->required();
  CLI::App* admin = app.add_subcommand("admin", "administration of --db (on the scheduler's host)");
  admin->require_subcommand(1);
  CLI::App* token_cmd = admin->add_subcommand("token", "bearer tokens of the scheduler on --db");
  token_cmd->require_subcommand(1);
  std::string role_name, token_name, token_id;
  CLI::App* token_create = token_cmd->add_subcommand("create", "print a new token (shown once; only its hash is kept)");
  token_create->add_option("--role", role_name, "client, worker or admin")->required();
  token_create->add_option("--name", token_name, "who or what holds it")->required();
  CLI::App* token_list = token_cmd->add_subcommand("list", "the tokens, their roles and whether revoked");
  CLI::App* token_revoke = token_cmd->add_subcommand("revoke", "refuse a token from now on");
  token_revoke->add_option("id", token_id, "token id (from list)")->required();
  CLI11_PARSE(app, argc, argv);
  if (*token_create) return AdminToken(g, "create", role_name, token_name, "");
  if (*token_list) return AdminToken(g, "list", "", "", "");
  if (*token_revoke) return AdminToken(g, "revoke", "", "", token_id);
  if (*records_export) return ExportRecords(g, workload_key, records_path);
  if (*records_import) return ImportRecords(g, records_path);
  if (*backup) return Backup(g, backup_path);
  if (*extract) return Extract(file, dim_bindings, extract_dir);
  if (*reference) return Reference(file, reference_seed, reference_dir);
  if (*explain) return Explain(g, file, top, space_options);
  if (*mappings) return Mappings(g, files, intrinsic_name, summary);
  if (*compile && !compile_schedule.empty() && !model_only) {
    std::cerr << "fusor: compile --schedule needs --model-only\n";
    return 2;
  }
  if (*compile && !unfused_blas.empty()) return CompileUnfused(file, out_dir, unfused_blas);
  if (*compile && model_only) return CompileModelOnly(g, file, out_dir, compile_schedule);

  std::optional<std::pair<fusor::client::Manifest, std::vector<fusor::client::SweepModel>>> plan;
  if (*health && g.server.empty()) {
    std::cerr << "fusor: health needs --server\n";
    return 2;
  }
  if (*sweep) {
    if (detach && g.server.empty()) {
      std::cerr << "fusor: --detach needs --server: an embedded scheduler stops with this process\n";
      return 2;
    }
    fusor::SetLogLevel("warn");
    auto planned = PlanSweep(manifest_path, budget);
    if (!planned.ok()) return Fail(planned.status());
    plan = std::move(*planned);
  }

  const std::string log_level = Env("FUSOR_LOG_LEVEL").empty() ? (g.verbose ? "info" : "warn") : Env("FUSOR_LOG_LEVEL");
  if (!fusor::SetLogLevel(log_level)) {
    std::cerr << "fusor: unknown log level '" << log_level << "'\n";
    return 2;
  }

  std::unique_ptr<fusor::client::Embedded> embedded;
  std::shared_ptr<grpc::Channel> channel;
  if (!g.server.empty()) {
    auto dialed = DialServer(g);
    if (!dialed.ok()) return Fail(dialed.status());
    channel = *dialed;
  } else {
    if (absl::Status st = fusor::EnsureParentDirectory(g.db_path); !st.ok()) return Fail(st);
    fusor::server::SchedulerOptions options;
    options.db_path = g.db_path;
    // The worker is in this process: a short lease lets a run interrupted
    // mid-job resume quickly next time.
    options.lease = absl::Seconds(10);
    options.heartbeat_interval = absl::Seconds(1);
    options.measure.max_spread = g.max_spread;
    // Only commands that may measure need the local worker.
    std::optional<fusor::worker::WorkerOptions> worker;
    if (*tune || (*compile && !cache_only) || *sweep) {
      worker.emplace();
      worker->name = "embedded";
      worker->backend = g.backend;
      worker->self_exe = fusor::CurrentExecutable("fusor");
      worker->scratch_dir = Env("TMPDIR").empty() ? "/tmp" : Env("TMPDIR");
      worker->calibration_s = g.calibration_s;
      worker->blas_dir = FUSOR_OPENBLAS_DIR;
      worker->lease_wait = absl::Milliseconds(500);
      std::cerr << "embedded scheduler on " << g.db_path << "; starting a local " << (g.backend == "cuda" ? "GPU" : "CPU")
                << " worker (calibrating)\n";
    }
    auto started = fusor::client::Embedded::Start(options, worker);
    if (!started.ok()) return Fail(started.status());
    embedded = std::move(*started);
    channel = embedded->channel();
  }
  Client client(channel);

  if (*tune) return Tune(client, g, files, budget, force);
  if (*sweep) {
    // A sweep is followed until it ends unless --timeout says otherwise.
    const absl::Duration deadline = app.count("--timeout") > 0 ? absl::Seconds(g.timeout_s) : absl::Hours(24 * 365);
    return Sweep(client, g, plan->first, plan->second, sweep_dir, detach, deadline);
  }
  if (*compile) return Compile(client, g, file, out_dir, budget, cache_only);
  if (*lookup) return Lookup(client, g, files);
  if (*workers) {
    auto list = client.ListWorkers();
    if (!list.ok()) return Fail(list.status());
    std::cout << fusor::client::FormatWorkers(*list, NowMs());
    return 0;
  }
  if (*health) {
    auto serving = client.Health(absl::Seconds(app.count("--timeout") > 0 ? g.timeout_s : 5));
    if (!serving.ok()) return Fail(serving.status());
    std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*serving) << std::endl;
    return *serving == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
  }
  if (*task) {
    auto info = client.GetTask(task_id);
    if (!info.ok()) return Fail(info.status());
    std::cout << fusor::client::FormatTask(*info);
    return 0;
  }
  return 2;
}
