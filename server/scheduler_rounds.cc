// A task's rounds (scheduler_task.h): progress, the search's next
// candidates, the confirmation runs queued, and the unfused baselines
// measured beside the candidates.
#include "server/scheduler_task.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/model/cost_model.h"
#include "common/space/schedule.h"
#include "common/space/split.h"
#include "common/util/status_macros.h"
#include "common/util/timing.h"
#include "worker/backend.h"

namespace fusor::server {

using db::JobKind;
using db::JobState;
using db::MeasurementStatus;
using db::TaskState;

namespace {

// What a baseline measurement ran, from its resources ({"baseline": ...}).
std::string BaselineKind(const std::string& resources_json) {
  const nlohmann::json j = nlohmann::json::parse(resources_json, nullptr, false);
  return j.is_object() && j.contains("baseline") && j["baseline"].is_string() ? j["baseline"].get<std::string>() : "";
}

// The baseline a CPU worker timed together with a confirmation (see
// worker/job.h), when its samples are there and within `max_spread`.
std::optional<std::pair<std::string, std::vector<double>>> BaselineBeside(const std::string& resources_json,
                                                                          double max_spread) {
  const nlohmann::json j = nlohmann::json::parse(resources_json, nullptr, false);
  if (!j.is_object() || !j.contains("beside") || !j["beside"].is_object()) return std::nullopt;
  const nlohmann::json& b = j["beside"];
  if (!b.contains("baseline") || !b["baseline"].is_string() || !b.contains("samples_s") || !b["samples_s"].is_array()) {
    return std::nullopt;
  }
  std::vector<double> samples;
  for (const nlohmann::json& x : b["samples_s"]) {
    if (!x.is_number() || !(x.get<double>() > 0)) return std::nullopt;
    samples.push_back(x.get<double>());
  }
  if (static_cast<int>(samples.size()) < kMinSamples || Summarize(samples).spread > max_spread) return std::nullopt;
  return std::make_pair(b["baseline"].get<std::string>(), std::move(samples));
}

// Of `rows`, the trusted measurement taken nearest `ms` (the later one of
// two as near); nullptr when none is trusted.
const db::MeasurementRow* NearestTrusted(const std::vector<db::MeasurementRow>& rows, int64_t ms) {
  const db::MeasurementRow* nearest = nullptr;
  for (const db::MeasurementRow& m : rows) {
    if (m.status != MeasurementStatus::kOk) continue;
    if (nearest == nullptr || std::abs(m.measured_ms - ms) <= std::abs(nearest->measured_ms - ms)) nearest = &m;
  }
  return nearest;
}

}  // namespace

absl::Status Scheduler::RefreshProgress(Task& task) {
  ASSIGN_OR_RETURN(std::vector<db::MeasurementRow> rows, db_->MeasurementsOfTask(task.row.id));
  int measured = 0, failed = 0;
  const db::MeasurementRow* best = nullptr;
  int noisy = 0;
  for (const db::MeasurementRow& m : rows) {
    if (m.kind != JobKind::kCandidate) continue;
    ++measured;
    noisy += m.status == MeasurementStatus::kNoisy;
    if (m.status != MeasurementStatus::kOk) {
      ++failed;
    } else if (best == nullptr || m.median_s < best->median_s) {
      best = &m;
    }
  }
  TuneProgress p{measured, failed, noisy, task.row.budget, 0, ""};
  if (best) {
    p.best_s = best->median_s;
    ASSIGN_OR_RETURN(db::CandidateRow c, db_->GetCandidate(*best->candidate_id));
    p.best_schedule = c.schedule;
  }
  if (!(p == task.progress)) {
    task.progress = p;
    ++task.version;
    task_cv_.notify_all();
  }
  return absl::OkStatus();
}

absl::Status Scheduler::Advance(Task& task) {
  if (task.row.state != TaskState::kRunning) return absl::OkStatus();
  while (true) {
    if (!task.batch.empty()) {
      ASSIGN_OR_RETURN(std::vector<db::JobRow> jobs, db_->JobsOfTask(task.row.id));
      std::map<int64_t, const db::JobRow*> by_candidate;
      for (const db::JobRow& j : jobs) {
        if (j.candidate_id && j.kind == JobKind::kCandidate) by_candidate[*j.candidate_id] = &j;
      }
      for (const db::CandidateRow& c : task.batch) {
        auto it = by_candidate.find(c.id);
        if (it == by_candidate.end() || !Finished(it->second->state)) return absl::OkStatus();
      }
      ASSIGN_OR_RETURN(std::vector<db::MeasurementRow> rows, db_->MeasurementsOfTask(task.row.id));
      std::vector<search::MeasuredResult> results;
      for (const db::CandidateRow& c : task.batch) {
        search::MeasuredResult r;
        r.schedule_text = c.schedule;
        for (const db::MeasurementRow& m : rows) {
          if (m.candidate_id == c.id && m.kind == JobKind::kCandidate) {
            r.ok = m.status == MeasurementStatus::kOk;
            r.median_s = m.median_s;
          }
        }
        results.push_back(r);
      }
      task.strategy->NotifyResults(results);
      task.batch.clear();
    }
    if (task.strategy->Done() || task.issued >= task.row.budget) break;
    std::vector<search::CandidateSpec> specs =
        task.strategy->NextBatch(std::min(task.row.batch_size, task.row.budget - task.issued));
    if (specs.empty()) break;
    const int64_t now = NowMs();
    for (const search::CandidateSpec& spec : specs) {
      db::CandidateRow c;
      c.task_id = task.row.id;
      c.schedule = spec.schedule_text;
      c.mapping = spec.mapping;
      c.t_mem_s = spec.prediction.t_mem_s;
      c.t_comp_s = spec.prediction.t_comp_s;
      c.alpha = spec.prediction.alpha;
      c.t_estm_s = spec.prediction.t_estm_s;
      c.rank = task.issued++;
      ASSIGN_OR_RETURN(auto inserted, db_->FindOrInsertCandidate(c, NewId("j-"), now));
      task.batch.push_back(inserted.first);
    }
    lease_cv_.notify_all();
  }
  // Nothing more to propose: the best measured again (by another worker of
  // the target where there is one), with a baseline beside it; again while
  // no trusted run agrees with it (a contradicted one gives way to the next
  // fastest), up to kConfirmAttempts runs; then finish.
  std::vector<std::string> waiting = task.baseline_jobs;
  waiting.insert(waiting.end(), task.confirm_jobs.begin(), task.confirm_jobs.end());
  for (const std::string& id : waiting) {
    ASSIGN_OR_RETURN(db::JobRow job, db_->GetJob(id));
    if (!Finished(job.state)) return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::vector<db::MeasurementRow> rows, db_->MeasurementsOfTask(task.row.id));
  const db::BestOfTask best = db::FindBest(rows, options_.measure.max_spread);
  if (best.candidate != nullptr && best.confirmation == nullptr && task.confirm_jobs.size() < kConfirmAttempts) {
    const int64_t now = NowMs();
    db::JobRow job;
    job.id = NewId("j-");
    job.task_id = task.row.id;
    job.kind = JobKind::kConfirm;
    job.candidate_id = best.candidate->candidate_id;
    job.target_fp = task.row.target_fp;
    job.state = JobState::kQueued;
    // Measured again elsewhere, where another worker of the target is
    // there: one worker's numbers alone never make the best.
    job.not_worker = best.candidate->worker_id;
    RETURN_IF_ERROR(db_->InsertJob(job, now));
    task.confirm_jobs.push_back(job.id);
    // A CPU worker times the baseline together with the confirmation; a
    // GPU's is a job of its own, beside it.
    if (task.target.backend != hw::Backend::kCpu && task.baseline_jobs.size() <= task.confirm_jobs.size()) {
      RETURN_IF_ERROR(QueueBaseline(task, now));
    }
    lease_cv_.notify_all();
    return absl::OkStatus();
  }
  return Finalize(task, rows);
}

search::McfuserSearchOptions Scheduler::SearchOptions(const Task& task,
                                                     std::shared_ptr<const model::CostModel> model) const {
  search::McfuserSearchOptions o;
  o.cost_model = std::move(model);
  // A CPU answer may call a library: there the chain split in two parts is
  // a candidate too. An f16 or bf16 part would round the tensors handed on.
  constexpr int kSplitCandidates = 3;
  if (options_.unfused_answers && task.target.backend == hw::Backend::kCpu && task.chain.dtype == ir::DType::kF32) {
    o.split_candidates = kSplitCandidates;
  }
  // A transferred schedule is measured first (tasks.seeds).
  if (!task.row.seeds.empty()) {
    const nlohmann::json seeds = nlohmann::json::parse(task.row.seeds, nullptr, false);
    if (seeds.is_array()) {
      for (const nlohmann::json& seed : seeds) {
        if (seed.is_string()) o.seeds.push_back(seed.get<std::string>());
      }
    }
  }
  return o;
}

absl::Status Scheduler::QueueBaseline(Task& task, int64_t now_ms) {
  db::JobRow job;
  job.id = NewId("j-");
  job.task_id = task.row.id;
  job.kind = JobKind::kBaseline;
  job.target_fp = task.row.target_fp;
  job.state = JobState::kQueued;
  RETURN_IF_ERROR(db_->InsertJob(job, now_ms));
  task.baseline_jobs.push_back(job.id);
  return absl::OkStatus();
}

absl::Status Scheduler::SetBaselineOfTask(const std::string& task_id, const db::MeasurementRow& best,
                                          TuneResult& r) {
  ASSIGN_OR_RETURN(std::vector<db::MeasurementRow> rows, db_->MeasurementsOfTask(task_id, JobKind::kBaseline));
  BaselineResult& baseline = r.baseline;
  std::vector<const db::MeasurementRow*> trusted;
  int noisy = 0;
  for (const db::MeasurementRow& m : rows) {
    if (m.status == MeasurementStatus::kNoisy) ++noisy;
    if (m.status == MeasurementStatus::kOk) trusted.push_back(&m);
  }
  // A confirmation is compared with the baseline timed together with it,
  // else with the one measured nearest it (the machine's speed drifts over
  // a task); anything else with all of them.
  auto beside = best.kind == JobKind::kConfirm ? BaselineBeside(best.resources_json, options_.measure.max_spread)
                                               : std::nullopt;
  if (beside) {
    baseline.samples_s = beside->second;
    baseline.kind = beside->first;
  } else {
    if (best.kind == JobKind::kConfirm && !trusted.empty()) trusted = {NearestTrusted(rows, best.measured_ms)};
    for (const db::MeasurementRow* m : trusted) {
      baseline.samples_s.insert(baseline.samples_s.end(), m->samples_s.begin(), m->samples_s.end());
      if (baseline.kind.empty()) baseline.kind = BaselineKind(m->resources_json);
    }
  }
  if (baseline.samples_s.empty()) {
    if (noisy > 0) baseline.status = MeasurementStatus::kNoisy;
    return absl::OkStatus();
  }
  const SampleStats stats = Summarize(baseline.samples_s);
  baseline.status = MeasurementStatus::kOk;
  baseline.median_s = stats.median;
  baseline.spread = stats.spread;
  if (best.status == MeasurementStatus::kOk && best.median_s > 0) r.speedup = stats.median / best.median_s;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<db::BestRow>> Scheduler::UnfusedBest(const Task& task, const db::MeasurementRow& best) {
  // The unfused chain is built at one size: no answer for a range of them.
  if (!options_.unfused_answers || task.target.backend != hw::Backend::kCpu || !task.chain.RangedDims().empty()) {
    return std::nullopt;
  }
  std::string vendor;
  double median_s = 0;
  int64_t measurement_id = 0;
  auto beside = best.kind == JobKind::kConfirm ? BaselineBeside(best.resources_json, options_.measure.max_spread)
                                               : std::nullopt;
  if (beside) {
    vendor = beside->first;
    median_s = Summarize(beside->second).median;
    measurement_id = best.id;
  } else {
    ASSIGN_OR_RETURN(std::vector<db::MeasurementRow> rows, db_->MeasurementsOfTask(task.row.id, JobKind::kBaseline));
    const db::MeasurementRow* nearest = NearestTrusted(rows, best.measured_ms);
    if (nearest == nullptr) return std::nullopt;
    vendor = BaselineKind(nearest->resources_json);
    median_s = nearest->median_s;
    measurement_id = nearest->id;
  }
  if (vendor.empty() || !(median_s > 0 && median_s < best.median_s)) return std::nullopt;
  db::CandidateRow c;
  c.task_id = task.row.id;
  c.schedule = absl::StrCat(space::kUnfusedPrefix, vendor);
  c.rank = -1;  // no model ranked it: it is always measured
  ASSIGN_OR_RETURN(db::CandidateRow row, db_->FindOrInsertUnqueuedCandidate(c));
  return db::BestRow{task.row.id, row.id, measurement_id, median_s};
}

absl::Status Scheduler::SetUnfusedResult(const db::MeasurementRow& meas, const std::string& vendor, TuneResult& r) {
  if (meas.kind == JobKind::kConfirm) {
    // Timed beside the fused kernel's confirmation: that measurement's
    // samples are the fused kernel's, the baseline's are in its resources
    // (trusted when it became the best, whatever --max-spread is now).
    auto beside = BaselineBeside(meas.resources_json, std::numeric_limits<double>::infinity());
    if (!beside) return absl::InternalError(absl::StrCat("measurement ", meas.id, " has no trusted baseline beside it"));
    r.fused_s = meas.median_s;
    ASSIGN_OR_RETURN(db::CandidateRow cand, db_->GetCandidate(meas.candidate_id.value_or(0)));
    r.fused_schedule = cand.schedule;
    const SampleStats stats = Summarize(beside->second);
    r.measured.samples_s = beside->second;
    r.measured.median_s = stats.median;
    r.measured.spread = stats.spread;
    r.measured.max_abs_error = r.measured.max_rel_error = 0;  // validated, its errors not kept
  } else {
    // Its own baseline measurement: the fused kernel it beat is the task's
    // trusted confirmation, else its fastest trusted candidate.
    ASSIGN_OR_RETURN(std::vector<db::MeasurementRow> rows, db_->MeasurementsOfTask(meas.task_id));
    const db::MeasurementRow *fused = nullptr, *fastest = nullptr;
    for (const db::MeasurementRow& m : rows) {
      if (m.status != MeasurementStatus::kOk || !m.candidate_id) continue;
      if (m.kind == JobKind::kConfirm) fused = &m;
      if (m.kind == JobKind::kCandidate && (fastest == nullptr || m.median_s < fastest->median_s)) fastest = &m;
    }
    if (fused == nullptr) fused = fastest;
    if (fused != nullptr) {
      r.fused_s = fused->median_s;
      ASSIGN_OR_RETURN(db::CandidateRow cand, db_->GetCandidate(*fused->candidate_id));
      r.fused_schedule = cand.schedule;
    }
  }
  r.baseline.status = MeasurementStatus::kOk;
  r.baseline.samples_s = r.measured.samples_s;
  r.baseline.median_s = r.measured.median_s;
  r.baseline.spread = r.measured.spread;
  r.baseline.kind = vendor;
  r.speedup = 1;
  return absl::OkStatus();
}

}  // namespace fusor::server
