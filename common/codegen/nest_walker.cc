#include "common/codegen/nest_walker.h"

#include "absl/strings/str_cat.h"

namespace fusor::codegen {

NestWalker::NestWalker(const ir::Chain& chain, const space::LoopNest& nest)
    : chain_(chain), nest_(nest), s_(nest.schedule), n_{chain}, x_(chain, nest) {}

void NestWalker::WalkBlock() {
  EmitRegion(space::Region::kBefore);
  if (nest_.stream_dim >= 0) EmitStream();
  EmitRegion(space::Region::kAfter);
}

bool NestWalker::StagedAtLevel(const space::OpNest& on, bool a_side, int level) const {
  if (!on.gemm.ok) return false;
  if (a_side) return on.a_depth == level && !on.a_hoisted && !on.a_per_point && !ReadsAInPlace(on);
  return on.b_depth == level && !on.b_hoisted && !on.b_per_point && !ReadsBInPlace(on);
}

void NestWalker::OpenOwnLoop(const space::OpNest& on, int level) { x_.OpenTileLoop(w_, on.loops[level], &on); }

void NestWalker::EmitRegion(space::Region region) {
  for (const space::OpNest& on : nest_.ops) {
    if (on.region == region) EmitOp(on);
  }
}

void NestWalker::EmitStream() {
  w_.Line(absl::StrCat("// stream loop over ", chain_.dims[nest_.stream_dim].name));
  for (const space::OpNest& on : nest_.ops) {
    if (on.accumulates) ZeroAccumulated(on);
    if (on.online) ResetOnlineState(on);
  }
  for (const space::OpNest& on : nest_.ops) {
    const bool pack_a = on.a_hoisted && !ReadsAInPlace(on), pack_b = on.b_hoisted && !ReadsBInPlace(on);
    if (on.region != space::Region::kStream || !on.gemm.ok || !(pack_a || pack_b)) continue;
    w_.Line(absl::StrCat("// ", chain_.tensors[chain_.ops[on.op].output].name, HoistedNote()));
    w_.Open("");
    x_.DefineFullRanges(w_, on, /*in_stream=*/false);
    if (pack_a) Pack(on, true);
    if (pack_b) Pack(on, false);
    w_.Close();
  }
  OpenStreamLoop();
  EmitRegion(space::Region::kStream);
  w_.Close();
  for (const space::OpNest& on : nest_.ops) {
    if (on.accumulates) EmitFinalize(on);
  }
}

void NestWalker::EmitOp(const space::OpNest& on) {
  const ir::Op& op = chain_.ops[on.op];
  w_.Line(absl::StrCat("// ", ir::OpToString(op, chain_)));
  w_.Open("");
  x_.DefineFullRanges(w_, on);
  if (op.kind == ir::OpKind::kSum) {
    EmitSum(op, on);
  } else if (op.kind == ir::OpKind::kMap) {
    EmitMap(op, on);
  } else {
    EmitSoftmax(op, on);
  }
  w_.Close();
}

std::vector<int> NestWalker::PackPoints(const space::OpNest& on) const {
  std::vector<int> points;
  for (int d : on.gemm.outer_reduce) {
    if (d != WindowDim(on)) points.push_back(d);
  }
  return points;
}

void NestWalker::EmitSum(const ir::Op& op, const space::OpNest& on) {
  const int num_loops = static_cast<int>(on.loops.size());
  for (int level = 0; level <= num_loops; ++level) {
    StageAtLevel(on, level);
    if (level < num_loops) OpenOwnLoop(on, level);
  }
  if (on.gemm.ok) {
    // The reduced dims no intrinsic axis took: once per point of them (but
    // the window dim, whose points share one pack of B) the operands that
    // depend on them are staged, and the tile's product taken; or the
    // micro-kernels sum over every point themselves, after every point's B.
    const int window = WindowDim(on);
    const std::vector<int> points = PackPoints(on);
    w_.Open("");
    if (PointsInKernel(on)) {
      if (on.b_per_point) {
        const int outer = emit::OpenPointLoops(w_, points, n_);
        Pack(on, false);
        emit::CloseScopes(w_, outer);
      }
      TileProduct(on);
    } else {
      int outer = emit::OpenPointLoops(w_, points, n_);
      if (window >= 0) {
        Pack(on, false);
        outer += emit::OpenPointLoops(w_, {window}, n_);
      }
      if (on.a_per_point && !ReadsAInPlace(on)) Pack(on, true);
      if (on.b_per_point && window < 0) Pack(on, false);
      TileProduct(on);
      emit::CloseScopes(w_, outer);
    }
    w_.Close();
  } else {
    AccumulateSum(op, on);
  }
  emit::CloseScopes(w_, num_loops - on.num_out_loops);
  StoreSum(op, on);
  emit::CloseScopes(w_, on.num_out_loops);
}

void NestWalker::EmitFinalize(const space::OpNest& on) {
  const ir::Op& op = chain_.ops[on.op];
  const bool output = chain_.tensors[op.output].role == ir::TensorRole::kOutput;
  if (on.online_softmax < 0 && !output) return;
  w_.Line(absl::StrCat("// ", chain_.tensors[op.output].name, " is complete"));
  w_.Open("");
  for (int d : op.index) {
    if (!x_.IsBlock(d)) {
      w_.Line(absl::StrCat("const long ", n_.O(d), " = 0, ", n_.N(d), " = ", n_.Extent(d), ";"));
    }
  }
  WriteComplete(on, output);
  w_.Close();
}

}  // namespace fusor::codegen
