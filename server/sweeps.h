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

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fusor/v1/scheduler.pb.h"
#include "server/scheduler.h"

namespace fusor::server {

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
  absl::StatusOr<v1::SweepStarted> Start(const v1::SweepRequest& request, const Caller& caller);

  struct Status {
    v1::SweepProgress progress;
    bool finished = false;
  };
  absl::StatusOr<Status> Progress(const std::string& sweep_id);
  absl::StatusOr<v1::SweepReport> Report(const std::string& sweep_id);

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
