#include "server/scheduler.h"

#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/ir/parse.h"
#include "common/model/cost_model.h"
#include "common/space/schedule.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"
#include "common/util/timing.h"
#include "proto/wire/convert.h"
#include "server/scheduler_task.h"

namespace fusor::server {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

using db::JobKind;
using db::TaskState;

TaskStarted StartedOf(const db::TaskRow& row) {
  return {row.id, row.workload_key, row.target_fp, row.space_size, row.space_after_pruning, row.budget};
}

namespace {

MeasureOptions WithDefaults(MeasureOptions m) {
  if (m.warmup <= 0) m.warmup = 2;
  if (m.min_repeats <= 0) m.min_repeats = 5;
  if (m.max_repeats <= 0) m.max_repeats = 100;
  if (m.time_budget_s <= 0) m.time_budget_s = 0.3;
  if (m.timeout_s <= 0) m.timeout_s = 300;
  if (m.max_spread <= 0) m.max_spread = kMaxSpread;
  return m;
}

}  // namespace

Scheduler::Scheduler(SchedulerOptions options, std::optional<FileLock> lock, std::unique_ptr<db::TuningDb> db)
    : options_(std::move(options)), lock_(std::move(lock)), db_(std::move(db)), models_(*db_, options_.learn) {
  std::random_device rd;
  id_state_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(NowMs());
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerOptions& options) {
  // Two schedulers on one file would both resume its tasks and sweeps.
  std::optional<FileLock> lock;
  if (options.db_path != ":memory:" && !options.db_path.empty()) {
    auto held = FileLock::Acquire(options.db_path + ".lock");
    if (!held.ok() && !absl::IsFailedPrecondition(held.status())) {
      return absl::Status(held.status().code(),
                          absl::StrCat("the tuning database ", options.db_path, " cannot be created or locked (",
                                       held.status().message(),
                                       "); give --db a path in a directory this user can write"));
    }
    if (!held.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the tuning database ", options.db_path, " is in use by another fusor scheduler (", held.status().message(),
          "); run one scheduler per database and share it with --server, or use another --db"));
    }
    lock.emplace(std::move(*held));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<db::TuningDb> db, db::TuningDb::Open(options.db_path));
  if (options.db_max_mb > 0) RETURN_IF_ERROR(db->SetMaxBytes(options.db_max_mb << 20));
  SchedulerOptions opts = options;
  opts.measure = WithDefaults(opts.measure);
  std::unique_ptr<Scheduler> s(new Scheduler(std::move(opts), std::move(lock), std::move(db)));
  // Workers of a previous run count as lost until they heartbeat again.
  RETURN_IF_ERROR(s->db_->MarkLostWorkers(NowMs() + 1).status());
  RETURN_IF_ERROR(s->FillFamilies());
  RETURN_IF_ERROR(s->ResumeTasks());
  // Tasks start with what the database has taught: a database from before
  // learned models, or measured since the last training, trains now.
  ASSIGN_OR_RETURN(std::vector<db::TargetRow> targets, s->db_->ListTargets());
  for (const db::TargetRow& t : targets) s->train_wanted_.insert(t.fingerprint);
  s->TrainCostModels();
  s->reaper_ = std::thread([p = s.get()] { p->ReaperLoop(); });
  return s;
}

Scheduler::~Scheduler() {
  stop_ = true;
  {
    std::lock_guard<std::mutex> lock(reaper_mu_);
    reaper_cv_.notify_all();
  }
  if (reaper_.joinable()) reaper_.join();
  std::lock_guard<std::mutex> lock(mu_);
  task_cv_.notify_all();
  lease_cv_.notify_all();
}

std::string Scheduler::Salt() const {
  return options_.salt.empty() ? kEngineVersion : absl::StrCat(kEngineVersion, "+", options_.salt);
}

std::string Scheduler::NewId(const char* prefix) {
  std::lock_guard<std::mutex> lock(id_mu_);
  // splitmix64: unique within the process and unpredictable enough for ids.
  uint64_t z = (id_state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(z));
  return absl::StrCat(prefix, buf);
}

absl::StatusOr<hw::TargetDesc> Scheduler::TargetOf(const std::string& fp) {
  ASSIGN_OR_RETURN(db::TargetRow t, db_->GetTarget(fp));
  absl::StatusOr<hw::TargetDesc> desc = wire::TargetFromJson(t.description_json);
  if (!desc.ok()) return absl::DataLossError(absl::StrCat("target ", fp, ": ", desc.status().message()));
  return desc;
}

absl::StatusOr<Scheduler::Task*> Scheduler::LoadTask(const db::TaskRow& row) {
  auto task = std::make_unique<Task>();
  task->row = row;
  ASSIGN_OR_RETURN(db::WorkloadRow w, db_->GetWorkload(row.workload_key));
  ASSIGN_OR_RETURN(task->chain, ir::ParseChainJson(w.chain_json));
  ASSIGN_OR_RETURN(task->target, TargetOf(row.target_fp));
  // The W and P the task started with, not the target's latest calibration.
  if (row.bandwidth_bytes_per_s > 0 && row.peak_flops > 0) {
    task->target.bandwidth_bytes_per_s = row.bandwidth_bytes_per_s;
    task->target.peak_flops = row.peak_flops;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const model::CostModel> model, models_.ById(row.cost_model_id));
  task->strategy = search::MakeMcfuserSearch(SearchOptions(*task, std::move(model)));
  RETURN_IF_ERROR(task->strategy->Initialize({&task->chain, task->target, row.budget}));
  ASSIGN_OR_RETURN(std::vector<db::JobRow> jobs, db_->JobsOfTask(row.id));
  for (const db::JobRow& j : jobs) {
    if (j.kind == JobKind::kBaseline) task->baseline_jobs.push_back(j.id);
    if (j.kind == JobKind::kConfirm) task->confirm_jobs.push_back(j.id);
  }
  task->started = StartedOf(row);
  task->progress.budget = row.budget;
  Task* raw = task.get();
  tasks_[row.id] = std::move(task);
  return raw;
}

void Scheduler::TrainCostModels() {
  std::set<std::string> wanted;
  {
    std::lock_guard<std::mutex> lock(train_mu_);
    wanted.swap(train_wanted_);
  }
  for (const std::string& fp : wanted) {
    absl::StatusOr<hw::TargetDesc> target = TargetOf(fp);
    absl::StatusOr<std::string> did = target.ok() ? models_.MaybeTrain(fp, *target) : target.status();
    if (!did.ok()) {
      Log()->error("[target={}] training the learned cost model failed: {}", fp, did.status().ToString());
    } else if (!did->empty()) {
      Log()->info("[target={}] learned cost model: {}", fp, *did);
    }
  }
}

absl::Status Scheduler::ResumeTasks() {
  ASSIGN_OR_RETURN(std::vector<db::TaskRow> running, db_->ListTasksInState(TaskState::kRunning));
  std::lock_guard<std::mutex> lock(mu_);
  for (const db::TaskRow& row : running) {
    auto task = LoadTask(row);
    if (!task.ok()) {
      Log()->error("[task={}] cannot resume: {}", row.id, task.status().ToString());
      RETURN_IF_ERROR(db_->FinishTask(row.id, TaskState::kFailed,
                                      absl::StrCat("could not resume: ", task.status().message()), NowMs()));
      continue;
    }
    // Replays the strategy against what the database already holds.
    RETURN_IF_ERROR(RefreshProgress(**task));
    RETURN_IF_ERROR(Advance(**task));
    Log()->info("[task={}] resumed: {} of {} candidates measured", row.id, (*task)->progress.measured, row.budget);
  }
  return absl::OkStatus();
}

void Scheduler::ReaperLoop() {
  while (!stop_) {
    {
      std::unique_lock<std::mutex> lock(reaper_mu_);
      reaper_cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.reaper_interval), [this] { return stop_.load(); });
    }
    if (stop_) break;
    TrainCostModels();
    const int64_t now = NowMs();
    auto touched = db_->ExpireLeases(now, options_.max_attempts);
    if (!touched.ok()) {
      Log()->error("expiring leases failed: {}", touched.status().ToString());
      continue;
    }
    if (!touched->empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      std::set<std::string> ids(touched->begin(), touched->end());
      for (const std::string& id : ids) {
        Log()->warn("[task={}] a lease expired; its job went back to the queue (or failed after {} attempts)", id,
                    options_.max_attempts);
        auto it = tasks_.find(id);
        if (it == tasks_.end()) continue;
        absl::Status st = RefreshProgress(*it->second);
        if (st.ok()) st = Advance(*it->second);
        if (!st.ok()) Log()->error("[task={}] {}", id, st.ToString());
      }
      lease_cv_.notify_all();
    }
    // Workers heard from since the cutoff, whether or not the database could
    // record it (a full disk), are not lost.
    const int64_t cutoff = now - absl::ToInt64Milliseconds(options_.worker_timeout);
    std::set<std::string> heard;
    {
      std::lock_guard<std::mutex> lock(contact_mu_);
      for (auto it = contact_ms_.begin(); it != contact_ms_.end();) {
        if (it->second < cutoff) {
          it = contact_ms_.erase(it);
        } else {
          heard.insert((it++)->first);
        }
      }
    }
    auto lost = db_->MarkLostWorkers(cutoff, heard);
    if (lost.ok() && *lost > 0) {
      targets_generation_++;
      Log()->warn("{} worker(s) went silent and are marked lost", *lost);
    }
  }
}

}  // namespace fusor::server
