// The canonical form and key of a chain.
//
// The key is the same for chains that differ only in tensor and dim names,
// whitespace, comments, the order of independent declarations, the order of
// operands of + and *, and dims that are declared but unused; it differs for
// any change of shape, dtype or computation.
#pragma once

#include <string>
#include <vector>

#include "common/ir/chain.h"

namespace fusor::ir {

struct CanonicalForm {
  Chain chain;                  // tensors t0.., dims d0.., ops in canonical order
  std::string text;             // ChainToText(chain)
  std::string key;              // 32 hex digits of SHA-256(text)
  std::vector<int> dim_map;     // user dim id -> canonical dim id (-1: unused)
  std::vector<int> tensor_map;  // user tensor id -> canonical tensor id
};

CanonicalForm Canonicalize(const Chain& chain);

}  // namespace fusor::ir
