// A fused schedule of a chain: its tiling expression and tile sizes.
//
// The fused loop nest has three levels:
//   block loops  - tiles distributed over cores (GPU: thread blocks); every
//                  op runs inside them, so an op that lacks a block dim is
//                  recomputed for each of its tiles;
//   stream loops - serial loops inside a block around the ops that use the
//                  dim: ops that produce along it compute one tile per
//                  iteration, ops that reduce along it accumulate across
//                  iterations (an intermediate is then never materialized
//                  beyond one tile, and a softmax along it is computed
//                  online);
//   own loops    - each sum op's remaining tile loops, output dims first.
// Dims placed nowhere run at full extent. In MCFuser's notation the block
// and stream loops are the deep part and the own loops the flat groups:
// `m h / n / C(k)` is the deep tiling mhnk of C = A·B, E = C·D, and
// `m / n / C(k) E(h)` is the flat tiling mn(k,h).
//
// Each sum op may also name its mapping onto an intrinsic (mapping.h); an
// op without one gets the default mapping of the target's best intrinsic.
//
// On a CUDA target the schedule also says how a block runs: its warps,
// the cp.async stages of operand tiles that change with every step of a
// loop (2 prefetches the next step's tile while this one is multiplied, 3
// the next two, 1 waits for each), and where the intermediates live: in
// shared memory (the default) or, for attention and GEMM chains (GEMM,
// elementwise ops, at most one online softmax along the stream loop,
// GEMM), in each warp's registers ("registers": FlashAttention's layout;
// BuildLoopNest says when it applies). The model cannot rank these: on a
// GPU the register-resident kernels are ranked first (space.cc), and the
// search measures the other launches around the best it has measured.
//
// Text form (one tile size per dim; "-" for an empty level; the mappings
// and the launch optional, the launch only where it is not the default;
// a regrouping first, in braces):
//   b=1 m=64 / n=32 / S(k=32) O(h=32) / S=fma.avx2.6x16[i=m j=n k=k]
//   b=1 m=64 / n=64 / - / cuda warps=4 stages=1 registers
//   {E=A*(B*D)} b=1 / - / B_D(n=64)
//   m=64 / f=256x2 / -          (the f loop split among 2 blocks)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/ir/chain.h"
#include "common/ir/regroup.h"
#include "common/mapping/mapping.h"

namespace fusor::space {

struct Schedule {
  // The association order (regroup.h): empty for the chain as written.
  // Everything else refers to the chain regrouped: its ops and tensors
  // keep their ids, the regrouped intermediate is renamed.
  ir::Regroup regroup;
  std::vector<int> block;              // dim ids, ascending
  std::vector<int> stream;             // dim ids, outermost first
  // The stream loop's range is divided among this many blocks, each
  // running its part; what accumulates along it is summed across them at
  // the end (split-K: every core busy when the other dims give few blocks).
  // On a GPU the tile's last block to finish combines the parts (a
  // register-resident kernel's with their softmax row states).
  int split = 1;
  std::vector<std::vector<int>> own;   // per op: dim ids, outermost first
  std::vector<int64_t> tile;           // per dim, in [1, extent]
  std::vector<mapping::Mapping> maps;  // per op; intrinsic == nullptr: the default
  int warps = 0;   // CUDA: warps per block; 0: kDefaultWarps
  int stages = 0;  // CUDA: 1, 2 or 3 (cp.async pipeline depth); 0: kDefaultStages
  bool registers = false;  // CUDA: intermediates in registers, not shared memory

  bool operator==(const Schedule& other) const = default;
};

inline constexpr int kDefaultWarps = 4;
inline constexpr int kDefaultStages = 2;
// The launch a schedule asks for, defaults filled in.
inline int WarpsOf(const Schedule& s) { return s.warps > 0 ? s.warps : kDefaultWarps; }
inline int StagesOf(const Schedule& s) { return s.stages > 0 ? s.stages : kDefaultStages; }

// Every dim at full extent, no loops.
Schedule UntiledSchedule(const ir::Chain& chain);

// The canonical text: loops of one trip are left out (they vanish), block
// dims in chain order.
std::string ScheduleToText(const Schedule& schedule, const ir::Chain& chain);

// INVALID_ARGUMENT naming the offending part. Checks the syntax and the
// tile sizes; BuildLoopNest checks that the nest is legal for the chain.
absl::StatusOr<Schedule> ParseSchedule(absl::string_view text, const ir::Chain& chain);

// MCFuser's tiling expression of the schedule, e.g. "mhn(k)" or "mn(k,h)";
// for people (dims with names longer than one letter are spaced).
std::string TilingExpression(const Schedule& schedule, const ir::Chain& chain);

// Drops loops of one trip and sorts the block dims: equal canonical forms
// are the same nest.
Schedule Canonical(const Schedule& schedule, const ir::Chain& chain);

// The same schedule for chain `to`, whose dims, ops and tensors are a
// renumbering of this schedule's chain: `dim_map` maps dim ids (-1: none),
// `op_map` op ids and `tensor_map` tensor ids (needed for a regrouping).
// Dims nothing maps onto keep their full extent.
Schedule RemapSchedule(const Schedule& schedule, const std::vector<int>& dim_map,
                       const std::vector<int>& op_map, const ir::Chain& to,
                       const std::vector<int>& tensor_map = {});

// The chain `schedule` runs: `chain` regrouped as it says (regroup.h), or
// `chain` itself.
absl::StatusOr<ir::Chain> ScheduledChain(const ir::Chain& chain, const Schedule& schedule);

}  // namespace fusor::space
