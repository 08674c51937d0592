// Validation of a kernel's outputs against the float64 reference, for
// every backend: the inputs it gets, how they are rounded to the chain's
// dtype, and the tolerance every output element is checked within.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/ir/chain.h"

namespace fusor::worker {

// Relative tolerance per dtype: an element passes when
// |out - ref| <= rtol * (|ref| + rms(ref)).
double Tolerance(ir::DType dtype);

struct Validation {
  bool ok = false;
  double max_abs_error = 0;
  double max_rel_error = 0;  // |out - ref| / (|ref| + rms(ref))
  std::string detail;        // the first failing element, when !ok
};

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

// The float64 reference on RandomInputs(chain, seed) rounded to the
// chain's dtype (`rounded_inputs`), kept as a file in `dir`, one per chain
// and seed: a task validates every candidate on a few input sets of its
// own (TaskInputSeed), so each set's reference is computed by the first
// job that needs it and read back by the others, each in its own child.
// The files are bounded to `max_bytes` in all, the least recently used
// removed first. A file that does not read back as the chain's outputs is
// computed again; an empty `dir` keeps nothing.
inline constexpr int64_t kReferenceCacheBytes = int64_t{512} << 20;
absl::StatusOr<Outputs> CachedReference(const ir::Chain& chain, uint64_t seed,
                                        const std::vector<std::vector<double>>& rounded_inputs,
                                        const std::string& dir, int64_t max_bytes = kReferenceCacheBytes);

// The seed of input set `set` of a task (of kInputSets, the set picked by
// the job): the same for every job of the task, on any worker.
inline constexpr int kInputSets = 3;
uint64_t TaskInputSeed(const std::string& task_id, int64_t set);

// The sizes a kernel of a chain with ranged dims is checked at (each a
// size per RangedDims(), in that order): every ranged dim at its largest,
// at its smallest, at an odd size in between (tiles then end in
// remainders) and, with two or more, the first at its smallest and the
// others at their largest. A kernel answers for its whole range only once
// it has computed all of these right.
std::vector<std::vector<int64_t>> ValidationSizes(const ir::Chain& chain);
// The sizes it is timed at: the largest, and each range's geometric middle
// (the sizes a range of lengths puts the most requests near). A ranged
// measurement is one request at each: its samples are the sums of theirs.
std::vector<std::vector<int64_t>> TimingSizes(const ir::Chain& chain);

// Fresh random inputs, uniform in [-1, 1], one buffer per chain input; the
// last input a sum of 1024 or more terms reduces over is scaled by
// 1 / sqrt(terms), so that chains of long sums stay in the f16 range.
std::vector<std::vector<double>> RandomInputs(const ir::Chain& chain, uint64_t seed);

// One tensor's bytes in host memory, in a chain's dtype.
struct HostTensor {
  std::vector<unsigned char> bytes;
  void* data() { return bytes.data(); }
};

// Stores `values` in `t` in `dtype` and returns them as stored (rounded
// to the dtype), as doubles.
std::vector<double> StoreInDType(ir::DType dtype, const std::vector<double>& values, HostTensor& t);

// `n` NaNs in `dtype`: outputs are poisoned with them before a run.
void Poison(ir::DType dtype, int64_t n, HostTensor& t);

// The tensors' data, as a kernel takes its arguments.
std::vector<const void*> Pointers(std::vector<HostTensor>& tensors);

}  // namespace fusor::worker
