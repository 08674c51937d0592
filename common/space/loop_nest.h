// The fused loop nest of a chain under a schedule, after statement
// placement: which region each op runs in, where each Load / Compute /
// Store statement sits (its LP_set, the loops that still enclose it), and
// the per-thread scratch a block needs. The cost model and the code
// generator both read it, so what is predicted is what is emitted.
//
// Placement follows the dependencies between statements (MCFuser's scope
// and order dependencies):
//  - An op runs BEFORE the stream loops when it uses no stream dim and
//    reads nothing produced inside them (it is hoisted out of them), INSIDE
//    them when it produces or reduces along a stream dim or reads a tile
//    produced there, and AFTER them when it reads a result accumulated
//    across them.
//  - A sum op whose body is a product maps onto an intrinsic by its
//    mapping (see mapping.h and GemmForm). A pack holds batch x (rows or
//    cols) x mapped reduced dims of its side and sits just
//    inside the innermost loop (stream or own) over one of those dims: it
//    is hoisted out of every other loop, e.g. out of the stream loop when
//    it does not depend on it (L_A leaves n in m/n/C(k) when k has one
//    tile). A loop of one trip vanishes and what it enclosed hoists.
//  - A store leaves the loops of the dims it reduces: an op accumulating
//    across the stream loop stores after it (S_E leaves n and k).
//  - An op inside a block dim or stream loop it does not use is recomputed
//    for every iteration: its C statement keeps the loop in its LP_set and
//    the model charges for it.
//  - A softmax along the stream dim is computed online: a running max and
//    sum per row, and the consuming sum rescales its accumulator.
//  - A split stream loop runs its parts in separate blocks: whatever
//    runs outside it is recomputed per part, and each result accumulated
//    along it (a chain output, read by nothing) is written as a partial
//    sum per part, summed into the output after every block is done (on
//    a GPU by the tile's last part to finish; a register-resident kernel
//    may split an online softmax too, rescaling by the parts' row states).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/hw/intrinsic.h"
#include "common/hw/target.h"
#include "common/ir/chain.h"
#include "common/space/schedule.h"

namespace fusor::space {

// Dims that can be block loops: an output dim of every op whose result is
// a chain output, never reduced or normalized by any op, and read
// unchanged (plain index, same axis) wherever an op result is read.
std::vector<int> BlockEligibleDims(const ir::Chain& chain);

// A sum op as its mapping puts it onto the intrinsic: rows (axis i),
// columns (j) and the reduction (k) of the intrinsic's tiles; output dims
// on no axis index separate tiles ("batch"), reduced dims on no axis
// accumulate across tiles.
struct GemmForm {
  bool ok = false;  // false: no valid mapping; the scalar generic path is used
  double scale = 1;
  std::vector<ir::Access> a_side, b_side;
  std::vector<int> batch, rows, cols;  // in output index order
  std::vector<int> kdims;              // mapped reduced dims, in reduce order
  std::vector<int> outer_reduce;       // reduced dims on no axis
};
GemmForm FormOf(const ir::Chain& chain, const mapping::SoftwareOp& sw, const mapping::Mapping& m);

// The mapping a sum op gets when its schedule names none: the default
// mapping onto the target's best intrinsic; nullopt when it has none.
std::optional<mapping::Mapping> DefaultMappingFor(const ir::Chain& chain, int op, const hw::TargetDesc& target);

enum class Region { kBefore, kStream, kAfter };
enum class StmtKind { kLoad, kCompute, kStore };

struct Statement {
  StmtKind kind = StmtKind::kCompute;
  int op = -1;
  int tensor = -1;         // loads and stores: the tensor in global memory
  std::string label;       // e.g. "L(K)", "C(S)", "S(O)"
  double bytes = 0;        // TS, per execution
  double flops = 0;        // Fp, per execution
  std::vector<int> loops;  // LP_set: dims whose loops enclose it
  double executions = 0;   // product of the trip counts of `loops`
  double rate = 1;         // compute: the fraction of the target's P it runs at
  bool partials = false;   // load: a split loop's partial sums, written in the same launch
};

struct OpNest {
  int op = -1;
  Region region = Region::kBefore;
  bool accumulates = false;   // reduces along the stream dim: result complete after the loop
  bool online = false;        // softmax op normalized online along the stream dim
  int online_softmax = -1;    // sum op: the online softmax op whose rows it rescales
  mapping::Mapping mapping;   // sum op with gemm.ok: its intrinsic and axes
  hw::MicroKernel kernel;     // the intrinsic's register block (CPU code generation)
  double rate = 1;            // the fraction of the target's P its compute runs at
  GemmForm gemm;
  std::vector<int> loops;     // own loops (trip count > 1): output dims, then reduced dims
  int num_out_loops = 0;
  // Packs sit inside the first a_depth / b_depth own loops, or before the
  // stream loop when hoisted out of it, or inside the loop over the
  // unmapped reduced dims when they depend on one.
  int a_depth = 0, b_depth = 0;
  bool a_hoisted = false, b_hoisted = false;
  bool a_per_point = false, b_per_point = false;
  // GEMM view of the innermost tile, and the op's scratch (floats).
  int64_t batch_tile = 1, rows_tile = 1, cols_tile = 1, k_tile = 1;
  int64_t rows_pad = 1, cols_pad = 1;
  int64_t acc_floats = 0, pack_a_floats = 0, pack_b_floats = 0, row_floats = 0;
  int64_t state_floats = 0;   // online softmax: running max, sum and rescale per row
};

// A block-local buffer of an op result, laid out over the producer's
// output dims: block dims (and the stream dim, for a tile produced inside
// the stream loop) span their tile, counted from the loop's origin; the
// rest span their extent.
struct LocalBuffer {
  int64_t floats = 0;             // 0: no buffer
  std::vector<int64_t> shape;     // per axis
  std::vector<bool> relative;     // per axis: indexed from the loop origin
};

struct LoopNest {
  Schedule schedule;              // canonical
  // The chain regrouped as schedule.regroup says; null when the schedule
  // runs the chain as written. Every id below refers to NestChain.
  std::shared_ptr<const ir::Chain> regrouped;
  std::vector<int64_t> trips;     // per dim: ceil(extent / tile)
  int64_t num_blocks = 1;         // split included
  int stream_dim = -1;            // at most one stream loop
  int split = 1;                  // blocks the stream loop's range is divided among
  std::vector<OpNest> ops;        // parallel to chain.ops
  std::vector<LocalBuffer> local; // per tensor
  std::vector<Statement> statements;
  int64_t intermediate_bytes = 0; // block-local buffers
  int64_t scratch_bytes = 0;      // everything a thread holds for a block
  // A causal softmax whose dropped entries are skipped (ir::Op::Causal):
  // every op over its axis feeds it or sums its result times something,
  // and its row dim is a block loop or (on a CPU) the stream loop. Then in
  // each block, or each step of the stream loop for the ops inside it, the
  // axis ends at e_<axis>: its tile loops (stream and own) stop after the
  // tile that holds the last row's last kept entry; an untiled axis (CPU)
  // ends right after that entry. Blocks are visited last row tile first
  // (the longest first). -1: none; causal softmaxes that are not skipped
  // still drop their entries, computed and masked.
  int causal_softmax = -1;
  double causal_share = 1;        // of the axis's tiles, the share the blocks run
  double padded_flops = 0;        // sum ops' compute, padding included (and recomputation)
  double useful_flops = 0;        // the same without the padding
  double PaddingRatio() const { return useful_flops > 0 ? padded_flops / useful_flops : 1; }
};

// Whether the ops of `on` (or, for null, the loops around every op) see dim
// d end at e_<d> (LoopNest::causal_softmax); `in_stream`: inside the stream
// loop, where a row dim streamed has its current tile.
bool CausalBounded(const ir::Chain& chain, const LoopNest& nest, int d, const OpNest* on, bool in_stream = true);

// The chain a nest of `chain` runs: its regrouping, or `chain`.
inline const ir::Chain& NestChain(const ir::Chain& chain, const LoopNest& nest) {
  return nest.regrouped ? *nest.regrouped : chain;
}

// What building a nest needs that depends only on the chain and the target
// (worth computing once when building many nests).
struct NestContext {
  std::vector<int> block_eligible;
  std::vector<const hw::Intrinsic*> usable;
  std::vector<std::optional<mapping::SoftwareOp>> views;  // per op: mappable sums
  std::vector<std::optional<mapping::Mapping>> defaults;  // per op
  int widest_lanes = 1;     // CPU: the lanes P was calibrated with
  double scalar_rate = 1;  // share of P that scalar code reaches
};
NestContext MakeNestContext(const ir::Chain& chain, const hw::TargetDesc& target);

// INVALID_ARGUMENT when the schedule cannot be a legal nest for the chain
// on the target (an ineligible block dim, a stream loop a result would be
// read across before it is complete, own loops over foreign dims, an
// invalid mapping or one onto an intrinsic the target lacks, ...).
// `context`, when given, must come from MakeNestContext of the chain the
// schedule runs (ScheduledChain(chain, schedule)) and the target.
// Runs the phases of loop_nest_phases.h in order.
absl::StatusOr<LoopNest> BuildLoopNest(const ir::Chain& chain, const Schedule& schedule,
                                       const hw::TargetDesc& target, const NestContext* context = nullptr);

// The register-resident kernel's row fragments of 16 rows per warp: 2
// when the padded row tile has more rows than 16 a warp, else 1.
inline int RowFragmentsPerWarp(int64_t rows_pad, int warps) { return rows_pad > 16 * warps ? 2 : 1; }

// `schedule` with its intermediates in registers (schedule.h): no own
// loops, and warps enough for the row tile at 32 rows a warp where the
// registers allow, else 16 (a power of two up to 16); nullopt when
// BuildLoopNest would refuse it.
std::optional<Schedule> RegisterResidentVariant(const ir::Chain& chain, const Schedule& schedule,
                                                const hw::TargetDesc& target);

// The intrinsics a chain can use on a target, best first: on a GPU those
// fusor emits code for (mma.sync) whose inputs take the chain's dtype
// (tf32 for f32), by rate.
std::vector<const hw::Intrinsic*> UsableIntrinsics(const ir::Chain& chain, const hw::TargetDesc& target);

// Each sum op's mapping, e.g. "S=fma.avx2.6x16[i=m j=n k=k] O=scalar".
std::string DescribeMappings(const ir::Chain& chain, const LoopNest& nest);

}  // namespace fusor::space
