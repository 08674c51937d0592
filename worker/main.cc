// fusor-worker: compiles, validates and measures candidates for a scheduler.
// Flags are read here and nowhere else.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/util/build_info.h"
#include "common/util/config_file.h"
#include "common/util/files.h"
#include "common/util/log.h"
#include "common/util/notify.h"
#include "proto/wire/cli_flags.h"
#include "worker/job.h"
#include "common/util/process.h"
#include "worker/worker.h"

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

int main(int argc, char** argv) {
  // The isolated child that runs one job (see worker/job.h).
  if (argc == 3 && std::string(argv[1]) == "__run-job") return fusor::worker::RunJobMain(argv[2]);

  CLI::App app{"fusor-worker: measures candidates for a fusor-scheduler"};
  std::string scheduler = "127.0.0.1:7788";
  std::string log_level = Env("FUSOR_LOG_LEVEL").empty() ? "info" : Env("FUSOR_LOG_LEVEL");
  char host[256] = "worker";
  gethostname(host, sizeof(host) - 1);
  fusor::worker::WorkerOptions options;
  options.name = std::string(host) + ":" + std::to_string(getpid());
  options.scratch_dir = Env("TMPDIR").empty() ? "/tmp" : Env("TMPDIR");
  options.self_exe = fusor::CurrentExecutable("fusor-worker");
  app.add_option("--scheduler", scheduler, "scheduler address (host:port)")->capture_default_str();
  app.add_option("--name", options.name, "name shown by `fusor workers`")->capture_default_str();
  options.backend = "auto";
  app.add_option("--backend", options.backend,
                 "cuda (fail without a usable GPU), cpu, or auto (the GPU when a driver and device are present)")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}))
      ->capture_default_str();
  app.add_option("--gpu", options.gpu, "CUDA: the device ordinal to measure on")->capture_default_str();
  app.add_option("--compiler", options.compiler, "C++ compiler for CPU candidates")->capture_default_str();
  options.blas_dir = FUSOR_OPENBLAS_DIR;
  app.add_option("--blas-dir", options.blas_dir, "directory of the libopenblas the unfused baselines link")
      ->capture_default_str();
  app.add_option("--scratch-dir", options.scratch_dir, "where candidates are compiled (env TMPDIR)")
      ->capture_default_str();
  app.add_option("--calibration-seconds", options.calibration_s,
                 "length of each calibration microbenchmark (0: skip, the model then uses defaults)")
      ->capture_default_str();
  app.add_option("--quiet-file", options.quiet_file,
                 "a serving process's request counters on this machine (16 bytes: running, started; fusor.torch "
                 "keeps them): kernels are timed between its requests")
      ->check(CLI::ExistingFile);
  app.add_flag("--hold-during-requests", options.hold_during_requests,
               "with --quiet-file: hold every job's process (compiling, validating, timing) while a request runs, "
               "so that tuning takes nothing from the requests and goes on between them");
  app.add_option("--compile-ahead", options.compile_ahead,
                 "jobs compiled ahead of the measurement (-1: 2 on a GPU, while another is measured; 3 on a CPU, "
                 "together before the next measurement, never beside one)")
      ->check(CLI::Range(-1, 8))
      ->capture_default_str();
  std::string token = Env("FUSOR_TOKEN");
  app.add_option("--token", token, "a worker-role token of the scheduler (env FUSOR_TOKEN; prefer the env: "
                                   "arguments show in ps)");
  std::string token_file = Env("FUSOR_TOKEN_FILE");
  app.add_option("--token-file", token_file,
                 "a file holding the token (env FUSOR_TOKEN_FILE), read again on SIGHUP; instead of --token")
      ->check(CLI::ExistingFile);
  fusor::wire::ClientTls tls;
  fusor::wire::AddClientTlsFlags(app, tls);
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error (env FUSOR_LOG_LEVEL)")
      ->capture_default_str();
  std::string log_format = "text";
  app.add_option("--log-format", log_format, "text, or json: one object per line (time with its UTC offset)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  fusor::AddConfigFile(app);
  if (std::optional<int> rc = fusor::ParseCommandLine(app, "fusor-worker", argc, argv)) return *rc;
  if (!fusor::SetLogLevel(log_level)) {
    std::cerr << "unknown log level '" << log_level << "'\n";
    return 2;
  }
  fusor::SetLogFormat(log_format);
  auto log = fusor::Logger("worker");

  // SIGINT/SIGTERM: finish the job in hand and exit; SIGHUP: dial again with
  // the token file and certificates read anew.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto dial = [&]() -> absl::StatusOr<std::shared_ptr<grpc::Channel>> {
    std::string t = token;
    if (!token_file.empty()) {
      auto text = fusor::ReadFile(token_file);
      if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("--token-file: ", text.status().message()));
      t = std::string(absl::StripAsciiWhitespace(*text));
    }
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(16 << 20);
    return fusor::wire::Dial(scheduler, t, tls, args);
  };
  auto channel = dial();
  if (!channel.ok()) {
    log->error("{}", std::string(channel.status().message()));
    return 2;
  }
  fusor::worker::Worker worker(*channel, options);
  if (absl::Status st = worker.Prepare(); !st.ok()) {
    log->error("cannot describe this machine: {}", st.ToString());
    return 1;
  }
  fusor::NotifyReady("serving " + scheduler);
  std::thread waiter([&] {
    int sig = 0;
    while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
      auto again = dial();
      if (again.ok()) {
        worker.Redial(*again);
        log->info("SIGHUP: dialled {} again with the token and certificates read anew", scheduler);
      } else {
        log->error("SIGHUP: keeping the connection as it is: {}", std::string(again.status().message()));
      }
    }
    log->info("signal {}: finishing the job in hand, then exiting", sig);
    fusor::NotifyStopping();
    worker.Stop();
  });
  waiter.detach();
  absl::Status st = worker.Run();
  if (!st.ok()) {
    log->error("cannot reach the scheduler at {}: {}", scheduler, st.ToString());
    return 1;
  }
  return 0;
}
