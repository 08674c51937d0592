// Validation and timing of a compiled CPU kernel, inside a runner process
// (the checks themselves are backend-neutral: worker/validate.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/ir/chain.h"
#include "common/util/timing.h"
#include "worker/validate.h"

namespace fusor::worker {

// A fusor_run entry point in a loaded shared object; dlclose on destruction.
class LoadedKernel {
 public:
  using EntryFn = int (*)(const void* const*, void* const*, int);
  // A kernel of a chain with ranged dims takes their sizes first.
  using DimsEntryFn = int (*)(const long*, const void* const*, void* const*, int);
  // A kernel that packs its constant inputs once (codegen/cpu/cpu_codegen.h).
  struct PrepareFns {
    void* (*prepare)(const void* const*) = nullptr;
    int (*run)(const void*, const void* const*, void* const*, int) = nullptr;
    void (*release)(void*) = nullptr;
    int (*run_dims)(const void*, const long*, const void* const*, void* const*, int) = nullptr;
  };
  static absl::StatusOr<LoadedKernel> Open(const std::string& so_path, const std::string& entry);
  LoadedKernel(LoadedKernel&& other) noexcept;
  LoadedKernel& operator=(LoadedKernel&&) = delete;
  LoadedKernel(const LoadedKernel&) = delete;
  ~LoadedKernel();
  EntryFn entry() const { return entry_; }
  // fusor_run_dims, when the kernel takes the sizes of ranged dims.
  DimsEntryFn entry_dims() const { return entry_dims_; }
  // fusor_prepare, fusor_run_prepared and fusor_release, when it has all three.
  const std::optional<PrepareFns>& prepare() const { return prepare_; }
  // Another symbol of the same object; nullptr if absent.
  void* Symbol(const std::string& name) const;

 private:
  LoadedKernel(void* handle, EntryFn entry) : handle_(handle), entry_(entry) {}
  void* handle_ = nullptr;
  EntryFn entry_ = nullptr;
  DimsEntryFn entry_dims_ = nullptr;
  std::optional<PrepareFns> prepare_;
};

// Calls a kernel as a model does: one that prepares its constant inputs
// does so at the first call with each set of input pointers (timed), and
// then runs prepared. Releases what it prepared when destroyed.
class KernelCalls {
 public:
  // Calls with `num_inputs` inputs; `prepared`: false calls fusor_run always.
  // `dims`: the sizes of the chain's ranged dims (RangedDims() order) the
  // calls run at; empty: fusor_run's (the largest).
  KernelCalls(const LoadedKernel& kernel, size_t num_inputs, int num_threads, bool prepared = true,
              std::vector<long> dims = {})
      : kernel_(kernel), num_inputs_(num_inputs), threads_(num_threads),
        prepared_(prepared && kernel.prepare().has_value()), dims_(std::move(dims)) {}
  KernelCalls(const KernelCalls&) = delete;
  KernelCalls& operator=(const KernelCalls&) = delete;
  ~KernelCalls();
  // The kernel's return code; 1 when preparing ran out of memory.
  int Run(const void* const* inputs, void* const* outputs);
  // Prepares for these inputs now, if the kernel prepares and has not yet:
  // 0, or 1 when memory ran out.
  int Prepare(const void* const* inputs);
  // Seconds the first preparation took; 0 when nothing was prepared.
  double prepare_s() const { return prepare_s_; }

 private:
  const LoadedKernel& kernel_;
  const size_t num_inputs_;
  const int threads_;
  const bool prepared_;
  const std::vector<long> dims_;
  std::vector<std::pair<std::vector<const void*>, void*>> states_;  // by input pointers
  void* StateFor(const void* const* inputs);  // found, or prepared now; null: out of memory
  double prepare_s_ = 0;
};

// Runs the kernel once on fresh random inputs (uniform in [-1, 1], rounded
// to the chain's dtype) with its outputs poisoned with NaN, and checks every
// output element against the float64 reference, within `rtol` (0: the
// dtype's Tolerance). Non-OK only when the kernel reports an error or the
// reference cannot be computed.
absl::StatusOr<Validation> ValidateKernel(const LoadedKernel& kernel, const ir::Chain& chain,
                                          uint64_t seed, int num_threads, double rtol = 0);

// The same check on given inputs (one buffer per chain input, in order;
// values are rounded to the chain's dtype first). A kernel that prepares
// its constant inputs is checked both ways: fusor_run, then prepared (the
// first that fails, else the last). `reference`: as for ValidateRun.
// `dims`: the sizes a ranged kernel runs at, `chain` being its chain at
// them (ir::AtSizes).
absl::StatusOr<Validation> ValidateKernelOn(const LoadedKernel& kernel, const ir::Chain& chain,
                                            const std::vector<std::vector<double>>& inputs, int num_threads,
                                            double rtol = 0, const ReferenceFn& reference = nullptr,
                                            const std::vector<long>& dims = {});

// Times kernels of the chain together, on the same inputs, with a
// monotonic clock after warm-up, repeating to the time budget (within
// min/max repeats, at least kMinSamples), by the timing protocol of
// common/util/timing.h: a set that spreads too far is taken again (until
// the fastest kernel of each of `groups` is trusted; empty: every kernel
// is a group). Several
// kernels take turns in 8 slices of each set, each slice after a pause and
// one warm-up call, so that their ratios hold on a machine whose speed
// drifts. One timing per kernel, in order; non-OK if a kernel reports an
// error.
// A kernel that prepares its constant inputs runs prepared, once per input
// set; `prepare_s`, when given, receives each kernel's first preparation
// time (0 for one that prepares nothing), kept out of its samples.
// `dims`, per kernel (or empty): the sizes of ranged dims it runs at, as
// for KernelCalls, `chain` being the chain at them.
absl::StatusOr<std::vector<TrustedTiming>> TimeKernelsTogether(const std::vector<const LoadedKernel*>& kernels,
                                                        const ir::Chain& chain, const TimingOptions& options,
                                                        const std::vector<std::vector<int>>& groups = {},
                                                        std::vector<double>* prepare_s = nullptr,
                                                        const std::vector<std::vector<long>>& dims = {});

}  // namespace fusor::worker
