// Sweeps over model zoos, run by the scheduler: the chains of many models,
// each distinct canonical key tuned once, cache first, a few at a time.
//
// A sweep lives in the tuning database (sweeps, sweep_entries,
// sweep_chains): the runner's thread drives every running sweep it finds
// there, so a sweep goes on without a client following it and carries on
// after a restart, and a request for exactly the same sweep (same entries,
// target, budget and salt) joins the running one instead of starting
// another. A finished sweep is not joined: asking again starts a new one,
// which the cache answers.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/scheduler.h"

namespace fusor::server {

// A sweep as asked for: models' chains, the target, the budget per chain.
struct SweepRequest {
  struct Entry {
    std::string model;   // e.g. "bert-base b=8 s=128"
    std::string role;    // e.g. "self-attention", "ffn"
    std::string source;  // where in the model: layers, or ONNX nodes
    int instances = 0;   // how many times one run of the model runs it
    std::string chain_name;           // as the request names it, for messages
    absl::StatusOr<ir::Chain> chain;  // or why the request's chain could not be read
  };
  std::string name;  // e.g. the manifest's name
  std::vector<Entry> entries;
  TargetSelector target;
  TuneOptions options;  // the budget per chain; force is not supported
};

struct SweepStarted {
  std::string sweep_id;
  bool resumed = false;  // a running sweep that asked for the same
  int models = 0;
  int entries = 0;
  int chains = 0;  // distinct canonical keys
  std::string target_fp;
  int budget = 0;
};

struct SweepChainProgress {
  std::string workload_key;
  std::string chain;  // the first entry's chain name
  std::string model;  // and its model
  int measured = 0;
  int budget = 0;
  bool operator==(const SweepChainProgress&) const = default;
};

struct SweepProgress {
  int chains = 0;
  int done = 0;  // cache hits + tuned + failed
  int cache_hits = 0;
  int tuned = 0;
  int failed = 0;
  std::vector<SweepChainProgress> tuning;
  double elapsed_s = 0;
  double eta_s = -1;  // < 0: not known yet
  bool operator==(const SweepProgress&) const = default;
};

// One entry's outcome, in the entry's names.
struct SweepChainResult {
  std::string model, chain, role, source;
  int instances = 0;
  std::string workload_key;
  std::string state;  // "cache", "tuned", or the chain's state
  std::string error;
  double best_s = 0;
  double baseline_s = 0;  // the unfused chain; 0 when not measured
  double speedup = 0;
  double tuning_s = 0;  // of the task that found the best kernel
  std::string schedule;
  std::string task_id;
  int candidates_measured = 0;
};

struct SweepReport {
  db::SweepRow sweep;
  hw::TargetDesc target;
  std::vector<SweepChainResult> results;  // per entry, in the request's order
};

struct SweepOptions {
  // Chains of one sweep tuned at the same time: enough to keep the
  // workers busy while a task computes its next round.
  int parallel = 2;
  // How often the runner looks at its sweeps' tasks.
  absl::Duration poll = absl::Milliseconds(250);
  int max_entries = 20000;
};

class SweepRunner {
 public:
  SweepRunner(Scheduler* core, SweepOptions options);
  ~SweepRunner();
  SweepRunner(const SweepRunner&) = delete;
  SweepRunner& operator=(const SweepRunner&) = delete;

  // Records a new sweep or finds the running one that asked for the same.
  // INVALID_ARGUMENT (naming the entry) for a bad entry, nothing recorded;
  // FAILED_PRECONDITION when no worker has registered the target;
  // RESOURCE_EXHAUSTED when `caller` already runs as many sweeps as a
  // client may (joining a running sweep is always allowed). The sweep's
  // tasks are the caller's.
  absl::StatusOr<SweepStarted> Start(const SweepRequest& request, const Caller& caller);

  struct Status {
    SweepProgress progress;
    bool finished = false;
  };
  absl::StatusOr<Status> Progress(const std::string& sweep_id);
  absl::StatusOr<SweepReport> Report(const std::string& sweep_id);

 private:
  void Loop();
  absl::Status Advance(const db::SweepRow& sweep);

  Scheduler* core_;
  const SweepOptions options_;
  std::mutex start_mu_;  // one Start at a time: two equal requests make one sweep
  std::mutex mu_;
  std::condition_variable cv_;
  bool wake_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace fusor::server
