// Validation and timing of a compiled CPU kernel, inside a runner process
// (the checks themselves are backend-neutral: worker/validate.h).
#pragma once

#include <cstdint>
#include <functional>
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
