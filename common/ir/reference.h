// A float64 interpreter of chains: the reference every candidate is checked
// against. Slow but simple; products of accesses take a strided fast path.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "common/ir/chain.h"

namespace fusor::ir {

// Evaluates `chain` on `inputs` (one row-major buffer per chain.inputs entry,
// in that order) and returns one buffer per chain.outputs entry.
// INVALID_ARGUMENT if an input buffer has the wrong size.
absl::StatusOr<std::vector<std::vector<double>>> EvaluateReference(
    const Chain& chain, const std::vector<std::vector<double>>& inputs);

// The scalar functions of the IR, as the reference defines them.
double ApplyFunc(Func func, double x);

}  // namespace fusor::ir
