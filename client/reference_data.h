// `fusor reference`: a chain's inputs and its float64 reference outputs on
// disk, so that any other implementation (a framework, a hand-written
// kernel) can be checked against what fusor checks its kernels against.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/ir/chain.h"

namespace fusor::client {

// Writes into `out_dir` one raw little-endian float64 file per chain input
// (fusor's validation inputs for `seed`, as the chain's dtype stores them)
// and per chain output (the float64 reference on those inputs), and
// manifest.json naming each file with its tensor, shape and dtype, the
// chain (IR JSON), its regroupings (other association orders, as chains)
// and the validation tolerance. Returns the paths written.
absl::StatusOr<std::vector<std::string>> WriteReferenceData(const ir::Chain& chain, uint64_t seed,
                                                            const std::string& out_dir);

}  // namespace fusor::client
