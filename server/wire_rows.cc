#include "server/wire_rows.h"

#include "absl/strings/str_cat.h"
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

absl::StatusOr<TargetSelector> TargetSelectorFromProto(const v1::TargetSelector& p) {
  TargetSelector s{std::nullopt, p.fingerprint(), p.arch()};
  switch (p.backend()) {
    case v1::BACKEND_UNSPECIFIED: break;
    case v1::BACKEND_CPU: s.backend = hw::Backend::kCpu; break;
    case v1::BACKEND_CUDA: s.backend = hw::Backend::kCuda; break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("target.backend ", static_cast<int>(p.backend()), " is not a backend this scheduler knows"));
  }
  return s;
}

TuneOptions TuneOptionsFromProto(const v1::TuneOptions& p) { return {p.budget(), p.force(), p.transfer()}; }

v1::TaskStarted TaskStartedProto(const TaskStarted& s) {
  v1::TaskStarted p;
  p.set_task_id(s.task_id);
  p.set_workload_key(s.workload_key);
  p.set_target_fingerprint(s.target_fp);
  p.set_space_size(s.space_size);
  p.set_space_after_pruning(s.space_after_pruning);
  p.set_budget(s.budget);
  return p;
}

v1::TuneProgress TuneProgressProto(const TuneProgress& s) {
  v1::TuneProgress p;
  p.set_measured(s.measured);
  p.set_failed(s.failed);
  p.set_noisy(s.noisy);
  p.set_budget(s.budget);
  p.set_best_s(s.best_s);
  p.set_best_schedule(s.best_schedule);
  return p;
}

v1::TuneResult TuneResultProto(const TuneResult& r) {
  v1::TuneResult p;
  p.set_task_id(r.task_id);
  p.set_from_cache(r.from_cache);
  p.set_workload_key(r.workload_key);
  *p.mutable_target() = TargetProto(r.target, r.target_fp);
  *p.mutable_best() = CandidateProto(r.best);
  p.mutable_best()->mutable_mapping()->set_intrinsic(r.intrinsic);
  *p.mutable_best_measurement() = MeasurementProto(r.measured);
  v1::Measurement* baseline = p.mutable_baseline();
  if (r.baseline.status) baseline->set_status(ToProto(*r.baseline.status));
  baseline->mutable_samples_s()->Add(r.baseline.samples_s.begin(), r.baseline.samples_s.end());
  baseline->set_median_s(r.baseline.median_s);
  baseline->set_spread(r.baseline.spread);
  p.set_baseline_s(r.baseline.median_s);
  p.set_baseline_kind(r.baseline.kind);
  p.set_speedup(r.speedup);
  p.set_fused_s(r.fused_s);
  p.set_fused_schedule(r.fused_schedule);
  p.set_candidates_measured(r.candidates_measured);
  p.set_candidates_failed(r.candidates_failed);
  p.set_tuning_s(r.tuning_s);
  p.set_answer(AnswerKindName(r.answer));
  p.set_validated(r.validated);
  p.set_source_key(r.source_key);
  p.set_source_chain(r.source_chain);
  p.set_served_dims(r.served_dims);
  p.set_origin(r.origin);
  return p;
}

v1::Explanation ExplanationProto(const Explanation& why) {
  v1::Explanation p;
  p.set_workload_key(why.workload_key);
  p.set_family_key(why.family_key);
  p.set_nearest_key(why.nearest_key);
  p.set_nearest_chain(why.nearest_chain);
  p.set_nearest_target(why.nearest_target_fp);
  p.set_nearest_salt(why.nearest_salt);
  for (const Difference& d : why.differences) {
    v1::Difference* q = p.add_differences();
    q->set_field(d.field);
    q->set_wanted(d.wanted);
    q->set_found(d.found);
  }
  p.set_summary(why.summary);
  return p;
}

v1::CompileResponse CompileResponseProto(const CompileResult& compiled) {
  v1::CompileResponse p;
  *p.mutable_result() = TuneResultProto(compiled.result);
  p.set_language(compiled.kernel.language);
  p.set_kernel_source(compiled.kernel.source);
  p.set_entry_point(compiled.kernel.entry_point);
  p.set_metadata_json(compiled.kernel.metadata_json);
  p.set_binary(compiled.kernel.binary);
  p.set_binary_format(compiled.kernel.binary_format);
  return p;
}

v1::TaskInfo TaskInfoProto(const TaskSnapshot& snap, const db::TaskRow& row) {
  v1::TaskInfo info;
  info.set_task_id(row.id);
  info.set_state(std::string(db::Name(snap.state)));
  info.set_workload_key(row.workload_key);
  info.set_target_fingerprint(row.target_fp);
  *info.mutable_progress() = TuneProgressProto(snap.progress);
  info.set_error(snap.error);
  info.set_created_unix_ms(row.created_ms);
  if (row.finished_ms) info.set_finished_unix_ms(*row.finished_ms);
  if (snap.result) *info.mutable_result() = TuneResultProto(*snap.result);
  return info;
}

v1::WorkerInfo WorkerInfoProto(const db::WorkerRow& w, const absl::StatusOr<hw::TargetDesc>& target) {
  v1::WorkerInfo info;
  info.set_worker_id(w.id);
  info.set_name(w.name);
  if (target.ok()) *info.mutable_target() = TargetProto(*target, w.target_fp);
  info.set_state(std::string(db::Name(w.state)));
  info.set_registered_unix_ms(w.registered_ms);
  info.set_last_seen_unix_ms(w.last_seen_ms);
  info.set_jobs_done(w.jobs_done);
  return info;
}

absl::StatusOr<SweepRequest> SweepRequestFromProto(const v1::SweepRequest& p) {
  SweepRequest r;
  r.name = p.name();
  ASSIGN_OR_RETURN(r.target, TargetSelectorFromProto(p.target()));
  r.options = TuneOptionsFromProto(p.options());
  for (const v1::SweepEntry& e : p.entries()) {
    v1::Workload workload;
    *workload.mutable_chain() = e.chain();
    r.entries.push_back(
        {e.model(), e.role(), e.source(), e.instances(), e.chain().name(), wire::ChainFromWorkload(workload)});
  }
  return r;
}

v1::SweepStarted SweepStartedProto(const SweepStarted& s) {
  v1::SweepStarted p;
  p.set_sweep_id(s.sweep_id);
  p.set_resumed(s.resumed);
  p.set_models(s.models);
  p.set_entries(s.entries);
  p.set_chains(s.chains);
  p.set_target_fingerprint(s.target_fp);
  p.set_budget(s.budget);
  return p;
}

v1::SweepProgress SweepProgressProto(const SweepProgress& s) {
  v1::SweepProgress p;
  p.set_chains(s.chains);
  p.set_done(s.done);
  p.set_cache_hits(s.cache_hits);
  p.set_tuned(s.tuned);
  p.set_failed(s.failed);
  for (const SweepChainProgress& c : s.tuning) {
    v1::SweepChainProgress* t = p.add_tuning();
    t->set_workload_key(c.workload_key);
    t->set_chain(c.chain);
    t->set_model(c.model);
    t->set_measured(c.measured);
    t->set_budget(c.budget);
  }
  p.set_elapsed_s(s.elapsed_s);
  p.set_eta_s(s.eta_s);
  return p;
}

v1::SweepReport SweepReportProto(const SweepReport& s) {
  v1::SweepReport p;
  p.set_sweep_id(s.sweep.id);
  p.set_name(s.sweep.name);
  p.set_state(std::string(db::Name(s.sweep.state)));
  *p.mutable_target() = TargetProto(s.target, s.sweep.target_fp);
  p.set_budget(s.sweep.budget);
  p.set_created_unix_ms(s.sweep.created_ms);
  if (s.sweep.finished_ms) p.set_finished_unix_ms(*s.sweep.finished_ms);
  for (const SweepChainResult& c : s.results) {
    v1::SweepChainResult* r = p.add_results();
    r->set_model(c.model);
    r->set_chain(c.chain);
    r->set_role(c.role);
    r->set_source(c.source);
    r->set_instances(c.instances);
    r->set_workload_key(c.workload_key);
    r->set_state(c.state);
    r->set_error(c.error);
    r->set_best_s(c.best_s);
    r->set_baseline_s(c.baseline_s);
    r->set_speedup(c.speedup);
    r->set_tuning_s(c.tuning_s);
    r->set_schedule(c.schedule);
    r->set_task_id(c.task_id);
    r->set_candidates_measured(c.candidates_measured);
  }
  return p;
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
