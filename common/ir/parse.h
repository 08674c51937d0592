// The two workload front ends: chain text and (proto-compatible) JSON.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "common/ir/chain.h"
#include "common/ir/spec.h"

namespace fusor::ir {

// Chain text, e.g.
//   chain gemm_chain
//   dtype f32
//   dim m=256 n=256 k=64 h=64
//   in A[m,k] B[k,n] D[n,h]
//   C[m,n] = sum(k) A[m,k] * B[k,n]
//   E[m,h] = sum(n) C[m,n] * D[n,h]
//   out E
// '#' starts a comment. Errors name the line and column.
absl::StatusOr<ChainSpec> ParseChainTextSpec(absl::string_view text, const Limits& limits = Limits());
absl::StatusOr<Chain> ParseChainText(absl::string_view text, const Limits& limits = Limits());

// The proto3 JSON form of fusor.v1.Chain (or of a fusor.v1.Workload holding
// one, or holding chain text). Errors name the field.
absl::StatusOr<Chain> ParseChainJson(absl::string_view json, const Limits& limits = Limits());

// Text or JSON, told apart by the first non-blank character.
absl::StatusOr<Chain> ParseChain(absl::string_view source, const Limits& limits = Limits());

// The chain as fusor.v1.Chain JSON; ParseChainJson reads it back.
std::string ChainToJson(const Chain& chain);

}  // namespace fusor::ir
