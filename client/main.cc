// fusor: the command-line client. With --server it talks to a remote
// scheduler; without it, it runs an embedded scheduler and a local CPU
// worker on the default database. Flags are read here and in the
// commands' files (client/cli_*.cc) and nowhere else.
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "client/cli_common.h"
#include "client/cli_database.h"
#include "client/cli_inspect.h"
#include "client/cli_scheduler.h"
#include "client/cli_sweep.h"
#include "client/client.h"
#include "client/completion.h"
#include "client/embedded.h"
#include "common/util/build_info.h"
#include "common/util/log.h"
#include "common/util/paths.h"
#include "common/util/process.h"
#include "proto/wire/cli_flags.h"
#include "worker/job.h"

namespace {

using fusor::cli::GlobalOptions;

void AddGlobalOptions(CLI::App& app, GlobalOptions& g) {
  g.db_path = fusor::DefaultDatabasePath(fusor::cli::Env("XDG_DATA_HOME"), fusor::cli::Env("HOME"));
  app.add_option("--server", g.server, "scheduler address (host:port; env FUSOR_SERVER unless --db is given); without "
                                       "it, run an embedded scheduler");
  g.token = fusor::cli::Env("FUSOR_TOKEN");
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
}

// Every subcommand, with its options; declared in this order, which is
// the order --help lists them in.
struct Commands {
  fusor::cli::TuneCommand tune;
  fusor::cli::CompileCommand compile;
  fusor::cli::LookupCommand lookup;
  fusor::cli::WorkersCommand workers;
  fusor::cli::HealthCommand health;
  fusor::cli::TaskCommand task;
  fusor::cli::ReferenceCommand reference;
  fusor::cli::ExplainCommand explain;
  fusor::cli::MappingsCommand mappings;
  fusor::cli::ExtractCommand extract;
  fusor::cli::SweepCommand sweep;
  fusor::cli::RecordsCommand records;
  fusor::cli::DbCommand db;
  fusor::cli::AdminCommand admin;
  fusor::cli::CompletionCommand completion;
};

void AddCommands(CLI::App& app, GlobalOptions& g, Commands& c) {
  fusor::cli::AddTune(app, c.tune);
  fusor::cli::AddCompile(app, g, c.compile);
  fusor::cli::AddLookup(app, c.lookup);
  fusor::cli::AddWorkers(app, c.workers);
  fusor::cli::AddHealth(app, c.health);
  fusor::cli::AddTask(app, c.task);
  fusor::cli::AddReference(app, c.reference);
  fusor::cli::AddExplain(app, g, c.explain);
  fusor::cli::AddMappings(app, g, c.mappings);
  fusor::cli::AddExtract(app, c.extract);
  fusor::cli::AddSweep(app, c.sweep);
  fusor::cli::AddRecords(app, g, c.records);
  fusor::cli::AddDb(app, c.db);
  fusor::cli::AddAdmin(app, c.admin);
  fusor::cli::AddCompletion(app, c.completion);
}

// The commands that need no scheduler: their exit status, nullopt for the
// others.
std::optional<int> RunWithoutScheduler(const GlobalOptions& g, const Commands& c) {
  if (std::optional<int> rc = fusor::cli::RunAdmin(g, c.admin)) return rc;
  if (std::optional<int> rc = fusor::cli::RunRecords(g, c.records)) return rc;
  if (std::optional<int> rc = fusor::cli::RunDb(g, c.db)) return rc;
  if (*c.extract.cmd) return fusor::cli::RunExtract(c.extract);
  if (*c.reference.cmd) return fusor::cli::RunReference(c.reference);
  if (*c.explain.cmd) return fusor::cli::RunExplain(g, c.explain);
  if (*c.mappings.cmd) return fusor::cli::RunMappings(g, c.mappings);
  if (*c.compile.cmd) return fusor::cli::RunCompileOffline(g, c.compile);
  return std::nullopt;
}

// The scheduler a command talks to: --server, or one embedded in this
// process on --db.
struct Scheduler {
  std::unique_ptr<fusor::client::Embedded> embedded;
  std::shared_ptr<grpc::Channel> channel;
};

// The embedded scheduler's local worker, for commands that may measure.
fusor::worker::WorkerOptions EmbeddedWorker(const GlobalOptions& g) {
  fusor::worker::WorkerOptions worker;
  worker.name = "embedded";
  worker.backend = g.backend;
  worker.self_exe = fusor::CurrentExecutable("fusor");
  worker.scratch_dir = fusor::cli::Env("TMPDIR").empty() ? "/tmp" : fusor::cli::Env("TMPDIR");
  worker.calibration_s = g.calibration_s;
  worker.blas_dir = FUSOR_OPENBLAS_DIR;
  worker.lease_wait = absl::Milliseconds(500);
  return worker;
}

absl::StatusOr<Scheduler> ConnectScheduler(const GlobalOptions& g, bool measures) {
  Scheduler scheduler;
  if (!g.server.empty()) {
    auto dialed = fusor::cli::DialServer(g);
    if (!dialed.ok()) return dialed.status();
    scheduler.channel = *dialed;
    return scheduler;
  }
  if (absl::Status st = fusor::EnsureParentDirectory(g.db_path); !st.ok()) return st;
  fusor::server::SchedulerOptions options;
  options.db_path = g.db_path;
  // The worker is in this process: a short lease lets a run interrupted
  // mid-job resume quickly next time.
  options.lease = absl::Seconds(10);
  options.heartbeat_interval = absl::Seconds(1);
  options.measure.max_spread = g.max_spread;
  std::optional<fusor::worker::WorkerOptions> worker;
  if (measures) {
    worker = EmbeddedWorker(g);
    std::cerr << "embedded scheduler on " << g.db_path << "; starting a local " << (g.backend == "cuda" ? "GPU" : "CPU")
              << " worker (calibrating)\n";
  }
  auto started = fusor::client::Embedded::Start(options, worker);
  if (!started.ok()) return started.status();
  scheduler.embedded = std::move(*started);
  scheduler.channel = scheduler.embedded->channel();
  return scheduler;
}

int RunOnScheduler(fusor::client::Client& client, const GlobalOptions& g, const Commands& c) {
  if (*c.tune.cmd) return fusor::cli::RunTune(client, g, c.tune);
  if (*c.sweep.cmd) return fusor::cli::RunSweep(client, g, c.sweep);
  if (*c.compile.cmd) return fusor::cli::RunCompile(client, g, c.compile);
  if (*c.lookup.cmd) return fusor::cli::RunLookup(client, g, c.lookup);
  if (*c.workers.cmd) return fusor::cli::RunWorkers(client, c.workers);
  if (*c.health.cmd) return fusor::cli::RunHealth(client, g, c.health);
  if (*c.task.cmd) return fusor::cli::RunTask(client, c.task);
  return 2;
}

// The commands a scheduler answers: checked (and a sweep planned) before
// one is dialed or started.
int RunWithScheduler(const GlobalOptions& g, Commands& c) {
  if (*c.health.cmd && g.server.empty()) {
    std::cerr << "fusor: health needs --server\n";
    return 2;
  }
  if (*c.sweep.cmd) {
    if (std::optional<int> rc = fusor::cli::PrepareSweep(g, c.sweep)) return *rc;
  }

  const std::string log_level = fusor::cli::Env("FUSOR_LOG_LEVEL").empty() ? (g.verbose ? "info" : "warn")
                                                                           : fusor::cli::Env("FUSOR_LOG_LEVEL");
  if (!fusor::SetLogLevel(log_level)) {
    std::cerr << "fusor: unknown log level '" << log_level << "'\n";
    return 2;
  }

  // Only commands that may measure need the local worker.
  const bool measures = *c.tune.cmd || (*c.compile.cmd && !c.compile.cache_only) || *c.sweep.cmd;
  auto scheduler = ConnectScheduler(g, measures);
  if (!scheduler.ok()) return fusor::cli::Fail(scheduler.status());
  fusor::client::Client client(scheduler->channel);
  return RunOnScheduler(client, g, c);
}

}  // namespace

int main(int argc, char** argv) {
  // The isolated child that runs one job of the embedded worker.
  if (argc == 3 && std::string(argv[1]) == "__run-job") return fusor::worker::RunJobMain(argv[2]);

  CLI::App app{"fusor: fused operator chains, tuned in seconds and shared through one tuning database"};
  app.require_subcommand(1);
  GlobalOptions g;
  AddGlobalOptions(app, g);
  Commands c;
  AddCommands(app, g, c);
  if (std::optional<int> rc = fusor::ParseCommandLine(app, "fusor", argc, argv)) return *rc;
  if (*c.completion.cmd) {
    std::cout << fusor::cli::CompletionScript(app, "fusor", c.completion.shell);
    return 0;
  }
  g.timeout_given = app.count("--timeout") > 0;
  // $FUSOR_SERVER stands for --server, unless --db asks for an embedded scheduler on that file.
  if (app.count("--server") == 0 && app.count("--db") == 0) g.server = fusor::cli::Env("FUSOR_SERVER");
  if (std::optional<int> rc = RunWithoutScheduler(g, c)) return *rc;
  return RunWithScheduler(g, c);
}
