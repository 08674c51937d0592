// The fused loop nest of a chain under a schedule: which dims are fused,
// how each op's compute maps onto the target's micro-kernel, where each
// Load/Compute/Store statement sits after hoisting, and how much per-thread
// scratch a block needs. The cost model and the code generator both read
// it, so what is predicted is what is emitted.
//
// Structure of the emitted nest (CPU):
//   parallel for each block (tiles of the block dims):
//     for each op, in chain order:
//       sum op:  for each tile of its non-block output dims   (out loops)
//                  zero acc
//                  for each tile of its reduced dims          (reduce loops)
//                    pack A side; pack B side                 (hoisted, see below)
//                    micro-kernel: acc += A * B
//                  store acc
//       map / softmax op: over the block's tile x full extents of other dims
// A loop whose tile equals its extent has one trip and vanishes. A pack
// holds batch x (rows or cols) x reduced dims of its side and sits just
// inside the innermost remaining loop over one of those dims, so it is
// hoisted out of the loops over the other side's dims (MCFuser's
// memory-access optimization: with one reduce tile, A is loaded once per
// block instead of once per column tile), and its LP_set shrinks with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/hw/target.h"
#include "common/ir/chain.h"
#include "common/space/schedule.h"

namespace fusor::space {

// Dims every op can be tiled along together: each op's output has the dim,
// every read of an op result indexes that axis with the plain dim (and no
// other axis with it), and no softmax normalizes along it.
std::vector<int> FusableDims(const ir::Chain& chain);

// How a sum op's body maps onto a GEMM-shaped micro-kernel: the product of
// the A-side factors (which do not depend on the op's last output dim) times
// the B-side factors (which do). Output dims read by both sides are batch
// dims, by the B side only column dims, the rest row dims.
struct GemmForm {
  bool ok = false;  // false: the body is not a product; the generic path is used
  double scale = 1;
  std::vector<ir::Access> a_side, b_side;
  std::vector<int> batch, rows, cols;  // in output index order
};
GemmForm AnalyzeGemmForm(const ir::Op& op, const ir::Chain& chain);

enum class StmtKind { kLoad, kCompute, kStore };

struct Statement {
  StmtKind kind = StmtKind::kCompute;
  int op = -1;
  int tensor = -1;         // loads and stores: the tensor in global memory
  std::string label;       // e.g. "L(K)", "C(S)", "S(O)"
  double bytes = 0;        // TS, per execution
  double flops = 0;        // Fp, per execution
  std::vector<int> loops;  // LP_set: dims whose loops still enclose it
  double executions = 0;   // product of the trip counts of `loops`
};

struct OpNest {
  int op = -1;
  GemmForm gemm;
  // The op's own tile loops (trip count > 1), outermost first: non-block
  // output dims, then reduced dims.
  std::vector<int> loops;
  int num_out_loops = 0;
  // Packs of the A and B sides sit inside the first a_depth / b_depth loops.
  int a_depth = 0;
  int b_depth = 0;
  // Tile sizes of the GEMM view, and the scratch they take (floats).
  int64_t batch_tile = 1, rows_tile = 1, cols_tile = 1, k_tile = 1;
  int64_t rows_pad = 1, cols_pad = 1;
  int64_t acc_floats = 0, pack_a_floats = 0, pack_b_floats = 0, row_floats = 0;
};

struct LoopNest {
  Schedule schedule;
  hw::CpuMicroKernel kernel;
  std::vector<int64_t> trips;  // per dim: ceil(extent / tile)
  int64_t num_blocks = 1;
  std::vector<OpNest> ops;     // parallel to chain.ops
  std::vector<Statement> statements;
  // Per tensor: floats of its block-local buffer (intermediates and outputs
  // read by a later op), 0 for tensors without one.
  std::vector<int64_t> local_floats;
  int64_t scratch_bytes = 0;   // per thread: local buffers + largest op temporaries
};

// INVALID_ARGUMENT when the schedule does not fit the chain (unknown or
// non-fusable block dim, tile out of range).
absl::StatusOr<LoopNest> BuildLoopNest(const ir::Chain& chain, const Schedule& schedule,
                                       const hw::CpuMicroKernel& kernel);

// Whether tensor `t` needs a block-local buffer: it is computed by an op
// and read by a later one.
bool NeedsLocalBuffer(const ir::Chain& chain, int t);

}  // namespace fusor::space
