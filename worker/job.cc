#include "worker/job.h"

#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/ir/parse.h"
#include "common/util/enum_names.h"
#include "common/util/files.h"
#include "common/util/status_macros.h"
#include "common/util/process.h"
#include "proto/wire/convert.h"
#include "worker/backend.h"

// The JSON of job.json and outcome.json: what a worker and its job child
// pass each other (both this executable), field for field.
namespace fusor {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TimingOptions, warmup, min_repeats, max_repeats, time_budget_s, num_threads, seed,
                                   rotate_bytes, max_spread, quiet_file)

namespace hw {
// The wire contract's JSON, the target's one text form.
inline void to_json(nlohmann::json& j, const TargetDesc& t) {
  absl::StatusOr<std::string> json = wire::TargetToJson(t);
  if (!json.ok()) throw std::invalid_argument(std::string(json.status().message()));
  j = nlohmann::json::parse(*json);
}
inline void from_json(const nlohmann::json& j, TargetDesc& t) {
  absl::StatusOr<TargetDesc> desc = wire::TargetFromJson(j.dump());
  if (!desc.ok()) throw std::invalid_argument(std::string(desc.status().message()));
  t = *std::move(desc);
}
}  // namespace hw

namespace worker {

// Enums by name; a name this executable does not know is an error.
template <typename E, size_t N>
void EnumToJson(nlohmann::json& j, E value, const EnumName<E> (&names)[N]) {
  j = NameIn(value, names);
}
template <typename E, size_t N>
void EnumFromJson(const nlohmann::json& j, E& value, const EnumName<E> (&names)[N]) {
  const std::string text = j.get<std::string>();
  const std::optional<E> v = ValueIn(text, names);
  if (!v) throw std::invalid_argument("unknown name '" + text + "'");
  value = *v;
}

constexpr EnumName<JobKind> kJobKinds[] = {{JobKind::kCandidate, "candidate"},
                                           {JobKind::kBaseline, "baseline"},
                                           {JobKind::kCalibrate, "calibrate"},
                                           {JobKind::kConfirm, "confirm"}};
constexpr EnumName<JobPhase> kJobPhases[] = {
    {JobPhase::kAll, "all"}, {JobPhase::kCompile, "compile"}, {JobPhase::kMeasure, "measure"}};
constexpr EnumName<OutcomeStatus> kOutcomeStatuses[] = {
    {OutcomeStatus::kOk, "ok"},
    {OutcomeStatus::kCompileError, "compile_error"},
    {OutcomeStatus::kInvalidResult, "invalid_result"},
    {OutcomeStatus::kTimeout, "timeout"},
    {OutcomeStatus::kCrash, "crash"},
    {OutcomeStatus::kRuntimeError, "runtime_error"},
    {OutcomeStatus::kNoisy, "noisy"}};

inline void to_json(nlohmann::json& j, JobKind k) { EnumToJson(j, k, kJobKinds); }
inline void from_json(const nlohmann::json& j, JobKind& k) { EnumFromJson(j, k, kJobKinds); }
inline void to_json(nlohmann::json& j, JobPhase p) { EnumToJson(j, p, kJobPhases); }
inline void from_json(const nlohmann::json& j, JobPhase& p) { EnumFromJson(j, p, kJobPhases); }
inline void to_json(nlohmann::json& j, OutcomeStatus s) { EnumToJson(j, s, kOutcomeStatuses); }
inline void from_json(const nlohmann::json& j, OutcomeStatus& s) { EnumFromJson(j, s, kOutcomeStatuses); }
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(JobSpec, kind, phase, artifact_dir, chain_json, schedule_text, mapping, target,
                                   timing, compiler, blas_dir, compile_timeout_s, run_timeout_s, seed, cache_dir,
                                   device)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(JobOutcome, status, error, samples_s, median_s, spread, max_abs_error,
                                   max_rel_error, compile_s, compile_flags, code_bytes, resources_json,
                                   bandwidth_bytes_per_s, peak_flops)

}  // namespace worker
}  // namespace fusor

namespace fusor::worker {
namespace {

using Json = nlohmann::json;

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
  const absl::string_view name = NameIn(s, kOutcomeStatuses);  // the table's literals end in NUL
  return name.empty() ? "?" : name.data();
}

absl::StatusOr<std::string> JobSpecToJson(const JobSpec& spec) {
  try {
    return Json(spec).dump();  // a path that is not UTF-8 is an error, not another path
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", e.what()));
  }
}

absl::StatusOr<JobSpec> JobSpecFromJson(const std::string& json) {
  try {
    return Json::parse(json).get<JobSpec>();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", e.what()));
  }
}

// A compiler's or a runtime's message may hold bytes that are not UTF-8:
// they are replaced, not thrown.
std::string JobOutcomeToJson(const JobOutcome& outcome) {
  return Json(outcome).dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::StatusOr<JobOutcome> JobOutcomeFromJson(const std::string& json) {
  try {
    return Json::parse(json).get<JobOutcome>();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job outcome: ", e.what()));
  }
}

int RunJobMain(const std::string& dir) {
  // A runner outlives neither its worker nor a candidate that would hang
  // it: die with the parent (the worker kills us at the timeout anyway).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) return 1;
  // The worker holds this runner's group while a request runs on a serving
  // machine: its compilers are held with it.
  KeepChildrenInMyGroup();
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
  absl::StatusOr<std::string> json = JobSpecToJson(spec);
  if (!json.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(json.status().message()));
  absl::Status written = WriteFile(dir->path() + "/job.json", *json);
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
