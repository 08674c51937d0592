// A task finished with its best (db::FindBest): the fastest trusted
// candidate, confirmed by another run.
#include "server/scheduler_task.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/space/schedule.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"
#include "common/util/timing.h"

namespace fusor::server {

using db::JobKind;
using db::MeasurementStatus;
using db::TaskState;

absl::Status Scheduler::Finalize(Task& task, const std::vector<db::MeasurementRow>& rows) {
  const db::MeasurementRow* first_failure = nullptr;
  int candidates = 0, trusted = 0;
  for (const db::MeasurementRow& m : rows) {
    if (m.kind != JobKind::kCandidate) continue;
    ++candidates;
    trusted += m.status == MeasurementStatus::kOk;
    if (m.status != MeasurementStatus::kOk && first_failure == nullptr) first_failure = &m;
  }
  // What the task reports and caches is the best's confirmation: its
  // candidate measured again, trusted and agreeing.
  const db::BestOfTask found = db::FindBest(rows, options_.measure.max_spread);
  const db::MeasurementRow* best = found.confirmation;
  const int64_t now = NowMs();
  std::optional<db::BestRow> unfused;  // the unfused chain, where it beat every fused kernel
  if (trusted == 0) {
    task.row.state = TaskState::kFailed;
    task.row.error = candidates == 0
                         ? "the search proposed no candidates"
                         : absl::StrCat("all ", candidates, " candidates failed; the first: ",
                                        db::Name(first_failure->status), ": ", first_failure->error.substr(0, 2000));
  } else if (best == nullptr) {
    // Nothing is cached: a later request for the chain tunes it again.
    task.row.state = TaskState::kFailed;
    task.row.error = absl::StrCat("unconfirmed: ", task.confirm_jobs.size(), " runs again of the fastest candidates ",
                                  "gave no trusted time within ", options_.measure.max_spread * 100,
                                  "% of theirs; nothing was cached (tune again, on a quieter machine)");
  } else {
    ASSIGN_OR_RETURN(unfused, UnfusedBest(task, *best));
    RETURN_IF_ERROR(db_->OfferBest(task.row.workload_key, task.row.target_fp, task.row.salt,
                                   unfused ? *unfused
                                           : db::BestRow{task.row.id, *best->candidate_id, best->id, best->median_s},
                                   now));
    task.row.state = TaskState::kDone;
  }
  RETURN_IF_ERROR(db_->FinishTask(task.row.id, task.row.state, task.row.error, now));
  task.row.finished_ms = now;
  {
    std::lock_guard<std::mutex> lock(train_mu_);
    train_wanted_.insert(task.row.target_fp);
  }
  if (task.row.state == TaskState::kDone) {
    ASSIGN_OR_RETURN(TuneResult r, ResultFromBest(task.row.workload_key, task.row.target_fp, false));
    // Report this task's work, whichever task found the best kernel.
    r.candidates_measured = task.progress.measured;
    r.candidates_failed = task.progress.failed;
    r.tuning_s = static_cast<double>(now - task.row.created_ms) / 1000;
    task.result = std::move(r);
  }
  task.strategy.reset();
  ++task.version;
  task_cv_.notify_all();
  Log()->info("[task={}] {} after {:.1f} s: {}", task.row.id, std::string(db::Name(task.row.state)),
              static_cast<double>(now - task.row.created_ms) / 1000,
              task.row.state != TaskState::kDone ? task.row.error
              : unfused ? absl::StrCat("best: the unfused chain, ", unfused->median_s * 1e3, " ms (the best fused kernel ",
                                       best->median_s * 1e3, " ms)")
                        : absl::StrCat("best ", best->median_s * 1e3, " ms"));
  return absl::OkStatus();
}

}  // namespace fusor::server
