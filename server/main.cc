// fusor-scheduler: the tuning service. Flags are read here and nowhere else.
#include <signal.h>

#include <cstdlib>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "common/util/build_info.h"
#include "common/util/config_file.h"
#include "common/util/log.h"
#include "common/util/notify.h"
#include "common/util/paths.h"
#include "common/util/timing.h"
#include "server/metrics.h"
#include "server/service.h"
#include "server/tls.h"
#include "proto/wire/channel.h"

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Everything the flags say. Most scheduler options are set by their flag
// directly; the rest are made from the values below once parsed.
struct Flags {
  std::string listen = "127.0.0.1:7788";
  std::string db_path = fusor::DefaultDatabasePath(Env("XDG_DATA_HOME"), Env("HOME"));
  std::string log_level = Env("FUSOR_LOG_LEVEL").empty() ? "info" : Env("FUSOR_LOG_LEVEL");
  std::string log_format = "text";
  fusor::server::SchedulerOptions options;
  double lease_s = 60, heartbeat_s = 2, worker_timeout_s = 20, lost_retention_h = 24;
  double time_budget_s = 0.3, job_timeout_s = 300;
  bool fused_only = false;
  bool no_learning = false;
  double max_spread = fusor::kMaxSpread;
  bool insecure = false;
  fusor::server::ServerTls tls;
  std::string metrics_listen;
  double drain_s = 5;
};

void AddFlags(CLI::App& app, Flags& f) {
  fusor::server::SchedulerOptions& options = f.options;
  app.add_option("--listen", f.listen, "address to serve on (host:port)")->capture_default_str();
  app.add_option("--db", f.db_path, "SQLite tuning database")->capture_default_str();
  app.add_option("--db-max-mb", options.db_max_mb,
                 "cap on the database file, in MiB (0: none); beyond it writes are refused as on a full disk")
      ->capture_default_str();
  app.add_option("--salt", options.salt, "cache salt: a new value starts a fresh cache, deleting nothing");
  app.add_option("--budget", options.default_budget, "default candidates measured per task")->capture_default_str();
  app.add_option("--batch-size", options.batch_size, "candidates per search round")->capture_default_str();
  app.add_option("--lease-seconds", f.lease_s, "lease length; a silent worker's job requeues after it")
      ->capture_default_str();
  app.add_option("--heartbeat-seconds", f.heartbeat_s, "worker heartbeat interval")->capture_default_str();
  app.add_option("--worker-timeout-seconds", f.worker_timeout_s, "silence after which a worker is listed lost")
      ->capture_default_str();
  app.add_option("--lost-worker-retention-hours", f.lost_retention_h,
                 "silence after which a lost worker leaves `fusor workers` (its measurements keep its id)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-attempts", options.max_attempts, "leases of one job before it fails")->capture_default_str();
  app.add_option("--sweep-parallel", options.sweep_parallel, "chains of one sweep tuned at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--max-budget", options.max_budget, "most candidates one task may ask for")->capture_default_str();
  app.add_option("--max-ops", options.max_ops, "largest chain accepted, in ops (0: no limit)")->capture_default_str();
  app.add_option("--max-tensor-elements", options.max_tensor_elements,
                 "largest tensor accepted, in elements (0: no limit)")
      ->capture_default_str();
  app.add_option("--max-tasks-per-client", options.max_tasks_per_client,
                 "running tasks one client (token) may have started (0: no limit)")
      ->capture_default_str();
  app.add_option("--max-candidates-per-client", options.max_candidates_per_client,
                 "candidates one client's running tasks may have yet to measure (0: no limit)")
      ->capture_default_str();
  app.add_option("--max-sweeps-per-client", options.max_sweeps_per_client,
                 "running sweeps one client may have started (0: no limit)")
      ->capture_default_str();
  app.add_flag("--fused-only", f.fused_only,
               "answer with one fused kernel: no split chains, and not the unfused chain even where it measured "
               "faster (to study fusion itself)");
  app.add_flag("--no-learning", f.no_learning,
               "rank with the analytical cost model only: no model is learned from the database's measurements");
  app.add_option("--time-budget", f.time_budget_s, "seconds of timed repeats per candidate")->capture_default_str();
  app.add_option("--max-spread", f.max_spread,
                 "a measurement whose samples' (p90 - p10) / median stays beyond this is noisy: never a best record "
                 "or a baseline")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--job-timeout", f.job_timeout_s, "seconds a worker may spend on one job")->capture_default_str();
  app.add_flag("--insecure", f.insecure,
               "accept calls without tokens (local use only: anyone who reaches the port may tune, and report "
               "measurements as a worker)");
  app.add_option("--tls-cert", f.tls.cert_file, "PEM certificate chain: serve TLS on every port (with --tls-key)");
  app.add_option("--tls-key", f.tls.key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", f.tls.client_ca_file,
                 "PEM CA certificate: mutual TLS, every caller must present a certificate it signed");
  app.add_option("--metrics-listen", f.metrics_listen,
                 "serve Prometheus metrics at http://HOST:PORT/metrics (off when empty)");
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error (env FUSOR_LOG_LEVEL)")
      ->capture_default_str();
  app.add_option("--log-format", f.log_format, "text, or json: one object per line (time with its UTC offset)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--drain-seconds", f.drain_s,
                 "on SIGTERM: NOT_SERVING, then this long for the calls in flight to finish (calls waiting for a "
                 "task end UNAVAILABLE at once, and their clients ask the restarted scheduler again)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

// The options the flags set through values of their own.
void FinishOptions(Flags& f) {
  fusor::server::SchedulerOptions& options = f.options;
  options.learn.enabled = !f.no_learning;
  options.db_path = f.db_path;
  options.require_tokens = !f.insecure;
  options.lease = absl::Seconds(f.lease_s);
  options.heartbeat_interval = absl::Seconds(f.heartbeat_s);
  options.worker_timeout = absl::Seconds(f.worker_timeout_s);
  options.lost_worker_retention = absl::Hours(f.lost_retention_h);
  options.measure.time_budget_s = f.time_budget_s;
  options.measure.max_spread = f.max_spread;
  options.unfused_answers = !f.fused_only;
  options.measure.timeout_s = f.job_timeout_s;
}

// The Prometheus endpoint of --metrics-listen; null when it is off.
absl::StatusOr<std::unique_ptr<fusor::server::MetricsServer>> StartMetrics(
    const Flags& f, fusor::server::SchedulerServer& server, spdlog::logger& log) {
  if (f.metrics_listen.empty()) return nullptr;
  auto metrics = fusor::server::MetricsServer::Start(
      f.metrics_listen, [core = &server.core()] { return fusor::server::RenderMetrics(*core); }, f.tls);
  if (!metrics.ok()) return metrics.status();
  log.info("metrics on {}://{}:{}/metrics", f.tls.enabled() ? "https" : "http",
           f.metrics_listen.substr(0, f.metrics_listen.rfind(':')), (*metrics)->port());
  std::cout << "fusor-scheduler metrics on port " << (*metrics)->port() << std::endl;
  return metrics;
}

// How callers are let in: tokens or --insecure, TLS or not; warns where
// that is weak.
void LogAccess(const Flags& f, fusor::server::SchedulerServer& server, spdlog::logger& log) {
  if (f.insecure) {
    log.warn("--insecure: calls are not authenticated; anyone who reaches port {} may tune and act as a worker",
             server.port());
  } else {
    auto active = server.core().db().CountActiveTokens();
    log.info("tokens required ({} active)", active.ok() ? *active : 0);
    if (active.ok() && *active == 0) {
      log.warn("no tokens yet: create them with `fusor --db {} admin token create --role worker|client|admin "
               "--name NAME`",
               f.db_path);
    }
  }
  if (f.tls.enabled()) {
    log.info("TLS on{}", f.tls.client_ca_file.empty() ? "" : ", client certificates required (mutual TLS)");
  } else if (!fusor::wire::IsLoopbackAddress(f.listen)) {
    log.warn("TLS off: tokens cross the network in plaintext; give --tls-cert and --tls-key off this machine");
  }
}

// Starts the scheduler and serves until one of `signals` (blocked in every
// thread) arrives; the exit status.
int Serve(const Flags& f, const sigset_t& signals, const std::shared_ptr<spdlog::logger>& log) {
  auto tls = fusor::server::GrpcServerTls::Create(f.tls);
  if (!tls.ok()) {
    log->error("{}", std::string(tls.status().message()));
    return 2;
  }
  auto server = fusor::server::SchedulerServer::Start(f.options, f.listen, (*tls)->credentials());
  if (!server.ok()) {
    log->error("cannot start: {}", server.status().ToString());
    return 1;
  }
  auto metrics = StartMetrics(f, **server, *log);
  if (!metrics.ok()) {
    log->error("{}", metrics.status().ToString());
    return 1;
  }
  LogAccess(f, **server, *log);
  log->info("serving on {}:{} with database {}", f.listen.substr(0, f.listen.rfind(':')), (*server)->port(),
            f.db_path);
  std::cout << "fusor-scheduler listening on port " << (*server)->port() << std::endl;
  fusor::NotifyReady(absl::StrCat("serving on port ", (*server)->port()));
  std::thread waiter([&] {
    int sig = 0;
    while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
      // Tokens are read again from the database; certificates from disk,
      // each port keeping the ones it has when the new files do not check out.
      (*server)->ForgetTokens();
      absl::Status st = (*tls)->Reload();
      if (st.ok() && *metrics) st = (*metrics)->ReloadTls(f.tls);
      if (st.ok()) {
        log->info("SIGHUP: {} reloaded", f.tls.enabled() ? "tokens and certificates" : "tokens (no TLS)");
      } else {
        log->error("SIGHUP: tokens reloaded; certificates kept, the new ones do not check out: {}",
                   std::string(st.message()));
      }
    }
    log->info("signal {}: shutting down", sig);
    fusor::NotifyStopping();
    (*server)->Shutdown(absl::Seconds(f.drain_s));
  });
  (*server)->Wait();
  waiter.detach();
  metrics->reset();
  server->reset();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fusor-scheduler: tunes fused operator chains with the workers that dial in"};
  Flags flags;
  AddFlags(app, flags);
  fusor::AddConfigFile(app);
  if (std::optional<int> rc = fusor::ParseCommandLine(app, "fusor-scheduler", argc, argv)) return *rc;
  if (!fusor::SetLogLevel(flags.log_level)) {
    std::cerr << "unknown log level '" << flags.log_level << "'\n";
    return 2;
  }
  fusor::SetLogFormat(flags.log_format);
  FinishOptions(flags);
  auto log = fusor::Logger("scheduler");
  if (absl::Status st = fusor::EnsureParentDirectory(flags.db_path); !st.ok()) {
    log->error("{}", st.ToString());
    return 1;
  }

  // SIGINT/SIGTERM end the server cleanly, SIGHUP reloads; block them
  // before threads start.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return Serve(flags, signals, log);
}
