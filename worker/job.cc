#include "worker/job.h"

#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/codegen/cpu/cpu_codegen.h"
#include "common/ir/parse.h"
#include "common/ir/reference.h"
#include "common/space/loop_nest.h"
#include "common/space/schedule.h"
#include "common/util/files.h"
#include "common/util/status_macros.h"
#include "worker/cpu/calibration.h"
#include "worker/cpu/compiler.h"
#include "worker/cuda/gpu_job.h"
#include "worker/process.h"

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

JobOutcome CalibrateCpuJob(const JobSpec& spec, const std::string& dir) {
  const codegen::KernelSource kernel = CalibrationKernel(spec.target);
  CompileOutcome compiled = CompileKernel(kernel, dir, spec.compiler, spec.compile_timeout_s, spec.blas_dir);
  if (!compiled.ok) return FailedOutcome(OutcomeStatus::kCompileError, compiled.error);
  auto loaded = LoadedKernel::Open(compiled.so_path, kernel.entry_point);
  if (!loaded.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(loaded.status().message()));
  using RateFn = double (*)(int, double);
  auto peak = reinterpret_cast<RateFn>(loaded->Symbol("fusor_peak_flops"));
  auto bandwidth = reinterpret_cast<RateFn>(loaded->Symbol("fusor_bandwidth"));
  if (peak == nullptr || bandwidth == nullptr) {
    return FailedOutcome(OutcomeStatus::kRuntimeError, "calibration kernel lacks its entry points");
  }
  JobOutcome out;
  const int threads = std::max(1, spec.target.compute_units);
  out.peak_flops = peak(threads, spec.timing.time_budget_s);
  out.bandwidth_bytes_per_s = bandwidth(threads, spec.timing.time_budget_s);
  out.status = OutcomeStatus::kOk;
  return out;
}

constexpr char kFused[] = "fused";

// Generates the candidate's fused kernel and compiles it into `dir`; or,
// for the baseline, the unfused chain through each BLAS the machine has,
// each into its own subdirectory; a confirmation has both. dir/compiled.json
// lists what compiled: [{"name", "so_path", "entry_point"}].
JobOutcome CompileCpuJob(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) {
  std::vector<std::pair<std::string, absl::StatusOr<codegen::KernelSource>>> kernels;
  if (spec.kind != JobKind::kBaseline) {
    kernels.emplace_back(kFused, [&]() -> absl::StatusOr<codegen::KernelSource> {
      ASSIGN_OR_RETURN(space::Schedule schedule, space::ParseSchedule(spec.schedule_text, chain));
      ASSIGN_OR_RETURN(space::LoopNest nest, space::BuildLoopNest(chain, schedule, spec.target));
      return codegen::EmitCpuFusedKernel(chain, nest, spec.schedule_text, spec.mapping);
    }());
  }
  if (spec.kind == JobKind::kBaseline || spec.kind == JobKind::kConfirm) {
    for (codegen::CpuBlas blas : {codegen::CpuBlas::kOpenBlas, codegen::CpuBlas::kOneDnn}) {
      kernels.emplace_back(codegen::CpuBlasName(blas), codegen::EmitCpuUnfusedBaseline(chain, blas));
    }
  }
  JobOutcome out;
  Json entries = Json::array();
  std::string errors;
  for (auto& [name, kernel] : kernels) {
    if (!kernel.ok()) return FailedOutcome(OutcomeStatus::kCompileError, std::string(kernel.status().message()));
    const std::string sub = kernels.size() == 1 ? dir : dir + "/" + name;
    if (sub != dir && mkdir(sub.c_str(), 0700) != 0 && errno != EEXIST) {
      return FailedOutcome(OutcomeStatus::kRuntimeError, absl::StrCat("cannot create ", sub, ": ", strerror(errno)));
    }
    CompileOutcome compiled = CompileKernel(*kernel, sub, spec.compiler, spec.compile_timeout_s, spec.blas_dir);
    // A confirmation's compile record is its candidate's.
    if (spec.kind != JobKind::kConfirm || name == kFused) out.compile_s += compiled.seconds;
    if (!compiled.ok) {
      // A baseline goes on with the BLAS that did compile (the machine may
      // lack oneDNN); a candidate that does not compile is an error.
      if (name == kFused) {
        JobOutcome failed = FailedOutcome(OutcomeStatus::kCompileError, compiled.error);
        failed.compile_s = out.compile_s;
        return failed;
      }
      absl::StrAppend(&errors, name, ": ", compiled.error, "\n");
      continue;
    }
    if (entries.empty()) {  // the candidate's, where there is one
      out.compile_flags = compiled.flags;
      out.code_bytes = compiled.code_bytes;
    }
    entries.push_back({{"name", name}, {"so_path", compiled.so_path}, {"entry_point", kernel->entry_point}});
  }
  if (entries.empty()) {
    out.status = OutcomeStatus::kCompileError;
    out.error = errors;
    return out;
  }
  absl::Status written = WriteFile(dir + "/compiled.json", entries.dump());
  if (!written.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(written.message()));
  out.status = OutcomeStatus::kOk;
  return out;
}

// Validates and times what CompileCpuJob left in `dir`, every kernel
// together (interleaved). A baseline keeps the fastest of its BLAS
// variants, noisy if that one is (all of them named in resources_json); a
// confirmation reports the candidate, with that baseline beside it in
// resources_json.
JobOutcome MeasureCpuJob(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) {
  auto text = ReadFile(dir + "/compiled.json");
  if (!text.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(text.status().message()));
  const Json entries = Json::parse(*text, nullptr, false);
  if (!entries.is_array() || entries.empty()) return FailedOutcome(OutcomeStatus::kRuntimeError, "compiled.json is malformed");
  const int threads = std::max(1, spec.target.compute_units);
  // Every kernel is checked on the same inputs, against one reference.
  const std::vector<std::vector<double>> inputs = RandomInputs(chain, spec.seed);
  std::optional<Outputs> expected;
  const ReferenceFn reference = [&](const std::vector<std::vector<double>>& rounded) -> absl::StatusOr<Outputs> {
    if (!expected) {
      ASSIGN_OR_RETURN(Outputs computed, ir::EvaluateReference(chain, rounded));
      expected = std::move(computed);
    }
    return *expected;
  };
  std::vector<std::string> names;
  std::vector<LoadedKernel> loaded;
  std::vector<JobOutcome> outs;
  Json medians = Json::object();  // each baseline variant's
  for (const Json& entry : entries) {
    if (!entry.is_object() || !entry.contains("so_path") || !entry.contains("entry_point") || !entry.contains("name")) {
      return FailedOutcome(OutcomeStatus::kRuntimeError, "compiled.json is malformed");
    }
    const std::string name = entry["name"].get<std::string>();
    JobOutcome out;
    auto kernel = LoadedKernel::Open(entry["so_path"].get<std::string>(), entry["entry_point"].get<std::string>());
    bool valid = false;
    if (!kernel.ok()) {
      out = FailedOutcome(OutcomeStatus::kRuntimeError, std::string(kernel.status().message()));
    } else {
      const RunFn run = [&](const void* const* in, void* const* result) { return kernel->entry()(in, result, threads); };
      valid = RecordValidation(ValidateRun(run, chain, inputs, 0, reference), out);
    }
    if (!valid) {
      // A baseline that fails fails its job; beside a confirmation, the
      // candidate is still measured without it.
      if (spec.kind != JobKind::kConfirm || name == kFused) {
        if (entries.size() > 1) out.error = absl::StrCat(name, ": ", out.error);
        return out;
      }
      medians[name] = {{"status", OutcomeStatusName(out.status)}, {"error", out.error}};
      continue;
    }
    names.push_back(name);
    loaded.push_back(std::move(*kernel));
    outs.push_back(std::move(out));
  }
  TimingOptions timing = spec.timing;
  timing.num_threads = threads;
  timing.seed = spec.seed + 1;
  std::vector<const LoadedKernel*> kernels;
  // Trusted timings are needed of the candidate and of the fastest
  // baseline variant (the baseline), not of every variant.
  std::vector<std::vector<int>> groups(2);
  for (size_t i = 0; i < loaded.size(); ++i) {
    kernels.push_back(&loaded[i]);
    groups[names[i] == kFused ? 0 : 1].push_back(static_cast<int>(i));
  }
  groups.erase(std::remove_if(groups.begin(), groups.end(), [](const auto& g) { return g.empty(); }), groups.end());
  auto timed = TimeKernelsTogether(kernels, chain, timing, groups);
  if (!timed.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(timed.status().message()));
  // The baseline: the fastest variant, trusted or not (a slower one would
  // flatter the candidate).
  int kept = -1;
  for (size_t i = 0; i < outs.size(); ++i) {
    RecordTiming((*timed)[i], outs[i]);
    if (names[i] == kFused) continue;
    medians[names[i]] = {{"median_s", outs[i].median_s}, {"status", OutcomeStatusName(outs[i].status)}};
    if (kept < 0 || outs[i].median_s < outs[kept].median_s) kept = static_cast<int>(i);
  }
  if (names.front() != kFused) {  // a baseline
    JobOutcome best = std::move(outs[kept]);
    best.resources_json = Json{{"baseline", names[kept]}, {"variants", medians}}.dump();
    return best;
  }
  JobOutcome candidate = std::move(outs.front());
  if (spec.kind == JobKind::kConfirm) {
    Json resources = {{"variants", medians}};
    if (kept >= 0) {
      const JobOutcome& b = outs[kept];
      resources["beside"] = {{"baseline", names[kept]},
                             {"status", OutcomeStatusName(b.status)},
                             {"median_s", b.median_s},
                             {"spread", b.spread},
                             {"samples_s", b.samples_s}};
    }
    candidate.resources_json = resources.dump();
  }
  return candidate;
}

JobOutcome Execute(const JobSpec& spec, const std::string& dir) {
  const bool cuda = spec.target.backend == hw::Backend::kCuda;
  if (spec.kind == JobKind::kCalibrate) return cuda ? CalibrateCudaJob(spec) : CalibrateCpuJob(spec, dir);
  auto chain = ir::ParseChainJson(spec.chain_json);
  if (!chain.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(chain.status().message()));
  const std::string& artifacts = spec.artifact_dir.empty() ? dir : spec.artifact_dir;
  JobOutcome compiled;
  if (spec.phase != JobPhase::kMeasure) {
    compiled = cuda ? CompileCudaJob(spec, *chain, artifacts) : CompileCpuJob(spec, *chain, artifacts);
    if (compiled.status != OutcomeStatus::kOk || spec.phase == JobPhase::kCompile) return compiled;
  }
  JobOutcome out = cuda ? MeasureCudaJob(spec, *chain, artifacts) : MeasureCpuJob(spec, *chain, artifacts);
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
