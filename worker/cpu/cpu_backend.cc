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
// each into its own subdirectory; a confirmation has both. A chain with
// ranged dims has one fused kernel for its range, and baselines at each
// size it is timed at (TimingSizes). dir/compiled.json lists what
// compiled: [{"name", "so_path", "entry_point"}, with "at": the index of
// its timing size for a baseline of a ranged chain].
JobOutcome BuildCpu(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) {
  struct Planned {
    std::string name;
    int at = -1;
    absl::StatusOr<codegen::KernelSource> kernel;
  };
  std::vector<Planned> kernels;
  if (spec.kind != JobKind::kBaseline) {
    kernels.push_back({kFused, -1, [&]() -> absl::StatusOr<codegen::KernelSource> {
      if (space::IsSplitText(spec.schedule_text)) return CompositeKernel(chain, spec.schedule_text, spec.target);
      ASSIGN_OR_RETURN(space::Schedule schedule, space::ParseSchedule(spec.schedule_text, chain));
      ASSIGN_OR_RETURN(space::LoopNest nest, space::BuildLoopNest(chain, schedule, spec.target));
      return codegen::EmitCpuFusedKernel(chain, nest, spec.schedule_text, spec.mapping);
    }()});
  }
  if (spec.kind == JobKind::kBaseline || spec.kind == JobKind::kConfirm) {
    const std::vector<std::vector<int64_t>> sizes = TimingSizes(chain);
    for (int at = sizes.empty() ? -1 : 0; at < static_cast<int>(sizes.size()); ++at) {
      absl::StatusOr<ir::Chain> exact = at < 0 ? chain : ir::AtSizes(chain, sizes[at]);
      for (codegen::CpuBlas blas : {codegen::CpuBlas::kOpenBlas, codegen::CpuBlas::kOneDnn}) {
        kernels.push_back({codegen::CpuBlasName(blas), at,
                           exact.ok() ? codegen::EmitCpuUnfusedBaseline(*exact, blas)
                                      : absl::StatusOr<codegen::KernelSource>(exact.status())});
      }
    }
  }
  JobOutcome out;
  Json entries = Json::array();
  std::string errors;
  for (Planned& planned : kernels) {
    const std::string& name = planned.name;
    if (!planned.kernel.ok()) {
      return FailedOutcome(OutcomeStatus::kCompileError, std::string(planned.kernel.status().message()));
    }
    const std::string sub = kernels.size() == 1 ? dir
                                                : absl::StrCat(dir, "/", name, planned.at >= 0 ? "@" : "",
                                                               planned.at >= 0 ? absl::StrCat(planned.at) : "");
    if (sub != dir && mkdir(sub.c_str(), 0700) != 0 && errno != EEXIST) {
      return FailedOutcome(OutcomeStatus::kRuntimeError, absl::StrCat("cannot create ", sub, ": ", strerror(errno)));
    }
    CompileOutcome compiled = CompileKernel(*planned.kernel, sub, spec.compiler, spec.compile_timeout_s, spec.blas_dir,
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
    Json entry = {{"name", name}, {"so_path", compiled.so_path}, {"entry_point", planned.kernel->entry_point}};
    if (planned.at >= 0) entry["at"] = planned.at;
    entries.push_back(std::move(entry));
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

// One variant BuildCpu left (the candidate, or one BLAS's baseline),
// loaded: one kernel for every size (at -1), or one per timing size (the
// baseline of a ranged chain, at its index).
struct Variant {
  std::string name;
  std::vector<std::pair<int, LoadedKernel>> kernels;
  JobOutcome out;
  bool broken = false;  // a kernel did not load

  const LoadedKernel* At(int size) const {
    for (const auto& [at, kernel] : kernels) {
      if (at < 0 || at == size) return &kernel;
    }
    return nullptr;
  }
};

// One size of the chain a job runs at: the chain at it, the sizes a ranged
// kernel is called with (empty for an exact chain), and its inputs and
// reference (the float64 reference of this input set, computed once for
// every job of the task).
struct RunSize {
  ir::Chain chain;
  std::vector<long> dims;
  std::vector<std::vector<double>> inputs;
  std::optional<Outputs> expected;

  ReferenceFn Reference(const JobSpec& spec) {
    return [this, &spec](const std::vector<std::vector<double>>& rounded) -> absl::StatusOr<Outputs> {
      if (!expected) {
        ASSIGN_OR_RETURN(Outputs computed, CachedReference(chain, spec.seed, rounded, CacheSubdir(spec, "references")));
        expected = std::move(computed);
      }
      return *expected;
    };
  }
};

// The chain at each of `sizes` (one per RangedDims(); {{}}: the chain as it is).
absl::StatusOr<std::vector<RunSize>> SizesOf(const ir::Chain& chain, const std::vector<std::vector<int64_t>>& sizes,
                                             uint64_t seed) {
  std::vector<RunSize> out;
  for (const std::vector<int64_t>& at : sizes) {
    RunSize size;
    ASSIGN_OR_RETURN(size.chain, at.empty() ? absl::StatusOr<ir::Chain>(chain) : ir::AtSizes(chain, at));
    size.dims.assign(at.begin(), at.end());
    size.inputs = RandomInputs(size.chain, seed);
    out.push_back(std::move(size));
  }
  return out;
}

// {"m": 64, "n": 64}: the ranged dims' sizes by name.
Json SizesJson(const ir::Chain& chain, const std::vector<long>& dims) {
  Json out = Json::object();
  const std::vector<int> ranged = chain.RangedDims();
  for (size_t i = 0; i < ranged.size() && i < dims.size(); ++i) out[chain.dims[ranged[i]].name] = dims[i];
  return out;
}

// Loads every kernel of compiled.json, by variant, and validates it: a
// kernel for every size at each of `checks`, one of a timing size at it. A
// variant that fails fails the job (its outcome in `failed`), except a
// baseline variant beside a confirmation, which is left out (said in
// `medians`).
absl::StatusOr<std::vector<Variant>> LoadAndValidate(const JobSpec& spec, const ir::Chain& ranged,
                                                     const Json& entries, std::vector<RunSize>& checks,
                                                     std::vector<RunSize>& timed, Json& medians,
                                                     std::optional<JobOutcome>& failed) {
  const int threads = std::max(1, spec.target.compute_units);
  std::vector<Variant> variants;
  for (const Json& entry : entries) {
    if (!entry.is_object() || !entry.contains("so_path") || !entry.contains("entry_point") || !entry.contains("name") ||
        entry.value("at", -1) >= static_cast<int>(timed.size())) {
      return absl::DataLossError("compiled.json is malformed");
    }
    const std::string name = entry["name"].get<std::string>();
    auto it = std::find_if(variants.begin(), variants.end(), [&](const Variant& v) { return v.name == name; });
    if (it == variants.end()) it = variants.insert(variants.end(), Variant{name, {}, {}, false});
    auto kernel = LoadedKernel::Open(entry["so_path"].get<std::string>(), entry["entry_point"].get<std::string>());
    if (!kernel.ok()) {
      it->out = FailedOutcome(OutcomeStatus::kRuntimeError, std::string(kernel.status().message()));
      it->broken = true;
      continue;
    }
    it->kernels.emplace_back(entry.value("at", -1), std::move(*kernel));
  }
  std::vector<Variant> valid;
  for (Variant& v : variants) {
    // A kernel at every timing size (a BLAS that did not compile at one has none).
    bool ok = !v.broken;
    for (size_t s = 0; s < timed.size(); ++s) ok = ok && v.At(static_cast<int>(s)) != nullptr;
    if (!ok && v.out.error.empty()) v.out = FailedOutcome(OutcomeStatus::kCompileError, "not built at every size");
    for (const auto& [at, kernel] : v.kernels) {
      if (!ok) break;
      std::vector<RunSize*> sizes;
      if (at >= 0) {
        sizes.push_back(&timed[at]);
      } else {
        for (RunSize& size : checks) sizes.push_back(&size);
      }
      for (RunSize* size : sizes) {
        // An exact kernel (a ranged chain's baseline at one size) takes no sizes.
        ok = RecordValidation(ValidateKernelOn(kernel, size->chain, size->inputs, threads, 0, size->Reference(spec),
                                               at >= 0 ? std::vector<long>{} : size->dims),
                              v.out);
        if (!ok && !size->dims.empty()) v.out.error = absl::StrCat("at ", SizesJson(ranged, size->dims).dump(), ": ",
                                                                     v.out.error);
        if (!ok) break;
      }
    }
    if (ok) {
      valid.push_back(std::move(v));
      continue;
    }
    // A baseline that fails fails its job; beside a confirmation, the
    // candidate is still measured without it.
    if (spec.kind != JobKind::kConfirm || v.name == kFused) {
      if (variants.size() > 1) v.out.error = absl::StrCat(v.name, ": ", v.out.error);
      failed = std::move(v.out);
      return valid;
    }
    medians[v.name] = {{"status", OutcomeStatusName(v.out.status)}, {"error", v.out.error}};
  }
  return valid;
}

// Per variant, its timing: at each timed size, the variants timed together
// (the candidate trusted, and the fastest baseline variant); a ranged
// chain's samples are the sums of its sizes' (one request at each), noisy
// when a size's are. `per_size` gets each size's medians.
absl::StatusOr<std::vector<TrustedTiming>> TimeAtSizes(const JobSpec& spec, const ir::Chain& ranged,
                                                       const std::vector<Variant>& variants,
                                                       std::vector<RunSize>& timed, std::vector<double>& prepare_s,
                                                       Json& per_size) {
  TimingOptions timing = spec.timing;
  timing.num_threads = std::max(1, spec.target.compute_units);
  timing.seed = spec.seed + 1;
  timing.time_budget_s /= static_cast<double>(timed.size());
  std::vector<TrustedTiming> total(variants.size());
  prepare_s.assign(variants.size(), 0);
  std::vector<std::vector<int>> groups(2);
  for (size_t i = 0; i < variants.size(); ++i) groups[variants[i].name == kFused ? 0 : 1].push_back(static_cast<int>(i));
  groups.erase(std::remove_if(groups.begin(), groups.end(), [](const auto& g) { return g.empty(); }), groups.end());
  for (size_t s = 0; s < timed.size(); ++s) {
    std::vector<const LoadedKernel*> kernels;
    std::vector<std::vector<long>> dims;
    for (const Variant& v : variants) {
      kernels.push_back(v.At(static_cast<int>(s)));
      const bool exact = v.kernels.front().first >= 0;
      dims.push_back(exact ? std::vector<long>{} : timed[s].dims);
    }
    std::vector<double> prepared;
    ASSIGN_OR_RETURN(std::vector<TrustedTiming> times,
                     TimeKernelsTogether(kernels, timed[s].chain, timing, groups, &prepared, dims));
    Json medians = Json::object();
    for (size_t i = 0; i < variants.size(); ++i) {
      prepare_s[i] = std::max(prepare_s[i], prepared[i]);
      medians[variants[i].name] = times[i].median_s;
      TrustedTiming& sum = total[i];
      if (s == 0) {
        sum = times[i];
        continue;
      }
      const size_t n = std::min(sum.samples_s.size(), times[i].samples_s.size());
      sum.samples_s.resize(n);
      for (size_t j = 0; j < n; ++j) sum.samples_s[j] += times[i].samples_s[j];
      sum.noisy = sum.noisy || times[i].noisy;
      sum.sets = std::max(sum.sets, times[i].sets);
    }
    if (!timed[s].dims.empty()) per_size.push_back({{"dims", SizesJson(ranged, timed[s].dims)}, {"median_s", medians}});
  }
  if (timed.size() > 1) {
    for (TrustedTiming& t : total) {
      const SampleStats stats = Summarize(t.samples_s);
      t.median_s = stats.median;
      t.spread = stats.spread;
      t.noisy = t.noisy || stats.spread > timing.max_spread;
    }
  }
  return total;
}

// Validates and times what BuildCpu left in `dir`, every kernel
// together (interleaved). A baseline keeps the fastest of its BLAS
// variants, noisy if that one is (all of them named in resources_json); a
// confirmation reports the candidate, with that baseline beside it in
// resources_json. A chain with ranged dims is validated at each of its
// ValidationSizes and timed at its TimingSizes (each size's medians in
// resources_json's "sizes").
JobOutcome RunCpu(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) {
  auto text = ReadFile(dir + "/compiled.json");
  if (!text.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(text.status().message()));
  const Json entries = Json::parse(*text, nullptr, false);
  if (!entries.is_array() || entries.empty()) return FailedOutcome(OutcomeStatus::kRuntimeError, "compiled.json is malformed");
  // Every kernel is checked on the same inputs, against one reference per size.
  const bool ranged = !chain.RangedDims().empty();
  auto checks = SizesOf(chain, ranged ? ValidationSizes(chain) : std::vector<std::vector<int64_t>>{{}}, spec.seed);
  auto timed = SizesOf(chain, ranged ? TimingSizes(chain) : std::vector<std::vector<int64_t>>{{}}, spec.seed);
  if (!checks.ok() || !timed.ok()) {
    return FailedOutcome(OutcomeStatus::kRuntimeError,
                         std::string((checks.ok() ? timed.status() : checks.status()).message()));
  }
  Json medians = Json::object();  // each baseline variant's
  std::optional<JobOutcome> failed;
  auto variants = LoadAndValidate(spec, chain, entries, *checks, *timed, medians, failed);
  if (!variants.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(variants.status().message()));
  if (failed) return *std::move(failed);
  std::vector<double> prepare_s;
  Json per_size = Json::array();
  auto timings = TimeAtSizes(spec, chain, *variants, *timed, prepare_s, per_size);
  if (!timings.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(timings.status().message()));
  std::vector<JobOutcome> outs;
  std::vector<std::string> names;
  for (Variant& v : *variants) {
    outs.push_back(std::move(v.out));
    names.push_back(v.name);
  }
  // The baseline: the fastest variant, trusted or not (a slower one would
  // flatter the candidate).
  int kept = -1;
  for (size_t i = 0; i < outs.size(); ++i) {
    RecordTiming((*timings)[i], outs[i]);
    if (names[i] == kFused) continue;
    medians[names[i]] = {{"median_s", outs[i].median_s}, {"status", OutcomeStatusName(outs[i].status)}};
    if (kept < 0 || outs[i].median_s < outs[kept].median_s) kept = static_cast<int>(i);
  }
  Json resources = Json::object();
  if (!per_size.empty()) resources["sizes"] = per_size;
  if (names.front() != kFused) {  // a baseline
    JobOutcome best = std::move(outs[kept]);
    resources["baseline"] = names[kept];
    resources["variants"] = medians;
    best.resources_json = resources.dump();
    return best;
  }
  JobOutcome candidate = std::move(outs.front());
  // The constant inputs' packing, once, kept out of the samples.
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
