// The walk of a fused loop nest (space::LoopNest) that the CPU and CUDA
// code generators share: the order in which a block's ops, the stream
// loop and each sum's own loops are emitted. A generator derives from
// NestWalker and writes what it emits at each point in the hooks.
//
// WalkBlock emits, inside a block whose origins the generator has defined:
//   the ops of Region::kBefore, in chain order                  EmitOp
//   when the nest has a stream loop:                            EmitStream
//     "// stream loop over <dim>"
//     each accumulated result zeroed, each online softmax's
//     state reset                      ZeroAccumulated, ResetOnlineState
//     the operands hoisted out of the loop, staged once             Pack
//     the loop                                            OpenStreamLoop
//       the ops of Region::kStream, in chain order              EmitOp
//     each accumulated result, now complete                 EmitFinalize
//   the ops of Region::kAfter, in chain order                   EmitOp
// EmitOp: "// <op>", a scope with the op's full ranges defined, then
//   a map                                                        EmitMap
//   a softmax (plain or online)                              EmitSoftmax
//   a sum, over its own loops (output dims, then reduced dims):  EmitSum
//     at each depth, before the next own loop opens    StageAtLevel, OpenOwnLoop
//     innermost, a GEMM-shaped sum: per point of the reduced dims on
//       no intrinsic axis, the operands that depend on them      Pack
//       and the product of the tile                          TileProduct
//     innermost, any other sum                             AccumulateSum
//     once the reduction loops close, the result             StoreSum
#pragma once

#include <string>

#include "common/codegen/emit.h"
#include "common/ir/chain.h"
#include "common/space/loop_nest.h"

namespace fusor::codegen {

class NestWalker {
 public:
  NestWalker(const ir::Chain& chain, const space::LoopNest& nest);
  virtual ~NestWalker() = default;

 protected:
  // Every op of the block, the stream loop included, in order.
  void WalkBlock();

  // Whether one side of a GEMM-shaped sum is staged just inside its first
  // `level` own loops: neither hoisted out of the stream loop, nor staged
  // per point of its outer reduced dims, nor read in place.
  bool StagedAtLevel(const space::OpNest& on, bool a_side, int level) const;

  // ---------------------------------------------------------- hooks ---

  // Before the stream loop: an accumulated result's block-local buffer to
  // zero; an online softmax's running max and sum to reset.
  virtual void ZeroAccumulated(const space::OpNest& on) = 0;
  virtual void ResetOnlineState(const space::OpNest& on) = 0;
  // The comment after the result's name above the operands staged once
  // before the stream loop.
  virtual const char* HoistedNote() const = 0;
  // Opens the stream loop (and whatever precedes it at that point) and
  // defines the stream dim's origin and range.
  virtual void OpenStreamLoop() = 0;
  // The body of the scope in which an accumulated result, complete after
  // the stream loop, is normalized and written out (`output`: a chain
  // output); its dims' ranges are defined.
  virtual void WriteComplete(const space::OpNest& on, bool output) = 0;

  virtual void EmitMap(const ir::Op& op, const space::OpNest& on) = 0;
  virtual void EmitSoftmax(const ir::Op& op, const space::OpNest& on) = 0;

  // Sums: what sits just inside the first `level` own loops, before the
  // next opens (level == loops.size(): innermost); opening own loop
  // `level`; the innermost product of a GEMM-shaped sum's tile, or the
  // reduction of any other sum; the finished result.
  virtual void StageAtLevel(const space::OpNest& on, int level) = 0;
  virtual void OpenOwnLoop(const space::OpNest& on, int level);
  virtual void TileProduct(const space::OpNest& on) = 0;
  virtual void AccumulateSum(const ir::Op& op, const space::OpNest& on) = 0;
  virtual void StoreSum(const ir::Op& op, const space::OpNest& on) = 0;
  // Stages one side of a GEMM-shaped sum's current tile.
  virtual void Pack(const space::OpNest& on, bool a_side) = 0;
  // A GEMM-shaped sum whose A (B) side the product reads where it is, unstaged.
  virtual bool ReadsAInPlace(const space::OpNest& on) const { return false; }
  virtual bool ReadsBInPlace(const space::OpNest& on) const { return false; }
  // The unmapped reduced dim whose points all read one B pack (a
  // convolution's window row), looped innermost; -1: B is packed per point.
  virtual int WindowDim(const space::OpNest& on) const { return -1; }
  // Whether TileProduct loops over the unmapped reduced dims itself (its
  // tile's sum over every point in registers), after B is packed for every
  // point (one pack per point of them but the window dim).
  virtual bool PointsInKernel(const space::OpNest& on) const { return false; }
  // The unmapped reduced dims but the window dim: B has a pack per point.
  std::vector<int> PackPoints(const space::OpNest& on) const;

  const ir::Chain& chain_;
  const space::LoopNest& nest_;
  const space::Schedule& s_;
  emit::Names n_;
  emit::NestIndex x_;
  emit::Writer w_;

 private:
  void EmitRegion(space::Region region);
  void EmitStream();
  void EmitOp(const space::OpNest& on);
  void EmitSum(const ir::Op& op, const space::OpNest& on);
  void EmitFinalize(const space::OpNest& on);
};

}  // namespace fusor::codegen
