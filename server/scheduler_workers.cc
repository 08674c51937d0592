// Workers (scheduler_task.h): registration, tokens, heartbeats, leases
// and reports.
#include "server/scheduler_task.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/model/cost_model.h"
#include "common/space/schedule.h"
#include "common/util/log.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "common/util/text.h"
#include "common/util/timing.h"
#include "proto/wire/convert.h"
#include "worker/backend.h"

namespace fusor::server {

using db::JobState;
using db::MeasurementStatus;
using db::TaskState;

absl::StatusOr<Registration> Scheduler::Register(const std::string& name, const hw::TargetDesc& desc) {
  if (desc.compute_units <= 0) return absl::InvalidArgumentError("register: target.compute_units must be positive");
  if (absl::Status st = name.empty() ? absl::OkStatus() : CheckName(name, "worker"); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("register: ", st.message()));
  }
  // What the target says of itself is listed and logged: bounded, and
  // printable (no line breaks or terminal escapes).
  if (desc.isa_features.size() > 64) return absl::InvalidArgumentError("register: more than 64 target.isa_features");
  std::vector<std::string> texts = {desc.arch, desc.device_name, desc.compiler};
  texts.insert(texts.end(), desc.isa_features.begin(), desc.isa_features.end());
  for (const std::string& text : texts) {
    if (absl::Status st = CheckLabel(text, "target field"); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("register: ", st.message()));
    }
  }
  const std::string fingerprint = hw::TargetFingerprint(desc);
  ASSIGN_OR_RETURN(std::string json, wire::TargetToJson(desc));
  const int64_t now = NowMs();
  RETURN_IF_ERROR(db_->UpsertTarget({fingerprint, worker::BackendFor(desc.backend).name(), json, now}, now));
  std::random_device random;
  std::string secret;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&secret, absl::Hex(random(), absl::kZeroPad8));
  db::WorkerRow w;
  w.id = NewId("w-");
  w.secret_hash = Sha256Hex(secret);
  w.name = name.empty() ? w.id : name;
  w.target_fp = fingerprint;
  w.state = db::WorkerState::kAlive;
  w.registered_ms = now;
  w.last_seen_ms = now;
  RETURN_IF_ERROR(db_->InsertWorker(w));
  targets_generation_++;
  Log()->info("[worker={}] registered '{}' with target {} ({}, {} units, W={:.1f} GB/s, P={:.1f} GFLOP/s)", w.id,
              w.name, w.target_fp, desc.arch, desc.compute_units, desc.bandwidth_bytes_per_s / 1e9,
              desc.peak_flops / 1e9);
  return Registration{{w.id, secret}, w.target_fp};
}

absl::StatusOr<db::WorkerRow> Scheduler::Authenticate(const std::string& worker_id, const std::string& secret,
                                                     absl::string_view call) {
  ASSIGN_OR_RETURN(db::WorkerRow worker, db_->GetWorker(worker_id));
  // Compares hashes: the time taken tells nothing about the secret.
  const std::string hash = Sha256Hex(secret);
  unsigned char diff = hash.size() != worker.secret_hash.size();
  for (size_t i = 0; i < hash.size() && i < worker.secret_hash.size(); ++i) diff |= hash[i] ^ worker.secret_hash[i];
  if (diff != 0 || secret.empty()) {
    Log()->warn("[worker={}] {} refused: the worker secret does not match its registration", Echo(worker_id),
                std::string(call));
    return absl::PermissionDeniedError(absl::StrCat(
        call, ": the worker secret does not match the registration of worker ", Echo(worker_id),
        "; a worker acts only under the id and secret its own Register returned (register again)"));
  }
  {
    // Heard from, even where the database cannot record it (a full disk):
    // the reaper marks no worker lost that called since its cutoff.
    std::lock_guard<std::mutex> lock(contact_mu_);
    contact_ms_[worker_id] = NowMs();
  }
  return worker;
}

absl::StatusOr<bool> Scheduler::Heartbeat(const WorkerCredentials& who, const std::vector<std::string>& lease_ids) {
  const int64_t now = NowMs();
  auto worker = Authenticate(who.worker_id, who.secret, "heartbeat");
  if (absl::IsNotFound(worker.status())) return false;
  RETURN_IF_ERROR(worker.status());
  RETURN_IF_ERROR(db_->TouchWorker(who.worker_id, now));
  if (worker->state != db::WorkerState::kAlive) targets_generation_++;  // back from lost
  RETURN_IF_ERROR(db_->ExtendLeases(who.worker_id, lease_ids, now + absl::ToInt64Milliseconds(options_.lease)));
  return true;
}

absl::StatusOr<std::vector<LeasedJob>> Scheduler::Lease(const WorkerCredentials& who, int max_jobs,
                                                        absl::Duration wait, const std::function<bool()>& cancelled) {
  ASSIGN_OR_RETURN(db::WorkerRow worker, Authenticate(who.worker_id, who.secret, "lease"));
  RETURN_IF_ERROR(db_->TouchWorker(worker.id, NowMs()));
  if (worker.state != db::WorkerState::kAlive) targets_generation_++;  // back from lost
  max_jobs = std::clamp(max_jobs, 1, 16);
  const auto deadline = std::chrono::steady_clock::now() +
                        absl::ToChronoMilliseconds(std::clamp(wait, absl::ZeroDuration(), absl::Seconds(10)));
  std::vector<LeasedJob> leased;
  while (true) {
    const int64_t now = NowMs();
    ASSIGN_OR_RETURN(std::vector<db::JobRow> jobs,
                     db_->LeaseJobs(worker.id, worker.target_fp, max_jobs, now,
                                    now + absl::ToInt64Milliseconds(options_.lease), [this] { return NewId("l-"); }));
    if (!jobs.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const db::JobRow& j : jobs) {
        auto it = tasks_.find(j.task_id);
        if (it == tasks_.end() || it->second->row.state != TaskState::kRunning) {
          // Not expected (finishing a task fails its open jobs): drop it.
          Log()->error("[task={} job={}] leased a job of a task that is not running; failing it", j.task_id, j.id);
          RETURN_IF_ERROR(db_->FailOpenJobs(j.task_id, NowMs()));
          continue;
        }
        LeasedJob& job = leased.emplace_back(LeasedJob{j, it->second->chain, std::nullopt});
        if (j.candidate_id) {
          ASSIGN_OR_RETURN(job.candidate, db_->GetCandidate(*j.candidate_id));
        }
        if (j.attempts == 1) queue_wait_.Observe(std::string(db::Name(j.kind)), (now - j.created_ms) / 1e3);
        Log()->debug("[task={} job={} worker={}] leased ({}, attempt {})", j.task_id, j.id, worker.id,
                     std::string(db::Name(j.kind)), j.attempts);
      }
      if (!leased.empty()) return leased;
    }
    if (std::chrono::steady_clock::now() >= deadline || (cancelled && cancelled()) || stop_) return leased;
    std::unique_lock<std::mutex> lock(mu_);
    lease_cv_.wait_for(lock, std::min<std::chrono::steady_clock::duration>(
                                 deadline - std::chrono::steady_clock::now(), std::chrono::milliseconds(200)));
  }
}

absl::StatusOr<ReportReceipt> Scheduler::Report(const JobReport& report) {
  const std::string& worker_id = report.worker.worker_id;
  RETURN_IF_ERROR(Authenticate(worker_id, report.worker.secret, "report").status());
  ASSIGN_OR_RETURN(db::JobRow job, db_->GetJob(report.job_id));
  ASSIGN_OR_RETURN(db::TaskRow task_row, db_->GetTask(job.task_id));
  db::MeasurementRow m = report.measurement;
  m.job_id = job.id;
  m.workload_key = task_row.workload_key;
  m.worker_id = worker_id;
  // The spread from the samples themselves, whatever the worker says: an
  // ok measurement beyond the bound is noisy (an older worker's, say).
  const SampleStats stats = Summarize(m.samples_s);
  m.spread = stats.spread;
  m.measured_ms = NowMs();
  if (m.status == MeasurementStatus::kOk && (m.samples_s.empty() || m.median_s <= 0)) {
    return absl::InvalidArgumentError("report: an ok measurement needs samples and a positive median");
  }
  const bool timed = m.status == MeasurementStatus::kOk || m.status == MeasurementStatus::kNoisy;
  if (timed && !m.samples_s.empty() && !(std::abs(m.median_s - stats.median) <= 1e-9 * stats.median)) {
    return absl::InvalidArgumentError(absl::StrCat("report: the median ", m.median_s, " s is not the median of the ",
                                                   m.samples_s.size(), " samples reported (", stats.median,
                                                   " s); nothing was recorded"));
  }
  // A time below what the chain needs on any such device is no measurement
  // (a broken or forged report): recorded as an invalid result, so that it
  // is never the best, and counted against the worker.
  std::string implausible;
  if (timed) {
    const double floor_s = ImplausibleBelowS(job.task_id);
    if (m.median_s < floor_s) {
      implausible = absl::StrCat("implausible: a median of ", m.median_s, " s is under ", floor_s,
                                 " s, the least the chain can take on this target (the FLOPs of its cheapest "
                                 "regrouping at the most any such device computes, or its bytes beyond the caches at "
                                 "the most any moves)");
      m.status = MeasurementStatus::kInvalidResult;
      m.error = implausible;
    }
  }
  if (m.status == MeasurementStatus::kOk && m.spread > options_.measure.max_spread) {
    m.status = MeasurementStatus::kNoisy;
    m.error = absl::StrCat("the samples' spread (p90 - p10) / median is ", m.spread, " (at most ",
                           options_.measure.max_spread, " is trusted)");
  }
  ASSIGN_OR_RETURN(db::RecordResult rec, db_->RecordMeasurement(report.lease_id, m));
  if (rec.outcome == db::ReportOutcome::kDuplicate) {
    Log()->info("[task={} job={}] duplicate report from {} ignored", job.task_id, job.id, worker_id);
    return ReportReceipt::kDuplicate;
  }
  if (rec.outcome == db::ReportOutcome::kNotYourLease) {
    Log()->warn("[task={} job={}] report from worker {} refused: the lease is worker {}'s", job.task_id, job.id,
                worker_id, rec.job.worker_id);
    return absl::PermissionDeniedError(absl::StrCat("report: lease ", report.lease_id, " of job ", job.id,
                                                    " is held by worker ", rec.job.worker_id, ", not by worker ",
                                                    worker_id, "; nothing was recorded"));
  }
  if (rec.outcome == db::ReportOutcome::kStaleLease) {
    return absl::FailedPreconditionError(absl::StrCat(
        "report: lease ", report.lease_id, " of job ", job.id, " is no longer valid: ",
        rec.job.state == JobState::kQueued ? "it expired and the job was requeued"
        : Finished(rec.job.state)          ? "the job was finished under another lease"
                                           : absl::StrCat("the job is under another lease now (worker ",
                                                          rec.job.worker_id, "'s)"),
        "; nothing was recorded"));
  }
  if (job.leased_ms > 0) job_duration_.Observe(std::string(db::Name(job.kind)), (m.measured_ms - job.leased_ms) / 1e3);
  if (!implausible.empty()) {
    {
      std::lock_guard<std::mutex> lock(implausible_mu_);
      ++implausible_[worker_id];
    }
    Log()->warn("[task={} job={} worker={}] {} report refused: {}", job.task_id, job.id, worker_id,
                std::string(db::Name(job.kind)), implausible);
  }
  const bool ok = m.status == MeasurementStatus::kOk;
  Log()->info("[task={} job={} worker={}] {} {}: {}{}", job.task_id, job.id, worker_id,
              std::string(db::Name(job.kind)), std::string(db::Name(m.status)),
              ok ? absl::StrCat(m.median_s * 1e3, " ms") : m.error.substr(0, 200),
              ok ? absl::StrCat(" (", m.samples_s.size(), " samples)") : "");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tasks_.find(job.task_id);
  if (it != tasks_.end()) {
    RETURN_IF_ERROR(RefreshProgress(*it->second));
    RETURN_IF_ERROR(Advance(*it->second));
  }
  if (!implausible.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("report: ", implausible, "; recorded as an invalid result"));
  }
  return ReportReceipt::kRecorded;
}

double Scheduler::ImplausibleBelowS(const std::string& task_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tasks_.find(task_id);
  if (it == tasks_.end()) return 0;
  Task& task = *it->second;
  if (!task.floor_s) task.floor_s = model::PhysicalFloorS(task.chain, task.target);  // once: it tries each regrouping
  return *task.floor_s;
}

std::map<std::string, int64_t> Scheduler::ImplausibleReports() {
  std::lock_guard<std::mutex> lock(implausible_mu_);
  return implausible_;
}

}  // namespace fusor::server
