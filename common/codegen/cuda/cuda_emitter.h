// The emitter of the fused CUDA kernel (cuda_codegen.h), internal to the
// CUDA code generator. It walks the nest with NestWalker (the
// register-resident kernel, of one fixed shape, is emitted on its own); its
// members are defined by concern:
//  - cuda_codegen.cc: the kernel's head and arguments, the helpers every
//    part uses, map ops and sums no intrinsic takes;
//  - cuda_layout.cc: the plan of dynamic shared memory (local buffers,
//    temporaries, staged tiles) and the pointers into it;
//  - cuda_staging.cc: operand tiles staged in shared memory (cp.async or a
//    gather), the two-stage pipeline, and where in the nest tiles are
//    staged;
//  - cuda_mma.cc: mma.sync fragments (ldmatrix) and the warps' tile product;
//  - cuda_softmax.cc: softmax rows, and the register-resident kernel
//    (FlashAttention);
//  - cuda_epilogue.cc: finished sums stored, results completed after the
//    stream loop written out.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/codegen/cuda/cuda_codegen.h"
#include "common/codegen/nest_walker.h"
#include "common/ir/chain.h"
#include "common/space/loop_nest.h"

namespace fusor::codegen::cuda {

inline int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The matrix instruction of an mma.sync intrinsic.
enum class MmaKind { kF16, kBF16, kTF32 };

// How one side of a GEMM-shaped op is staged in shared memory:
// [batch][own][k] (k-major: rows of k, ldmatrix straight) or
// [batch][k][own] (own-major: rows of own, ldmatrix .trans), each row
// padded by a skew against bank conflicts.
struct SideLayout {
  bool k_major = true;
  int64_t own_pad = 0;  // static: rows of A (multiple of 16) or columns of B (of 8)
  int64_t ld = 0;       // elements per staged row
  int64_t bytes = 0;
  int64_t offset = 0;
  int contiguous = -1;  // cp.async: the dim contiguous in global memory along a staged row
  // Staged anew at every step of one loop (the stream loop, or the own
  // loop it sits just inside) with cp.async: one buffer per stage (2 or
  // 3), the tiles of the next steps prefetched while this one is read.
  bool pipelined = false;
  int loop_dim = -1;  // the loop it is prefetched across
  int64_t stage_elems = 0;
};

struct GemmLayout {
  MmaKind kind = MmaKind::kF16;
  int elem_bytes = 2;
  int kstep = 16;
  int64_t k_pad = 0;  // static
  int nf = 1;         // n-fragments of 8 columns per warp unit
  SideLayout a, b;
};

class CudaEmitter : public NestWalker {
 public:
  CudaEmitter(const ir::Chain& chain, const space::LoopNest& nest);

  absl::StatusOr<CudaKernel> Emit(const std::string& schedule_text, const std::string& mapping);

 private:
  // ------------------------------------------ layout (cuda_layout.cc) ---

  std::string StorageType() const { return chain_.dtype == ir::DType::kF32 ? "float" : "fusor_u16"; }
  absl::Status Layout();
  absl::Status PlanGemm(const space::OpNest& on, GemmLayout& g) const;
  void DeclareSharedPointers();
  absl::Status RegisterLayout();

  // ------------------------------------------ common (cuda_codegen.cc) ---

  void Sync() { w_.Line("__syncthreads();"); }
  // Defines i_d and v_d for `dims` from the flat index `flat` over their
  // ranges (the last dim fastest).
  void Decompose(const std::string& flat, const std::vector<int>& dims);
  // for (p = tid; p < count; p += threads) over the points of `dims`.
  void OpenParallelPoints(const std::vector<int>& dims);
  void ZeroShared(const std::string& ptr, int64_t floats);
  // A split stream loop (space::SplitProblem): this block's part and
  // tile, the loop over the part's steps, and after it the part's share
  // handed over: `combine` runs in the tile's last block to arrive, whose
  // counter at `counters` (floats into the workspace) it then resets.
  std::string TileIndex() const {
    return nest_.split > 1 ? absl::StrCat("blockIdx.x / ", nest_.split, "L") : "blockIdx.x";
  }
  void DefineSplitPart();
  void OpenStreamTiles();
  void CountInAndCombine(int64_t counters, const std::function<void()>& combine);

  void ZeroAccumulated(const space::OpNest& on) override;
  void EmitMap(const ir::Op& op, const space::OpNest& on) override;
  void AccumulateSum(const ir::Op& op, const space::OpNest& on) override;

  // ---------------------------------------- staging (cuda_staging.cc) ---

  // Runtime sizes of the op's current tile: batch points, the own extent of
  // one side (rows of A, columns of B) or both, k, and their pads.
  enum class Sides { kA, kB, kBoth };
  void DefineGemmSizes(const space::OpNest& on, Sides sides);
  std::string PackIndex(const SideLayout& side, const GemmLayout& l, const std::string& bi, const std::string& x,
                        const std::string& kk) const;
  void Pack(const space::OpNest& on, bool a_side) override { Stage(on, a_side, /*wait=*/true); }
  void Stage(const space::OpNest& on, bool a_side, bool wait);
  void PackGather(const space::OpNest& on, const SideLayout& side, const std::vector<int>& own,
                  const std::string& buf, bool a_side);
  std::string PackConvert(const GemmLayout& l, const std::string& v) const;
  void PackAsync(const space::OpNest& on, const SideLayout& side, const std::vector<int>& own,
                 const std::string& buf);
  int64_t FullTileBatch(const space::OpNest& on, const SideLayout& side, const std::vector<int>& own) const;

  const SideLayout& SideOf(const space::OpNest& on, bool a_side) const {
    return a_side ? gemm_[on.op].a : gemm_[on.op].b;
  }
  static int DepthOf(const space::OpNest& on, bool a_side) { return a_side ? on.a_depth : on.b_depth; }
  std::string StageType(const space::OpNest& on) const {
    return gemm_[on.op].kind == MmaKind::kTF32 ? "float" : "fusor_u16";
  }
  std::string StageVar(int d) const { return "stage_" + chain_.dims[d].name; }
  // Where this block's loop over `d` begins and ends: the part_lo and
  // part_hi of a split stream loop, e_<d> for a causal axis the block ends
  // early, else the whole extent.
  bool SplitLoop(int d) const { return nest_.split > 1 && d == nest_.stream_dim; }
  std::string LoopEnd(int d) const {
    if (SplitLoop(d)) return "part_hi";
    return x_.Bounded(d, nullptr) ? n_.E(d) : absl::StrCat(chain_.dims[d].extent, "L");
  }
  void DefineStage(int d);
  std::string StagePointer(const space::OpNest& on, bool a_side, const std::string& stage) const;
  void CurrentStage(const space::OpNest& on, bool a_side);
  void FirstStages(const std::vector<std::pair<const space::OpNest*, bool>>& sides,
                   const std::function<void(const space::OpNest&)>& ranges);
  void Prefetch(const space::OpNest& on, bool a_side);
  void CommitAndWaitForThisStep();

  const char* HoistedNote() const override { return ": operands staged once, outside the stream loop"; }
  void OpenStreamLoop() override;
  void StageAtLevel(const space::OpNest& on, int level) override;
  void OpenOwnLoop(const space::OpNest& on, int level) override;

  // ------------------------------------------------ mma (cuda_mma.cc) ---

  void LoadAFragment(const GemmLayout& l, const std::string& buf, const std::string& a, const std::string& bi,
                     const std::string& r0, const std::string& kk);
  void LoadBFragment(const GemmLayout& l, const std::string& buf, const std::string& b, const std::string& bi,
                     const std::string& n0, const std::string& kk);
  void LoadBFragmentPair(const GemmLayout& l, const std::string& buf, const std::string& b, const std::string& n0,
                         const std::string& kk);
  void Mma(const GemmLayout& l, const std::string& c, const std::string& a, const std::string& b);
  void MmaTile(const space::OpNest& on);
  void TileProduct(const space::OpNest& on) override;

  // ---------------------------------------- softmax (cuda_softmax.cc) ---

  void WarpReduce(const std::string& var, bool max);
  void ResetOnlineState(const space::OpNest& on) override;
  void EmitSoftmax(const ir::Op& op, const space::OpNest& on) override;

  // The register-resident kernel's fragments per warp: rf row fragments
  // of 16 rows; per row fragment, S's accumulator (nfs fragments of 8
  // columns) and its mma's k steps (ks), O's accumulator (nfo) and its
  // mma's k steps (kp).
  struct RegisterFragments {
    int64_t rf = 1, nfs = 0, ks = 0, nfo = 0, kp = 0;
  };
  int LastOp() const { return static_cast<int>(chain_.ops.size()) - 1; }
  int SoftmaxOp() const;
  void StageStep(const space::OpNest& on);
  std::string RegisterValue(int t, double scale) const;
  void ForEachRowFragment(const RegisterFragments& f, const std::function<void()>& body);
  void ForEachColumnBlock(const GemmLayout& l, int64_t count, const std::function<void(int)>& body);
  void EmitFragmentMma(const GemmLayout& l, const RegisterFragments& f, const std::string& buf, const std::string& c,
                       const std::string& a, int blocks);
  void EmitRegisterResident();
  void DefineRegisterStaging();
  void LoadQFragments(const RegisterFragments& f);
  void EmitScoreMma(const RegisterFragments& f);
  void EmitScoreOps(const RegisterFragments& f);
  void EmitFragmentSoftmax(const RegisterFragments& f);
  void EmitProbabilityMma(const RegisterFragments& f);
  void OpenRowTotals();
  void EmitRegisterStore(const RegisterFragments& f);
  void StoreOutputElement(const std::string& value);
  void EmitSplitStore(const RegisterFragments& f);
  void EmitSplitCombine();

  // -------------------------------------- epilogue (cuda_epilogue.cc) ---

  void StoreSum(const ir::Op& op, const space::OpNest& on) override;
  void WriteComplete(const space::OpNest& on, bool output) override;
  // A split stream loop in shared memory: the workspace offset (floats)
  // of each accumulated output's parts, and after the walk, the tile's
  // last part summing them into the outputs.
  int64_t SplitPartsOffset(int op) const;
  void EmitSharedSplitCombine();

  const int threads_;
  const int stages_;
  std::vector<int64_t> local_offset_;  // bytes into shared memory; -1: none
  std::vector<int64_t> temp_offset_;   // per op
  std::vector<GemmLayout> gemm_;       // per op
  int64_t shared_bytes_ = 0;
  int64_t workspace_bytes_ = 0;
};

}  // namespace fusor::codegen::cuda
