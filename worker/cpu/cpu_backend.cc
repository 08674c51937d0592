// The CPU backend: candidates are C++ compiled by the system compiler into
// shared objects, validated and timed in the job's child process.
#include <string.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/codegen/cpu/cpu_codegen.h"
#include "common/ir/reference.h"
#include "common/space/schedule.h"
#include "common/space/split.h"
#include "common/util/files.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"
#include "worker/backend.h"
#include "worker/cpu/calibration.h"
#include "worker/cpu/compiler.h"
#include "worker/cpu/cpu_target.h"
#include "worker/cpu/measure.h"

namespace fusor::worker {
namespace {

using Json = nlohmann::json;

JobOutcome CalibrateCpu(const JobSpec& spec, const std::string& dir) {
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

// The kernel of a schedule text that is not one fused kernel: the chain
// unfused through a library, or split in two parts.
absl::StatusOr<codegen::KernelSource> CompositeKernel(const ir::Chain& chain, const std::string& schedule_text,
                                                      const hw::TargetDesc& target) {
  if (space::IsSplitText(schedule_text)) return codegen::EmitCpuSplitKernel(chain, schedule_text, target);
  const std::string vendor = space::UnfusedVendor(schedule_text);
  if (const std::optional<codegen::CpuBlas> blas = codegen::CpuBlasNamed(vendor)) {
    return codegen::EmitCpuUnfusedBaseline(chain, *blas);
  }
  return absl::InvalidArgumentError(absl::StrCat("no CPU library '", vendor, "' to run the chain unfused through"));
}

// A directory of the worker's cache for jobs (spec.cache_dir), or "".
std::string CacheSubdir(const JobSpec& spec, const std::string& name) {
  return spec.cache_dir.empty() ? "" : spec.cache_dir + "/" + name;
}

// Generates the candidate's fused kernel and compiles it into `dir`; or,
// for the baseline, the unfused chain through each BLAS the machine has,
// each into its own subdirectory; a confirmation has both. dir/compiled.json
// lists what compiled: [{"name", "so_path", "entry_point"}].
JobOutcome BuildCpu(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) {
  std::vector<std::pair<std::string, absl::StatusOr<codegen::KernelSource>>> kernels;
  if (spec.kind != JobKind::kBaseline) {
    kernels.emplace_back(kFused, [&]() -> absl::StatusOr<codegen::KernelSource> {
      if (space::IsSplitText(spec.schedule_text)) return CompositeKernel(chain, spec.schedule_text, spec.target);
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
    CompileOutcome compiled = CompileKernel(*kernel, sub, spec.compiler, spec.compile_timeout_s, spec.blas_dir,
                                            CacheSubdir(spec, "preamble"), CacheSubdir(spec, "objects"));
    // A confirmation's compile record is its candidate's (0 s when the
    // worker kept the candidate's object, as it does).
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

// Validates and times what BuildCpu left in `dir`, every kernel
// together (interleaved). A baseline keeps the fastest of its BLAS
// variants, noisy if that one is (all of them named in resources_json); a
// confirmation reports the candidate, with that baseline beside it in
// resources_json.
JobOutcome RunCpu(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) {
  auto text = ReadFile(dir + "/compiled.json");
  if (!text.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(text.status().message()));
  const Json entries = Json::parse(*text, nullptr, false);
  if (!entries.is_array() || entries.empty()) return FailedOutcome(OutcomeStatus::kRuntimeError, "compiled.json is malformed");
  const int threads = std::max(1, spec.target.compute_units);
  // Every kernel is checked on the same inputs, against one reference,
  // computed once for every job on this input set of the task.
  const std::vector<std::vector<double>> inputs = RandomInputs(chain, spec.seed);
  std::optional<Outputs> expected;
  const ReferenceFn reference = [&](const std::vector<std::vector<double>>& rounded) -> absl::StatusOr<Outputs> {
    if (!expected) {
      ASSIGN_OR_RETURN(Outputs computed, CachedReference(chain, spec.seed, rounded, CacheSubdir(spec, "references")));
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
      valid = RecordValidation(ValidateKernelOn(*kernel, chain, inputs, threads, 0, reference), out);
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
  std::vector<double> prepare_s;
  auto timed = TimeKernelsTogether(kernels, chain, timing, groups, &prepare_s);
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
  // The constant inputs' packing, once, kept out of the samples.
  Json resources = Json::object();
  if (prepare_s.front() > 0) resources["prepare_s"] = prepare_s.front();
  if (spec.kind == JobKind::kConfirm) {
    resources["variants"] = medians;
    if (kept >= 0) {
      const JobOutcome& b = outs[kept];
      resources["beside"] = {{"baseline", names[kept]},
                             {"status", OutcomeStatusName(b.status)},
                             {"median_s", b.median_s},
                             {"spread", b.spread},
                             {"samples_s", b.samples_s}};
    }
  }
  if (!resources.empty()) candidate.resources_json = resources.dump();
  return candidate;
}

class Cpu final : public Backend {
 public:
  hw::Backend kind() const override { return hw::Backend::kCpu; }
  const char* name() const override { return "cpu"; }

  absl::StatusOr<hw::TargetDesc> Describe(const MachineOptions& options) const override {
    ASSIGN_OR_RETURN(TempDir dir, TempDir::Create(options.scratch_dir, "fusor-probe-"));
    return DescribeCpu(options.compiler, dir.path());
  }

  std::string Summary(const hw::TargetDesc& t) const override {
    return absl::StrFormat("CPU backend: %s (%s, %d cores, %d-lane f32 SIMD, L1d %d KiB, L2 %d KiB, L3 %d KiB); "
                           "W = %.1f GB/s, P = %.1f GFLOP/s; compiler: %s",
                           t.device_name, t.arch, t.compute_units, t.vector_lanes_f32, t.l1d_bytes / 1024,
                           t.l2_bytes / 1024, t.l3_bytes / 1024, t.bandwidth_bytes_per_s / 1e9, t.peak_flops / 1e9,
                           t.compiler);
  }

  // Compiling beside a CPU measurement would take the cores it times.
  // A round of the search is 4 jobs: they compile together, two at a
  // time on two cores, before the first is measured.
  int DefaultCompileAhead() const override { return 3; }
  bool CompilesDuringMeasurement() const override { return false; }

  JobOutcome Calibrate(const JobSpec& spec, const std::string& dir) const override { return CalibrateCpu(spec, dir); }
  JobOutcome Build(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) const override {
    return BuildCpu(spec, chain, dir);
  }
  JobOutcome Run(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) const override {
    return RunCpu(spec, chain, dir);
  }

  absl::StatusOr<KernelAnswer> Answer(const ir::Chain& chain, const space::LoopNest& nest,
                                      const std::string& schedule_text, const std::string& mapping,
                                      const hw::TargetDesc&) const override {
    ASSIGN_OR_RETURN(codegen::KernelSource kernel, codegen::EmitCpuFusedKernel(chain, nest, schedule_text, mapping));
    return AnswerOf(std::move(kernel));
  }

  absl::StatusOr<KernelAnswer> AnswerComposite(const ir::Chain& chain, const std::string& schedule_text,
                                               const hw::TargetDesc& target) const override {
    ASSIGN_OR_RETURN(codegen::KernelSource kernel, CompositeKernel(chain, schedule_text, target));
    return AnswerOf(std::move(kernel));
  }

 private:
  static KernelAnswer AnswerOf(codegen::KernelSource kernel) {
    KernelAnswer answer;
    answer.language = "c++";
    answer.source = std::move(kernel.source);
    answer.entry_point = std::move(kernel.entry_point);
    answer.metadata_json = std::move(kernel.metadata_json);
    return answer;
  }
};

}  // namespace

const Backend& CpuBackend() {
  static const Cpu backend;
  return backend;
}

}  // namespace fusor::worker
