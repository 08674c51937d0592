#include "worker/job.h"

#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/ir/parse.h"
#include "common/util/files.h"
#include "common/util/status_macros.h"
#include "worker/backend.h"
#include "common/util/process.h"

namespace fusor::worker {
namespace {

using Json = nlohmann::json;

Json TargetToJson(const hw::TargetDesc& t) {
  return {{"backend", t.backend == hw::Backend::kCpu ? "cpu" : "cuda"},
          {"arch", t.arch},
          {"device_name", t.device_name},
          {"compute_units", t.compute_units},
          {"vector_lanes_f32", t.vector_lanes_f32},
          {"isa_features", t.isa_features},
          {"l1d_bytes", t.l1d_bytes},
          {"l2_bytes", t.l2_bytes},
          {"l3_bytes", t.l3_bytes},
          {"shared_mem_per_block", t.shared_mem_per_block},
          {"compiler", t.compiler},
          {"bandwidth_bytes_per_s", t.bandwidth_bytes_per_s},
          {"peak_flops", t.peak_flops}};
}

hw::TargetDesc TargetFromJson(const Json& j) {
  hw::TargetDesc t;
  t.backend = j.at("backend").get<std::string>() == "cuda" ? hw::Backend::kCuda : hw::Backend::kCpu;
  t.arch = j.at("arch");
  t.device_name = j.at("device_name");
  t.compute_units = j.at("compute_units");
  t.vector_lanes_f32 = j.at("vector_lanes_f32");
  t.isa_features = j.at("isa_features").get<std::vector<std::string>>();
  t.l1d_bytes = j.at("l1d_bytes");
  t.l2_bytes = j.at("l2_bytes");
  t.l3_bytes = j.at("l3_bytes");
  t.shared_mem_per_block = j.at("shared_mem_per_block");
  t.compiler = j.at("compiler");
  t.bandwidth_bytes_per_s = j.at("bandwidth_bytes_per_s");
  t.peak_flops = j.at("peak_flops");
  return t;
}

const char* KindName(JobKind k) {
  switch (k) {
    case JobKind::kCandidate: return "candidate";
    case JobKind::kBaseline: return "baseline";
    case JobKind::kCalibrate: return "calibrate";
    case JobKind::kConfirm: return "confirm";
  }
  return "?";
}

JobOutcome Execute(const JobSpec& spec, const std::string& dir) {
  const Backend& backend = BackendFor(spec.target.backend);
  if (spec.kind == JobKind::kCalibrate) return backend.Calibrate(spec, dir);
  auto chain = ir::ParseChainJson(spec.chain_json);
  if (!chain.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(chain.status().message()));
  const std::string& artifacts = spec.artifact_dir.empty() ? dir : spec.artifact_dir;
  JobOutcome compiled;
  if (spec.phase != JobPhase::kMeasure) {
    compiled = backend.Build(spec, *chain, artifacts);
    if (compiled.status != OutcomeStatus::kOk || spec.phase == JobPhase::kCompile) return compiled;
  }
  JobOutcome out = backend.Run(spec, *chain, artifacts);
  if (spec.phase == JobPhase::kAll) MergeCompileRecord(compiled, out);
  return out;
}

}  // namespace

JobOutcome FailedOutcome(OutcomeStatus status, std::string error) {
  JobOutcome o;
  o.status = status;
  o.error = std::move(error);
  return o;
}

void RecordTiming(const TrustedTiming& timing, JobOutcome& out) {
  out.samples_s = timing.samples_s;
  out.median_s = timing.median_s;
  out.spread = timing.spread;
  out.status = timing.noisy ? OutcomeStatus::kNoisy : OutcomeStatus::kOk;
  if (timing.noisy) {
    out.error = absl::StrCat("the samples' spread (p90 - p10) / median was ", timing.spread, " in the set kept of ",
                             timing.sets, "; the machine is busy");
  }
}

void MergeCompileRecord(const JobOutcome& compiled, JobOutcome& measured) {
  measured.compile_s = compiled.compile_s;
  measured.compile_flags = compiled.compile_flags;
  measured.code_bytes = compiled.code_bytes;
  // A CPU baseline's measuring names the BLAS it kept; a GPU kernel's
  // compiling records its resources.
  if (!compiled.resources_json.empty()) measured.resources_json = compiled.resources_json;
}

bool RecordValidation(const absl::StatusOr<Validation>& valid, JobOutcome& out) {
  if (!valid.ok()) {
    out.status = OutcomeStatus::kRuntimeError;
    out.error = std::string(valid.status().message());
    return false;
  }
  out.max_abs_error = valid->max_abs_error;
  out.max_rel_error = valid->max_rel_error;
  if (!valid->ok) {
    out.status = OutcomeStatus::kInvalidResult;
    out.error = valid->detail;
    return false;
  }
  return true;
}

const char* OutcomeStatusName(OutcomeStatus s) {
  switch (s) {
    case OutcomeStatus::kOk: return "ok";
    case OutcomeStatus::kCompileError: return "compile_error";
    case OutcomeStatus::kInvalidResult: return "invalid_result";
    case OutcomeStatus::kTimeout: return "timeout";
    case OutcomeStatus::kCrash: return "crash";
    case OutcomeStatus::kRuntimeError: return "runtime_error";
    case OutcomeStatus::kNoisy: return "noisy";
  }
  return "?";
}

std::string JobSpecToJson(const JobSpec& s) {
  Json j = {{"kind", KindName(s.kind)},
            {"phase", static_cast<int>(s.phase)},
            {"artifact_dir", s.artifact_dir},
            {"chain", s.chain_json},
            {"schedule", s.schedule_text},
            {"mapping", s.mapping},
            {"target", TargetToJson(s.target)},
            {"timing",
             {{"warmup", s.timing.warmup},
              {"min_repeats", s.timing.min_repeats},
              {"max_repeats", s.timing.max_repeats},
              {"time_budget_s", s.timing.time_budget_s},
              {"rotate_bytes", s.timing.rotate_bytes},
              {"max_spread", s.timing.max_spread}}},
            {"compiler", s.compiler},
            {"blas_dir", s.blas_dir},
            {"compile_timeout_s", s.compile_timeout_s},
            {"run_timeout_s", s.run_timeout_s},
            {"seed", s.seed},
            {"device", s.device}};
  return j.dump();
}

absl::StatusOr<JobSpec> JobSpecFromJson(const std::string& json) {
  Json j = Json::parse(json, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError("job spec is not JSON");
  try {
    JobSpec s;
    std::string kind = j.at("kind");
    s.kind = JobKind::kCandidate;
    for (JobKind k : {JobKind::kBaseline, JobKind::kCalibrate, JobKind::kConfirm}) {
      if (kind == KindName(k)) s.kind = k;
    }
    const int phase = j.at("phase");
    if (phase < 0 || phase > static_cast<int>(JobPhase::kMeasure)) return absl::InvalidArgumentError("job spec: bad phase");
    s.phase = static_cast<JobPhase>(phase);
    s.artifact_dir = j.at("artifact_dir");
    s.chain_json = j.at("chain");
    s.schedule_text = j.at("schedule");
    s.mapping = j.at("mapping");
    s.target = TargetFromJson(j.at("target"));
    const Json& t = j.at("timing");
    s.timing.warmup = t.at("warmup");
    s.timing.min_repeats = t.at("min_repeats");
    s.timing.max_repeats = t.at("max_repeats");
    s.timing.time_budget_s = t.at("time_budget_s");
    s.timing.rotate_bytes = t.at("rotate_bytes");
    s.timing.max_spread = t.at("max_spread");
    s.compiler = j.at("compiler");
    s.blas_dir = j.at("blas_dir");
    s.compile_timeout_s = j.at("compile_timeout_s");
    s.run_timeout_s = j.at("run_timeout_s");
    s.seed = j.at("seed");
    s.device = j.at("device");
    return s;
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", e.what()));
  }
}

std::string JobOutcomeToJson(const JobOutcome& o) {
  Json j = {{"status", OutcomeStatusName(o.status)},
            {"error", o.error},
            {"samples_s", o.samples_s},
            {"median_s", o.median_s},
            {"spread", o.spread},
            {"max_abs_error", o.max_abs_error},
            {"max_rel_error", o.max_rel_error},
            {"compile_s", o.compile_s},
            {"compile_flags", o.compile_flags},
            {"code_bytes", o.code_bytes},
            {"resources_json", o.resources_json},
            {"bandwidth_bytes_per_s", o.bandwidth_bytes_per_s},
            {"peak_flops", o.peak_flops}};
  return j.dump();
}

absl::StatusOr<JobOutcome> JobOutcomeFromJson(const std::string& json) {
  Json j = Json::parse(json, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError("job outcome is not JSON");
  try {
    JobOutcome o;
    std::string status = j.at("status");
    o.status = OutcomeStatus::kRuntimeError;
    for (OutcomeStatus s : {OutcomeStatus::kOk, OutcomeStatus::kCompileError, OutcomeStatus::kInvalidResult,
                            OutcomeStatus::kTimeout, OutcomeStatus::kCrash, OutcomeStatus::kRuntimeError,
                            OutcomeStatus::kNoisy}) {
      if (status == OutcomeStatusName(s)) o.status = s;
    }
    o.error = j.at("error");
    o.samples_s = j.at("samples_s").get<std::vector<double>>();
    o.median_s = j.at("median_s");
    o.spread = j.at("spread");
    o.max_abs_error = j.at("max_abs_error");
    o.max_rel_error = j.at("max_rel_error");
    o.compile_s = j.at("compile_s");
    o.compile_flags = j.at("compile_flags");
    o.code_bytes = j.at("code_bytes");
    o.resources_json = j.at("resources_json");
    o.bandwidth_bytes_per_s = j.at("bandwidth_bytes_per_s");
    o.peak_flops = j.at("peak_flops");
    return o;
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job outcome: ", e.what()));
  }
}

int RunJobMain(const std::string& dir) {
  // A runner outlives neither its worker nor a candidate that would hang
  // it: die with the parent (the worker kills us at the timeout anyway).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) return 1;
  auto text = ReadFile(dir + "/job.json");
  if (!text.ok()) return 2;
  auto spec = JobSpecFromJson(*text);
  // Fault injection for the tests: candidate runners die of SIGSEGV.
  if (spec.ok() && spec->kind == JobKind::kCandidate && std::getenv("FUSOR_INJECT_CANDIDATE_CRASH") != nullptr) {
    signal(SIGSEGV, SIG_DFL);
    raise(SIGSEGV);
  }
  JobOutcome outcome = spec.ok() ? Execute(*spec, dir)
                                 : FailedOutcome(OutcomeStatus::kRuntimeError, std::string(spec.status().message()));
  return WriteFile(dir + "/outcome.json", JobOutcomeToJson(outcome)).ok() ? 0 : 3;
}

JobOutcome RunJobIsolated(const JobSpec& spec, const std::string& self_exe, const std::string& scratch_dir) {
  auto dir = TempDir::Create(scratch_dir, "fusor-job-");
  if (!dir.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(dir.status().message()));
  absl::Status written = WriteFile(dir->path() + "/job.json", JobSpecToJson(spec));
  if (!written.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(written.message()));
  const std::string log = dir->path() + "/runner.log";
  const double timeout = spec.phase == JobPhase::kCompile   ? spec.compile_timeout_s
                         : spec.phase == JobPhase::kMeasure ? spec.run_timeout_s
                                                            : spec.compile_timeout_s + spec.run_timeout_s;
  auto run = RunProcess({self_exe, "__run-job", dir->path()}, log, timeout);
  if (!run.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(run.status().message()));
  if (run->timed_out) {
    return FailedOutcome(OutcomeStatus::kTimeout, absl::StrCat("killed after ", timeout, " s"));
  }
  if (run->signaled) {
    return FailedOutcome(OutcomeStatus::kCrash, absl::StrCat("runner died of signal ", run->signal, " (",
                                                    strsignal(run->signal), ")"));
  }
  auto text = ReadFile(dir->path() + "/outcome.json");
  if (!text.ok()) {
    return FailedOutcome(OutcomeStatus::kCrash, absl::StrCat("runner exited with code ", run->exit_code,
                                                    " and no outcome: ", ReadTail(log, 2000)));
  }
  auto outcome = JobOutcomeFromJson(*text);
  if (!outcome.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(outcome.status().message()));
  return *outcome;
}

}  // namespace fusor::worker
