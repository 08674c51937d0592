#include "server/wire_rows.h"

#include "common/util/status_macros.h"
#include "proto/wire/convert.h"

namespace fusor::server {

v1::JobKind ToProto(db::JobKind kind) {
  switch (kind) {
    case db::JobKind::kCandidate: return v1::JOB_KIND_CANDIDATE;
    case db::JobKind::kBaseline: return v1::JOB_KIND_BASELINE;
    case db::JobKind::kConfirm: return v1::JOB_KIND_CONFIRM;
  }
  return v1::JOB_KIND_UNSPECIFIED;
}

v1::MeasurementStatus ToProto(db::MeasurementStatus status) {
  switch (status) {
    case db::MeasurementStatus::kOk: return v1::MEASUREMENT_STATUS_OK;
    case db::MeasurementStatus::kCompileError: return v1::MEASUREMENT_STATUS_COMPILE_ERROR;
    case db::MeasurementStatus::kInvalidResult: return v1::MEASUREMENT_STATUS_INVALID_RESULT;
    case db::MeasurementStatus::kTimeout: return v1::MEASUREMENT_STATUS_TIMEOUT;
    case db::MeasurementStatus::kCrash: return v1::MEASUREMENT_STATUS_CRASH;
    case db::MeasurementStatus::kRuntimeError: return v1::MEASUREMENT_STATUS_RUNTIME_ERROR;
    case db::MeasurementStatus::kNoisy: return v1::MEASUREMENT_STATUS_NOISY;
  }
  return v1::MEASUREMENT_STATUS_UNSPECIFIED;
}

std::optional<db::MeasurementStatus> MeasurementStatusFromProto(v1::MeasurementStatus status) {
  for (db::MeasurementStatus s : db::kMeasurementStatuses) {
    if (ToProto(s) == status) return s;
  }
  return std::nullopt;
}

v1::Target TargetProto(const hw::TargetDesc& target, const std::string& fingerprint) {
  v1::Target p = wire::TargetToProto(target);
  p.set_fingerprint(fingerprint);
  return p;
}

v1::Candidate CandidateProto(const db::CandidateRow& c) {
  v1::Candidate p;
  p.set_id(c.id);
  p.mutable_schedule()->set_text(c.schedule);
  p.mutable_mapping()->set_text(c.mapping);
  p.mutable_prediction()->set_t_mem_s(c.t_mem_s);
  p.mutable_prediction()->set_t_comp_s(c.t_comp_s);
  p.mutable_prediction()->set_alpha(c.alpha);
  p.mutable_prediction()->set_t_estm_s(c.t_estm_s);
  return p;
}

v1::Measurement MeasurementProto(const db::MeasurementRow& m) {
  v1::Measurement p;
  p.set_status(ToProto(m.status));
  p.set_error(m.error);
  p.mutable_samples_s()->Add(m.samples_s.begin(), m.samples_s.end());
  p.set_median_s(m.median_s);
  p.set_spread(m.spread);
  p.mutable_compile()->set_compile_s(m.compile_s);
  p.mutable_compile()->set_compiler(m.compiler);
  p.mutable_compile()->set_flags(m.compile_flags);
  p.mutable_compile()->set_code_bytes(m.code_bytes);
  p.mutable_compile()->set_resources_json(m.resources_json);
  p.set_max_abs_error(m.max_abs_error);
  p.set_max_rel_error(m.max_rel_error);
  p.set_worker_id(m.worker_id);
  p.set_measured_at_unix_ms(m.measured_ms);
  return p;
}

absl::StatusOr<db::MeasurementRow> MeasurementFromProto(const v1::Measurement& p) {
  const std::optional<db::MeasurementStatus> status = MeasurementStatusFromProto(p.status());
  if (!status) return absl::InvalidArgumentError("report: measurement.status is required");
  db::MeasurementRow m;
  m.status = *status;
  m.error = p.error();
  m.median_s = p.median_s();
  m.samples_s.assign(p.samples_s().begin(), p.samples_s().end());
  m.max_abs_error = p.max_abs_error();
  m.max_rel_error = p.max_rel_error();
  m.compile_s = p.compile().compile_s();
  m.compile_flags = p.compile().flags();
  m.compiler = p.compile().compiler();
  m.code_bytes = p.compile().code_bytes();
  m.resources_json = p.compile().resources_json();
  return m;
}

v1::MeasureOptions MeasureOptionsProto(const MeasureOptions& o) {
  v1::MeasureOptions p;
  p.set_warmup(o.warmup);
  p.set_min_repeats(o.min_repeats);
  p.set_max_repeats(o.max_repeats);
  p.set_time_budget_s(o.time_budget_s);
  p.set_timeout_s(o.timeout_s);
  p.set_max_spread(o.max_spread);
  return p;
}

v1::Job JobProto(const LeasedJob& leased, const MeasureOptions& measure) {
  const db::JobRow& j = leased.job;
  v1::Job job;
  job.set_job_id(j.id);
  job.set_lease_id(j.lease_id);
  job.set_lease_expires_unix_ms(j.lease_expires_ms);
  job.set_task_id(j.task_id);
  job.set_kind(ToProto(j.kind));
  *job.mutable_chain() = wire::ChainToProto(leased.chain);
  *job.mutable_options() = MeasureOptionsProto(measure);
  if (leased.candidate) *job.mutable_candidate() = CandidateProto(*leased.candidate);
  return job;
}

absl::StatusOr<JobReport> JobReportFromProto(const v1::ReportRequest& request) {
  JobReport report{{request.worker_id(), request.worker_secret()}, request.job_id(), request.lease_id(), {}};
  ASSIGN_OR_RETURN(report.measurement, MeasurementFromProto(request.measurement()));
  return report;
}

}  // namespace fusor::server
