#include "common/codegen/cuda/cuda_emitter.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fusor::codegen::cuda {

using emit::FlatIndex;
using emit::FloatLit;
using emit::GlobalOffset;
using emit::StoreConvert;
using ir::Op;

// A finished sum, from its accumulator to its destinations, one thread per
// point.
void CudaEmitter::StoreSum(const Op& op, const space::OpNest& on) {
  if (!on.gemm.ok) {
    Sync();
    OpenParallelPoints(op.index);
    x_.Store(w_, on, absl::StrCat("acc", on.op, "[p]"));
    w_.Close();
    Sync();
    return;
  }
  // The finished tile, scaled, to its destinations.
  const space::GemmForm& g = on.gemm;
  w_.Open("");
  std::vector<int> dims = g.batch;
  dims.insert(dims.end(), g.rows.begin(), g.rows.end());
  dims.insert(dims.end(), g.cols.begin(), g.cols.end());
  OpenParallelPoints(dims);
  std::string value = absl::StrCat("acc", on.op, "[((", FlatIndex(g.batch, n_), ") * ", on.rows_pad, "L + (",
                                   FlatIndex(g.rows, n_), ")) * ", on.cols_pad, "L + (", FlatIndex(g.cols, n_), ")]");
  if (g.scale != 1) value = absl::StrCat(value, " * ", FloatLit(g.scale));
  x_.Store(w_, on, value);
  w_.Close();
  Sync();
  w_.Close();
}

// After the stream loop: divide by the online softmax's sums, write out.
void CudaEmitter::WriteComplete(const space::OpNest& on, bool output) {
  const Op& op = chain_.ops[on.op];
  OpenParallelPoints(op.index);
  const std::string at = absl::StrCat(n_.Local(op.output), "[", x_.LocalOffset(ir::ResultAccess(op)), "]");
  if (on.online_softmax >= 0) {
    w_.Line(absl::StrCat(at, " /= ssum", on.online_softmax, "[", x_.StateOffset(chain_.ops[on.online_softmax]),
                         "];"));
  }
  if (output && nest_.split > 1 && on.accumulates) {
    // This part's share, to the workspace (EmitSharedSplitCombine).
    w_.Line(absl::StrCat("((float*)args.work)[", SplitPartsOffset(on.op), "L + blockIdx.x * ",
                         nest_.local[op.output].floats, "L + ", x_.LocalOffset(ir::ResultAccess(op)),
                         "] = ", at, ";"));
  } else if (output) {
    w_.Line(absl::StrCat(n_.Global(op.output), "[", GlobalOffset(ir::ResultAccess(op), n_), "] = ",
                         StoreConvert(chain_.dtype, at), ";"));
  }
  w_.Close();
  Sync();
}

int64_t CudaEmitter::SplitPartsOffset(int op) const {
  int64_t offset = 0;
  for (const space::OpNest& on : nest_.ops) {
    if (on.op == op) return offset;
    if (on.accumulates) offset += nest_.num_blocks * nest_.local[chain_.ops[on.op].output].floats;
  }
  return offset;
}

// Every part has written its share of each accumulated output (the
// outputs nothing reads, SplitProblem): the tile's last part to count
// itself in sums them into the outputs and resets the tile's counter.
void CudaEmitter::EmitSharedSplitCombine() {
  const int split = nest_.split;
  const int64_t parts_floats = SplitPartsOffset(static_cast<int>(nest_.ops.size()));
  workspace_bytes_ = parts_floats * 4 + nest_.num_blocks / split * 4;
  CountInAndCombine(parts_floats, [&] {
    for (const space::OpNest& on : nest_.ops) {
      if (!on.accumulates) continue;
      const Op& op = chain_.ops[on.op];
      const int64_t floats = nest_.local[op.output].floats;
      w_.Line(absl::StrCat("// ", chain_.tensors[op.output].name));
      w_.Open("");
      for (int d : op.index) {
        if (!x_.IsBlock(d)) {
          w_.Line(absl::StrCat("const long ", n_.O(d), " = 0, ", n_.N(d), " = ", chain_.dims[d].extent, "L;"));
        }
      }
      OpenParallelPoints(op.index);
      w_.Line(absl::StrCat("const float* const parts = work + ", SplitPartsOffset(on.op), "L + tile_id * ",
                           split * floats, "L + ", x_.LocalOffset(ir::ResultAccess(op)), ";"));
      w_.Line("float sum = 0.0f;");
      w_.Line(absl::StrCat("for (int q = 0; q < ", split, "; ++q) sum += fusor_load_cg(parts + q * ", floats, "L);"));
      w_.Line(absl::StrCat(n_.Global(op.output), "[", GlobalOffset(ir::ResultAccess(op), n_), "] = ",
                           StoreConvert(chain_.dtype, "sum"), ";"));
      w_.Close();
      w_.Close();
    }
  });
}

}  // namespace fusor::codegen::cuda
