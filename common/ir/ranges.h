// Serving a chain whose sizes change from call to call (a batch, a
// sequence, a KV cache's length): the range of sizes one kernel serves,
// the family of a chain (the same chain at any sizes), and how far apart
// two of its members are.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/ir/canonical.h"
#include "common/ir/chain.h"

namespace fusor::ir {

// The range of sizes served together with `size`, as [min, max]: 1 alone
// (a decode step's one query row is its own case), 2..16, then ranges four
// times as long as the last: 17..64, 65..256, 257..1024, ... (a request's
// length anywhere in one is within 4x of the largest, the size the kernel
// is planned at). The last range ends at the largest extent.
std::pair<int64_t, int64_t> RangeFor(int64_t size);

// `chain` with each of `dims` (names) widened to RangeFor its extent; the
// other dims stay exact. INVALID_ARGUMENT naming the dim when one is not
// a dim of the chain, or when the chain cannot change that dim's size (it
// is read by an index other than itself on an axis it sizes, or sizes a
// constant).
absl::StatusOr<Chain> Widen(const Chain& chain, const std::vector<std::string>& dims);

// The canonical form of the chain's family: the chain with every dim's
// size left open. Chains that differ only in sizes (their extents, their
// ranges) share its key; its dim_map and tensor_map place each dim and
// tensor of `chain` in the family, so that a schedule of one member can be
// carried over to another.
CanonicalForm CanonicalFamily(const Chain& chain);

// Whether `record`'s kernel serves `request`: both of one family, every
// dim of `request` exact where the record's is (the same size), or ranged
// where the record's is, its whole range within the record's. `record_family` and `request_family`
// are their CanonicalFamily forms.
bool Covers(const Chain& record, const CanonicalForm& record_family, const Chain& request,
            const CanonicalForm& request_family);

// How far apart two members of a family are: the sum over their dims of
// |log2| of the ratio of their largest sizes.
double SizeDistance(const Chain& a, const CanonicalForm& a_family, const Chain& b, const CanonicalForm& b_family);

// For each family dim, the dim of `chain` there (-1: none).
std::vector<int> FamilyDims(const CanonicalForm& family, size_t family_dims);

// `chain` with the sizes and ranges of `other`, a member of its family,
// dim for dim (a dim `other` lacks keeps its own).
absl::StatusOr<Chain> WithSizesOf(const Chain& chain, const CanonicalForm& family, const Chain& other,
                                  const CanonicalForm& other_family);

// The ranged dims of `chain`, "m=65..256 n=65..256" ("" when it has none).
std::string RangedText(const Chain& chain);

}  // namespace fusor::ir
