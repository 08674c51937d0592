// Regrouping a chain of sums: association order as a tuning decision.
//
// A sum whose result is a factor of exactly one other sum, with nothing
// nonlinear between them, can be regrouped: for C = sum(k) A*B and
// E = sum(n) C*D, E = sum(k,n) A*B*D = sum(k) A * (sum(n) B*D). The
// regrouped chain has the same inputs, outputs and dims; the producer's
// op and tensor ids now hold the new inner sum (B*D, named after its
// factors), the consumer's the outer one. Its FLOPs can differ by orders
// of magnitude (a ninth on the MCFuser GEMM chain), and so can its
// intermediates; both orders compute the same outputs up to rounding.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/ir/chain.h"

namespace fusor::ir {

struct Regroup {
  int consumer = -1;       // op id of the consuming sum; -1: the chain as written
  std::vector<int> first;  // tensor ids of the two factors contracted first

  bool empty() const { return consumer < 0; }
  bool operator==(const Regroup& other) const = default;
};

// Every regrouping of `chain` other than the chain as written: per sum
// that consumes another sum's result (both plain products of two
// accesses, the result read only there and at the point it was produced,
// not a chain output, no tensor among the three factors twice), each
// pairing of one of the producer's factors with the consumer's other
// factor that contracts at least one dim and reads nothing produced after
// the producer. In op order, then factor order.
std::vector<Regroup> Regroupings(const Chain& chain);

// The regrouped chain. INVALID_ARGUMENT when `r` is not one of
// Regroupings(chain).
absl::StatusOr<Chain> ApplyRegroup(const Chain& chain, const Regroup& r);

// "E=A*(B*D)": the consumer's result, its three factors in their order
// in the chain, the pair contracted first in parentheses.
std::string RegroupToText(const Chain& chain, const Regroup& r);

// Reads RegroupToText's form back (spaces allowed). INVALID_ARGUMENT when
// it names no regrouping of `chain`.
absl::StatusOr<Regroup> ParseRegroup(absl::string_view text, const Chain& chain);

}  // namespace fusor::ir
