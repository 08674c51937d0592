// The phases of BuildLoopNest (loop_nest.h), in the order it runs them,
// declared for loop_nest.cc and its tests. Each phase reads what the ones
// before it filled in and, where it can refuse the schedule, returns
// INVALID_ARGUMENT as BuildLoopNest does; on an error the nest is left half
// built and must not be used. `chain` is always the chain the schedule runs
// (regrouped already) and `context` comes from MakeNestContext of it.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/hw/target.h"
#include "common/ir/chain.h"
#include "common/space/loop_nest.h"
#include "common/space/schedule.h"

namespace fusor::space::phases {

// The schedule's shape: a tile per dim within its extent, own loops for
// no more ops than the chain has, CUDA-only options on CUDA targets only.
// A nest holding the canonical schedule and every dim's trip count.
absl::StatusOr<LoopNest> StartNest(const ir::Chain& chain, const Schedule& input, const hw::TargetDesc& target);

// The block loops (each block-eligible; num_blocks), the stream loop (at
// most one, not a block loop; stream_dim) and each op's own loops (a sum's
// own dims, neither block nor stream, output dims before reduced dims).
absl::Status PlaceLoops(const ir::Chain& chain, const NestContext& context, LoopNest& nest);

// Sizes nest.ops and gives each op its region by the dependencies between
// ops, and whether it accumulates along the stream loop or is a softmax
// normalized online along it.
absl::Status PlaceRegions(const ir::Chain& chain, LoopNest& nest);

// Each op's compute rate, and each sum's mapping: the schedule's,
// validated, or the default; with it the intrinsic's micro-kernel and the
// op's GemmForm.
absl::Status ResolveMappings(const ir::Chain& chain, const NestContext& context, LoopNest& nest);

// A stream loop must enclose at least two ops.
absl::Status CheckStreamLoopFuses(const ir::Chain& chain, const LoopNest& nest);

// Each online softmax must feed exactly one accumulating GEMM-shaped sum as
// one of its factors; that sum's online_softmax names it.
absl::Status LinkOnlineSoftmax(const ir::Chain& chain, LoopNest& nest);

// The block-local buffer of each op result that is read or accumulated,
// and intermediate_bytes.
void LayOutBuffers(const ir::Chain& chain, LoopNest& nest);

// Each op's own loops, tiles, pack placement and scratch; the Load /
// Compute / Store statements with their LP_sets; padded and useful flops;
// scratch_bytes.
void PlaceStatements(const ir::Chain& chain, LoopNest& nest);

// The causal softmax the blocks skip dropped tiles of (causal_softmax),
// and the statements inside its axis's loops run that much less often.
void SkipCausalTiles(const ir::Chain& chain, const hw::TargetDesc& target, LoopNest& nest);

// Divides the stream loop among schedule.split blocks (a no-op for 1):
// what runs outside it runs once per part, and each accumulated output's
// partial sums are read back and stored.
absl::Status SplitStreamLoop(const ir::Chain& chain, const hw::TargetDesc& target, LoopNest& nest);

// When the schedule keeps intermediates in registers, whether the nest
// allows it.
absl::Status CheckRegisters(const ir::Chain& chain, const LoopNest& nest);

}  // namespace fusor::space::phases
