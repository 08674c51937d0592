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
  const std::string at = absl::StrCat(n_.Local(op.output), "[", x_.LocalOffset(emit::NestIndex::SelfAccess(op)), "]");
  if (on.online_softmax >= 0) {
    w_.Line(absl::StrCat(at, " /= ssum", on.online_softmax, "[", x_.StateOffset(chain_.ops[on.online_softmax]),
                         "];"));
  }
  if (output) {
    w_.Line(absl::StrCat(n_.Global(op.output), "[", GlobalOffset(emit::NestIndex::SelfAccess(op), n_), "] = ",
                         StoreConvert(chain_.dtype, at), ";"));
  }
  w_.Close();
  Sync();
}

}  // namespace fusor::codegen::cuda
