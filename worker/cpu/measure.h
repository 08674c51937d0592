// Validation and timing of a compiled CPU kernel, inside a runner process.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/ir/chain.h"
#include "common/util/timing.h"

namespace fusor::worker {

// A fusor_run entry point in a loaded shared object; dlclose on destruction.
class LoadedKernel {
 public:
  using EntryFn = int (*)(const void* const*, void* const*, int);
  static absl::StatusOr<LoadedKernel> Open(const std::string& so_path, const std::string& entry);
  LoadedKernel(LoadedKernel&& other) noexcept;
  LoadedKernel& operator=(LoadedKernel&&) = delete;
  LoadedKernel(const LoadedKernel&) = delete;
  ~LoadedKernel();
  EntryFn entry() const { return entry_; }
  // Another symbol of the same object; nullptr if absent.
  void* Symbol(const std::string& name) const;

 private:
  LoadedKernel(void* handle, EntryFn entry) : handle_(handle), entry_(entry) {}
  void* handle_ = nullptr;
  EntryFn entry_ = nullptr;
};

// Relative tolerance per dtype: an element passes when
// |out - ref| <= rtol * (|ref| + rms(ref)).
double Tolerance(ir::DType dtype);

struct Validation {
  bool ok = false;
  double max_abs_error = 0;
  double max_rel_error = 0;  // |out - ref| / (|ref| + rms(ref))
  std::string detail;        // the first failing element, when !ok
};

// Runs the kernel once on fresh random inputs (uniform in [-1, 1], rounded
// to the chain's dtype) with its outputs poisoned with NaN, and checks every
// output element against the float64 reference, within `rtol` (0: the
// dtype's Tolerance). Non-OK only when the kernel reports an error or the
// reference cannot be computed.
absl::StatusOr<Validation> ValidateKernel(const LoadedKernel& kernel, const ir::Chain& chain,
                                          uint64_t seed, int num_threads, double rtol = 0);

// The same check on given inputs (one buffer per chain input, in order;
// values are rounded to the chain's dtype first).
absl::StatusOr<Validation> ValidateKernelOn(const LoadedKernel& kernel, const ir::Chain& chain,
                                            const std::vector<std::vector<double>>& inputs, int num_threads,
                                            double rtol = 0);

// The check itself, for any way of running a kernel: `run` gets the
// inputs and the (NaN-poisoned) output buffers in host memory, dense in
// the chain's dtype, and returns 0 on success.
using RunFn = std::function<int(const void* const* inputs, void* const* outputs)>;
// `reference` computes the expected outputs from the inputs as rounded to
// the chain's dtype (default: the float64 interpreter, ir/reference.h).
using Outputs = std::vector<std::vector<double>>;
using ReferenceFn = std::function<absl::StatusOr<Outputs>(const std::vector<std::vector<double>>& inputs)>;
absl::StatusOr<Validation> ValidateRun(const RunFn& run, const ir::Chain& chain,
                                       const std::vector<std::vector<double>>& inputs, double rtol = 0,
                                       const ReferenceFn& reference = nullptr);

// `values` as the chain's dtype stores them (rounded to f16 or bf16; f32
// rounds to float).
std::vector<double> RoundToDType(ir::DType dtype, const std::vector<double>& values);

// Fresh random inputs, uniform in [-1, 1], one buffer per chain input; the
// last input a sum of 1024 or more terms reduces over is scaled by
// 1 / sqrt(terms), so that chains of long sums stay in the f16 range.
std::vector<std::vector<double>> RandomInputs(const ir::Chain& chain, uint64_t seed);

struct TimingOptions {
  int warmup = 2;
  int min_repeats = 5;
  int max_repeats = 200;
  double time_budget_s = 0.5;
  int num_threads = 1;
  uint64_t seed = 1;
  // Input sets are rotated until together they exceed this many bytes (the
  // last-level cache), so repeats do not read inputs the last one cached.
  int64_t rotate_bytes = 0;
  double max_spread = kMaxSpread;  // the timing protocol's bound (common/util/timing.h)
};


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
absl::StatusOr<std::vector<TrustedTiming>> TimeKernelsTogether(const std::vector<const LoadedKernel*>& kernels,
                                                        const ir::Chain& chain, const TimingOptions& options,
                                                        const std::vector<std::vector<int>>& groups = {});

}  // namespace fusor::worker
