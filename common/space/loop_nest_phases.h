// The phases of BuildLoopNest (loop_nest.h), in the order it runs them,
// declared for loop_nest.cc and its tests, and defined by concern:
// loop_nest_regions.cc (the nest's loops, regions and mappings),
// loop_nest_statements.cc (buffers, packs and statements) and
// loop_nest_stream.cc (causal tiles skipped, the stream loop split,
// intermediates kept in registers). Each phase reads what the ones
// before it filled in and, where it can refuse the schedule, returns
// INVALID_ARGUMENT as BuildLoopNest does; on an error the nest is left half
// built and must not be used. `chain` is always the chain the schedule runs
// (regrouped already) and `context` comes from MakeNestContext of it.
#pragma once

#include <algorithm>
#include <vector>

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

// Helpers the phases share (Contains here, the others in loop_nest.cc).
inline bool Contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }
bool AccessDependsOn(const ir::Access& a, int dim);
// Whether every read of a result of `chain` along `dim` is the plain dim at
// the producer's axis of `dim` (and no other axis depends on it).
bool ReadsAlong(const ir::Chain& chain, const ir::Access& a, int dim);
// INVALID_ARGUMENT "schedule: message".
absl::Status Illegal(absl::string_view message);
// Appends a statement of `op` (a load or store of `tensor`, or with -1 its
// compute), run once per iteration of `loops`.
void AddStatement(const ir::Chain& chain, LoopNest& nest, StmtKind kind, int op, int tensor, double bytes,
                  double flops, std::vector<int> loops);

}  // namespace fusor::space::phases
