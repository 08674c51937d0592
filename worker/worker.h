// fusor-worker's daemon logic: describe and calibrate this machine,
// register with the scheduler, then lease jobs, run each in an isolated
// child process and report what it measured. The next jobs compile in
// their own children ahead of the measurement (compile_ahead): on a GPU
// while the device measures the current one, on a CPU together before it
// (never beside it); measurements never overlap. Workers dial out; the
// scheduler never connects to them.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <optional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/hw/target.h"
#include "fusor/v1/worker.grpc.pb.h"
#include "proto/wire/retry.h"
#include "worker/job.h"
#include "common/util/process.h"

namespace fusor::worker {

struct WorkerOptions {
  std::string name;               // shown by `fusor workers`
  // "cpu", "cuda" (fail without a usable GPU) or "auto" (the GPU when one
  // is usable, else the CPU, said once in the log).
  std::string backend = "cpu";
  int gpu = 0;                    // CUDA: the device's ordinal
  std::string compiler = "c++";
  std::string blas_dir;           // OpenBLAS the baselines link; empty: the linker's default
  std::string scratch_dir = "/tmp";
  std::string self_exe;           // this executable; runs jobs as `self_exe __run-job DIR`
  double calibration_s = 0.4;     // per microbenchmark; 0 skips calibration
  // Jobs compiled (each in its own child) ahead of the measurement; -1: 2
  // on a GPU (while the device measures another), 3 on a CPU (together,
  // before the next measurement: its cores are the measurement's).
  int compile_ahead = -1;
  // A serving process's requests on this machine (common/util/quiet.h):
  // kernels are timed between them. Empty: none. With `hold_during_requests`
  // every job's process (compiling, validating, timing) is also held while
  // a request runs: tuning then takes no cycle, cache line or memory
  // bandwidth from the requests, and goes on between them.
  std::string quiet_file;
  bool hold_during_requests = false;
  absl::Duration lease_wait = absl::Seconds(5);
  wire::RetryPolicy rpc;
};

class Worker {
 public:
  Worker(std::shared_ptr<grpc::Channel> channel, WorkerOptions options);
  ~Worker();

  // Describes this machine's GPU or CPU (see WorkerOptions::backend) and
  // calibrates W and P (in a child process).
  absl::Status Prepare();
  // Registers and serves jobs until Stop(). Returns an error only if the
  // scheduler cannot be reached for registration.
  absl::Status Run();
  // Asks Run() to return after the job in hand; safe from any thread.
  void Stop();
  // Calls from now on go through `channel` (a SIGHUP's new token or
  // certificate); calls in flight finish on the old one. Any thread.
  void Redial(std::shared_ptr<grpc::Channel> channel);

  const hw::TargetDesc& target() const { return target_; }
  bool registered() const { return registered_; }

 private:
  absl::Status Calibrate();
  absl::Status Register();
  void HeartbeatLoop();
  // A leased job, compiling ahead when compile_ahead > 0.
  struct Pending {
    v1::Job job;
    // The registration the job was leased under, which reports it even
    // after the worker registered again.
    std::string worker_id, worker_secret;
    std::string context;  // "[task=... job=... cand=...]" for the log
    absl::StatusOr<JobSpec> spec;
    std::optional<TempDir> artifacts;
    std::future<JobOutcome> compiled;  // declared after artifacts: joined before they go
  };
  Pending Start(const v1::Job& job);
  // Measures (after its compile, when ahead) and reports.
  void Finish(Pending& pending);

  std::shared_ptr<v1::WorkerService::Stub> Stub();
  std::mutex stub_mu_;
  std::shared_ptr<v1::WorkerService::Stub> stub_;  // guarded by stub_mu_
  WorkerOptions options_;
  hw::TargetDesc target_;
  bool compile_during_measurement_ = true;  // Backend::CompilesDuringMeasurement
  // The current registration; written by Register on the Run thread while
  // the heartbeat thread reads it, so guarded by mu_.
  std::string worker_id_;
  std::string worker_secret_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> reregister_{false};
  std::atomic<bool> registered_{false};
  std::atomic<int> heartbeat_ms_{2000};
  std::atomic<int> lease_ms_{60000};
  std::mutex mu_;
  std::condition_variable cv_;
  grpc::ClientContext* lease_ctx_ = nullptr;  // the Lease call in flight, guarded by mu_
  std::set<std::string> held_leases_;          // received, not yet reported; guarded by mu_
  std::optional<TempDir> cache_;               // kept across jobs: references, the precompiled preamble
  std::thread heartbeat_;
  // Holds the job processes while a serving process's request runs
  // (WorkerOptions::hold_during_requests); ends with the worker.
  std::thread holder_;
  void HoldLoop();
  void StopHolding();
};

}  // namespace fusor::worker
