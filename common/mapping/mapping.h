// AMOS's software-to-intrinsic mappings: which loops of a compute op feed
// which axes of an intrinsic, how they are generated, and when one is valid.
//
// A mappable op is a sum whose body is a product of tensor accesses (and
// constants). Its operands correspond to the intrinsic's by position: the
// first factor to A[i, k], the second to B[k, j], the output to C[i, j];
// further factors join the input whose loops contain theirs.
//
// Generation. A basic matching picks one loop for every intrinsic axis,
// kinds agreeing (spatial loops onto i and j, reduced loops onto k), and
// must be valid. A mapping is a union of basic matchings: every loop used
// on an axis by one of them is fused onto that axis (flattened in chain
// order). Distinct unions are the mappings.
//
// Validation, with access matrices. For each operand pair (software tensor
// T, intrinsic operand U):
//   X[l][d] = coefficient of loop l in dim d of T's index   (loops x T dims)
//   Z[a][e] = 1 if intrinsic axis a indexes dim e of U     (axes x U dims)
//   Y[l][a] = 1 if the mapping puts loop l onto axis a      (loops x axes)
// (X^T Y)[d][a] != 0 says dim d of T moves with axis a. The tile of U must
// be a view of T (a slice, reshape and transpose: no gather), so:
//   1. each dim of T moves with at most one axis         (row d of X^T Y);
//   2. every loop on an axis of U indexes T              (T is not
//      broadcast along part of the tile), and every axis of U has a loop;
//   3. no mapped loop that indexes T sits on an axis U lacks (T would vary
//      across a tile dim U does not have: e.g. a batch loop onto i would
//      make B vary along i).
// Loops on no axis stay outside the intrinsic: spatial ones index tiles,
// reduced ones accumulate across tiles.
// Worked example, conv2d O[n,k,p,q] += I[n,c,p*2+r,q*2+s] * W[k,c,r,s]:
// {i: p, j: k, k: r} fails rule 1, because dim 2 of I, p*2+r, moves with
// both i (through p) and k (through r); {i: p, j: k, k: c} is valid (r and
// s stay outside: the tile of I is I[n, c-range, p*2+r, q*2+s] at fixed
// n, q, r, s). Of the 36 kind-compatible choices (i and j two of n, k, p,
// q; k one of c, r, s) 7 are valid basic matchings (i one of n, p, q; j = k;
// k one of c, r, s; not p with r nor q with s), and their distinct unions
// are 35 mappings.
//
// Strict mode also rejects a mapping whose fused extent on some axis is
// below the intrinsic's (it would be padded); otherwise the padding factor
// is known to the model.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/hw/intrinsic.h"
#include "common/ir/chain.h"

namespace fusor::mapping {

// A sum op as a product of tensor factors grouped onto the intrinsic's inputs.
struct SoftwareOp {
  int op = -1;
  double scale = 1;
  std::vector<ir::Access> a_side, b_side;  // factors feeding A and B
  std::vector<int> spatial, reduced;       // loops (dim ids), chain order
};

// INVALID_ARGUMENT when the op is not a sum of a product of two or more
// tensor factors, or an extra factor's loops fit neither input.
absl::StatusOr<SoftwareOp> ViewOp(const ir::Chain& chain, int op);

struct Mapping {
  const hw::Intrinsic* intrinsic = nullptr;
  std::array<std::vector<int>, 3> axes;  // loops fused onto i, j, k, in chain order
  // The factors feed the inputs the other way round (B's onto A). Only
  // degenerate fallbacks use it: it puts the missing axis on the unit's
  // narrower side.
  bool swapped = false;

  bool operator==(const Mapping& other) const {
    return intrinsic == other.intrinsic && axes == other.axes && swapped == other.swapped;
  }
};

struct Verdict {
  bool valid = false;
  std::string reason;                   // why it is invalid
  bool strict = false;                  // valid and no axis padded
  std::array<int64_t, 3> fused{1, 1, 1};  // fused extent per axis
  double padding = 1;                   // padded / useful points of one tile sweep
};

// `degenerate` allows a spatial axis with no loop (extent 1, padded): how
// a GEMV or a depthwise convolution still uses the unit. Generation never
// produces such mappings; DefaultMapping falls back to them.
Verdict Validate(const ir::Chain& chain, const SoftwareOp& sw, const Mapping& mapping, bool degenerate = false);

struct MappingSet {
  int kind_compatible = 0;        // one loop per axis, kinds agreeing
  std::vector<Mapping> basic;     // the valid ones among them
  std::vector<Mapping> mappings;  // distinct unions of basic matchings
};
MappingSet GenerateMappings(const ir::Chain& chain, const SoftwareOp& sw, const hw::Intrinsic& intrinsic);

// How many mappings an op has onto an intrinsic, stage by stage.
struct MappingCounts {
  int kind_compatible = 0;
  int basic = 0;
  int mappings = 0;
  int valid = 0;
  int strict = 0;
};
MappingCounts CountMappings(const ir::Chain& chain, const SoftwareOp& sw, const hw::Intrinsic& intrinsic);

// Every kind-compatible choice of one loop per axis (for reports: each
// with its verdict).
std::vector<Mapping> KindCompatibleMatchings(const SoftwareOp& sw, const hw::Intrinsic& intrinsic);

// A valid mapping close to the classic GEMM view: spatial loops of only A
// onto i, of only B onto j, reduced loops of both onto k, except reduced
// loops sharing a dim with a spatial one (p*2+r): those stay outside and
// accumulate across tiles. Of the two orientations (which factor is A) the
// one with the result's last dim on j, when valid; so the order in which
// the factors are written does not change it. When A or B has no spatial
// loop of its own (a GEMV), that axis is left degenerate. nullopt if that
// is not valid.
std::optional<Mapping> DefaultMapping(const ir::Chain& chain, const SoftwareOp& sw, const hw::Intrinsic& intrinsic);

// "fma.avx2.6x16[i=m j=n k=k]", fused loops joined by '.': "i=n.p"; a
// swapped mapping ends in " swap".
std::string MappingToText(const Mapping& mapping, const ir::Chain& chain);
absl::StatusOr<Mapping> ParseMapping(absl::string_view text, const ir::Chain& chain);

}  // namespace fusor::mapping
