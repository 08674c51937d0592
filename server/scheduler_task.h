// The scheduler's task and the helpers its parts share, internal to the
// scheduler (scheduler.h). Scheduler's members are defined by concern:
//  - scheduler.cc: creation, ids, resuming tasks after a restart, learning
//    the cost model from the database, and the reaper of lost leases;
//  - scheduler_requests.cc: clients' requests: the cache, schedules
//    translated between equivalent chains, quotas, starting and waiting on
//    tasks;
//  - scheduler_serving.cc: chains whose sizes change: records of the same
//    chain at other sizes (a range that covers a request, the nearest one
//    whose schedule carries over) and why a request has none of its own;
//  - scheduler_workers.cc: workers: registration, tokens, leases and
//    reports (a report's plausibility checked);
//  - scheduler_rounds.cc: a task's rounds of candidates, progress, and the
//    unfused baselines measured beside them;
//  - scheduler_confirm.cc: the best candidate confirmed by another run, and
//    the task finished with it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/util/log.h"
#include "server/scheduler.h"

namespace fusor::server {

struct Scheduler::Task {
  db::TaskRow row;
  ir::Chain chain;  // canonical
  hw::TargetDesc target;
  std::unique_ptr<search::SearchStrategy> strategy;
  std::vector<db::CandidateRow> batch;  // the round being measured
  int issued = 0;
  int64_t version = 1;
  TaskStarted started;
  TuneProgress progress;
  std::optional<TuneResult> result;
  // This task's baseline jobs: one queued with the first candidates, so
  // that the baseline is measured among them; on a GPU also one with each
  // confirmation.
  std::vector<std::string> baseline_jobs;
  // The best candidate measured again at the end: the fastest of many
  // noisy medians is biased low, and a speedup quoted from it too high;
  // and one worker's number alone is never the best (see Advance).
  std::vector<std::string> confirm_jobs;
  std::optional<double> floor_s;  // the least a run can take (model::PhysicalFloorS), once asked
};

inline std::shared_ptr<spdlog::logger> Log() { return Logger("scheduler"); }

inline bool Finished(db::JobState state) { return state == db::JobState::kDone || state == db::JobState::kFailed; }

TaskStarted StartedOf(const db::TaskRow& row);

// Runs of a task's best candidate again before anything is cached.
constexpr size_t kConfirmAttempts = 3;

// `text`, a fused schedule of chain `from`, in the names of chain `to`:
// dim_map[u] is the dim of `from` that dim u of `to` is (-1: none), and
// tensor_map the same for tensors. With `fit`, `to` is `from` at other
// sizes and each tile is cut to its dim's size there. `text` itself when
// it does not parse.
std::string TranslateFused(const std::string& text, const ir::Chain& from, const ir::Chain& to,
                           const std::vector<int>& dim_map, const std::vector<int>& tensor_map, bool fit = false);

}  // namespace fusor::server
