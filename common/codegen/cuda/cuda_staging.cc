#include "common/codegen/cuda/cuda_emitter.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace fusor::codegen::cuda {

using emit::Count;
using emit::GlobalOffset;
using emit::ProductToC;
using ir::Access;

void CudaEmitter::DefineGemmSizes(const space::OpNest& on, Sides sides) {
  const space::GemmForm& g = on.gemm;
  const GemmLayout& l = gemm_[on.op];
  w_.Line(absl::StrCat("const long nb = ", Count(g.batch, n_), ", kc = ", Count(g.kdims, n_), ", kc_pad = (kc + ",
                       l.kstep - 1, "L) / ", l.kstep, "L * ", l.kstep, "L;"));
  if (sides != Sides::kB) {
    w_.Line(absl::StrCat("const long rows = ", Count(g.rows, n_), ", rows_pad = (rows + 15L) / 16L * 16L;"));
  }
  if (sides != Sides::kA) {
    w_.Line(absl::StrCat("const long cols = ", Count(g.cols, n_), ", cols_pad = (cols + 7L) / 8L * 8L;"));
  }
}

std::string CudaEmitter::PackIndex(const SideLayout& side, const GemmLayout& l, const std::string& bi,
                                   const std::string& x, const std::string& kk) const {
  if (side.k_major) return absl::StrCat("((", bi, ") * ", side.own_pad, "L + (", x, ")) * ", side.ld, "L + (", kk, ")");
  return absl::StrCat("((", bi, ") * ", l.k_pad, "L + (", kk, ")) * ", side.ld, "L + (", x, ")");
}

// Stages one side of the op's current tile in shared memory (the caller
// synchronizes before the tile is read). With `wait` false, cp.async
// copies are only issued: the caller commits and waits.
void CudaEmitter::Stage(const space::OpNest& on, bool a_side, bool wait) {
  const space::GemmForm& g = on.gemm;
  const GemmLayout& l = gemm_[on.op];
  const SideLayout& side = a_side ? l.a : l.b;
  const std::vector<int>& own = a_side ? g.rows : g.cols;
  const std::string buf = absl::StrCat(a_side ? "pa" : "pb", on.op);
  w_.Line(absl::StrCat("// stage ", a_side ? "A" : "B", " (", side.k_major ? "k-major" : "own-major",
                       side.contiguous >= 0 ? ", cp.async" : ", gather", ")"));
  w_.Open("");
  DefineGemmSizes(on, a_side ? Sides::kA : Sides::kB);
  w_.Line(absl::StrCat("const long own = ", a_side ? "rows" : "cols", ", own_pad = ", a_side ? "rows_pad" : "cols_pad",
                       ";"));
  if (side.contiguous >= 0) {
    PackAsync(on, side, own, buf);
    if (wait) {
      w_.Line("fusor_cp_async_commit();");
      w_.Line("fusor_cp_async_wait<0>();");
    }
  } else {
    PackGather(on, side, own, buf, a_side);
  }
  w_.Close();
}

void CudaEmitter::PackGather(const space::OpNest& on, const SideLayout& side, const std::vector<int>& own,
                             const std::string& buf, bool a_side) {
  const space::GemmForm& g = on.gemm;
  const GemmLayout& l = gemm_[on.op];
  w_.Open(absl::StrCat("for (long p = tid; p < nb * own_pad * kc_pad; p += ", threads_, ")"));
  if (side.k_major) {
    w_.Line("const long kk = p % kc_pad, x = (p / kc_pad) % own_pad, bi = p / (kc_pad * own_pad);");
  } else {
    w_.Line("const long x = p % own_pad, kk = (p / own_pad) % kc_pad, bi = p / (kc_pad * own_pad);");
  }
  w_.Line("float value = 0.0f;");
  w_.Open("if (x < own && kk < kc)");
  Decompose("bi", g.batch);
  Decompose("x", own);
  Decompose("kk", g.kdims);
  w_.Line(absl::StrCat("value = ", ProductToC(a_side ? g.a_side : g.b_side, 1,
                                              [this](const Access& a) { return x_.Load(a); }),
                       ";"));
  w_.Close();
  w_.Line(absl::StrCat(buf, "[", PackIndex(side, l, "bi", "x", "kk"), "] = ", PackConvert(l, "value"), ";"));
  w_.Close();
}

std::string CudaEmitter::PackConvert(const GemmLayout& l, const std::string& v) const {
  switch (l.kind) {
    case MmaKind::kF16: return absl::StrCat("fusor_f32_to_f16(", v, ")");
    case MmaKind::kBF16: return absl::StrCat("fusor_f32_to_bf16(", v, ")");
    case MmaKind::kTF32: return absl::StrCat("fusor_round_tf32(", v, ")");
  }
  return v;
}

// A thread's copies of one full tile unrolled at most: each may keep its
// offsets in registers (with 1 warp and a 64 x 64 f32 tile, 32 of them
// made the register-resident picks spill).
constexpr int64_t kMaxUnrolledCopies = 8;

// 16-byte cp.async chunks along the staged rows (8 16-bit or 4 f32
// elements each), the tail of a row and the padding rows zero-filled.
void CudaEmitter::PackAsync(const space::OpNest& on, const SideLayout& side, const std::vector<int>& own,
                            const std::string& buf) {
  const space::GemmForm& g = on.gemm;
  const GemmLayout& l = gemm_[on.op];
  const std::vector<int>& other = side.k_major ? own : g.kdims;
  const std::string rows = side.k_major ? "own_pad" : "kc_pad", row_len = side.k_major ? "kc" : "own",
                    row_pad = side.k_major ? "kc_pad" : "own_pad", other_len = side.k_major ? "own" : "kc";
  const Access& a = (&side == &l.a ? g.a_side : g.b_side)[0];  // the side's one global access
  const int c = side.contiguous;
  const int chunk = 16 / l.elem_bytes;  // elements per 16-byte copy
  const int64_t nb = FullTileBatch(on, side, own);
  const int64_t rows_n = side.k_major ? side.own_pad : l.k_pad, chunks_n = (side.k_major ? l.k_pad : side.own_pad) / chunk;
  const int64_t total = nb * rows_n * chunks_n, iterations = (total + threads_ - 1) / threads_;
  if (nb > 0 && iterations <= kMaxUnrolledCopies) {
    // Every step's tile fills its pads: each thread's copies are full, at
    // offsets fixed but for the loops' origins, a few of them (unrolled,
    // their offsets may stay in registers across the loop).
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int it = 0; it < ", iterations, "; ++it)"));
    w_.Line(absl::StrCat("const long p = tid + it * ", threads_, "L;"));
    if (total % threads_ != 0) w_.Line(absl::StrCat("if (p >= ", total, "L) break;"));
    w_.Line(absl::StrCat("const long chunk = p % ", chunks_n, "L, y = (p / ", chunks_n, "L) % ", rows_n,
                         "L, bi = p / ", chunks_n * rows_n, "L;"));
    w_.Line(absl::StrCat("const long e0 = chunk * ", chunk, "L;"));
    Decompose("bi", g.batch);
    Decompose("y", other);
    w_.Line(absl::StrCat("const long ", n_.I(c), " = e0, ", n_.V(c), " = ", n_.O(c), " + e0;"));
    const std::string at = side.k_major ? PackIndex(side, l, "bi", "y", "e0") : PackIndex(side, l, "bi", "e0", "y");
    w_.Line(absl::StrCat("fusor_cp_async16(", buf, " + ", at, ", ", n_.Global(a.tensor), " + ", GlobalOffset(a, n_),
                         ", 16);"));
    w_.Close();
    return;
  }
  const std::string chunks = absl::StrCat("(", row_pad, " / ", chunk, "L)");
  w_.Open(absl::StrCat("for (long p = tid; p < nb * ", rows, " * ", chunks, "; p += ", threads_, ")"));
  w_.Line(absl::StrCat("const long chunk = p % ", chunks, ", y = (p / ", chunks, ") % ", rows, ", bi = p / (",
                       chunks, " * ", rows, ");"));
  w_.Line(absl::StrCat("const long e0 = chunk * ", chunk, "L;"));
  w_.Line(absl::StrCat("const long valid = y < ", other_len, " && e0 < ", row_len, " ? (", row_len, " - e0 < ",
                       chunk, "L ? ", row_len, " - e0 : ", chunk, "L) : 0;"));
  w_.Line(absl::StrCat("const ", StorageType(), "* src = ", n_.Global(a.tensor), ";"));
  w_.Open("if (valid > 0)");
  Decompose("bi", g.batch);
  Decompose("y", other);
  w_.Line(absl::StrCat("const long ", n_.I(c), " = e0, ", n_.V(c), " = ", n_.O(c), " + e0;"));
  w_.Line(absl::StrCat("src += ", GlobalOffset(a, n_), ";"));
  w_.Close();
  const std::string at = side.k_major ? PackIndex(side, l, "bi", "y", "e0") : PackIndex(side, l, "bi", "e0", "y");
  w_.Line(absl::StrCat("fusor_cp_async16(", buf, " + ", at, ", src, (int)valid * ", l.elem_bytes, ");"));
  w_.Close();
}

// The tile's batch points when a side's tile has the same extents at
// every step and they fill its pads (own and k), else 0.
int64_t CudaEmitter::FullTileBatch(const space::OpNest& on, const SideLayout& side, const std::vector<int>& own) const {
  const space::GemmForm& g = on.gemm;
  auto fixed = [&](const std::vector<int>& dims) -> int64_t {
    int64_t count = 1;
    for (int d : dims) {
      if (chain_.dims[d].extent % s_.tile[d] != 0) return 0;
      count *= s_.tile[d];
    }
    return count;
  };
  if (fixed(own) != side.own_pad || fixed(g.kdims) != gemm_[on.op].k_pad) return 0;
  return fixed(g.batch);
}

// Which of the stages_ buffers the current step of `d`'s loop reads.
void CudaEmitter::DefineStage(int d) {
  const std::string step = SplitLoop(d) ? absl::StrCat("(", n_.O(d), " - part_lo)") : n_.O(d);
  w_.Line(absl::StrCat("const long ", StageVar(d), " = (", step, " / ", s_.tile[d], "L) % ", stages_, "L;"));
}

std::string CudaEmitter::StagePointer(const space::OpNest& on, bool a_side, const std::string& stage) const {
  const std::string name = absl::StrCat(a_side ? "pa" : "pb", on.op);
  return absl::StrCat(StageType(on), "* const ", name, " = ", name, "_stages + (", stage, ") * ",
                      SideOf(on, a_side).stage_elems, "L;");
}

void CudaEmitter::CurrentStage(const space::OpNest& on, bool a_side) {
  const SideLayout& side = SideOf(on, a_side);
  w_.Line(StagePointer(on, a_side, StageVar(side.loop_dim)));
}

// Before the loop: the first stages_ - 1 steps' tiles of `sides`, step k
// into stage k, each step one commit group (so that the loop's wait
// retires exactly the step it reads). Around `ranges`, which defines the
// ranges the staging reads.
void CudaEmitter::FirstStages(const std::vector<std::pair<const space::OpNest*, bool>>& sides,
                              const std::function<void(const space::OpNest&)>& ranges) {
  for (int k = 0; k + 1 < stages_; ++k) {
    for (const auto& [on, a_side] : sides) {
      const int d = SideOf(*on, a_side).loop_dim;
      const std::string origin =
          SplitLoop(d) ? absl::StrCat("(part_lo + ", k * s_.tile[d], "L)") : absl::StrCat(k * s_.tile[d], "L");
      w_.Line(absl::StrCat("// ", a_side ? "A" : "B", " of ", chain_.tensors[chain_.ops[on->op].output].name, ": ",
                           chain_.dims[d].name, " step ", k, "'s tile, into stage ", k));
      w_.Open(k == 0 ? "" : absl::StrCat("if (", origin, " < ", LoopEnd(d), ")"));
      ranges(*on);
      w_.Line(absl::StrCat("const long ", n_.O(d), " = ", origin, ", ", n_.N(d), " = ", x_.RangeOf(d, origin), ";"));
      w_.Line(StagePointer(*on, a_side, absl::StrCat(k, "L")));
      Stage(*on, a_side, /*wait=*/false);
      w_.Close();
    }
    w_.Line("fusor_cp_async_commit();");
  }
}

// Issues the cp.async copies of the tile stages_ - 1 steps ahead of one
// side into the stage it will be read from (nothing past the last step).
void CudaEmitter::Prefetch(const space::OpNest& on, bool a_side) {
  const int d = SideOf(on, a_side).loop_dim;
  const int ahead = stages_ - 1;
  w_.Line(absl::StrCat("// prefetch ", a_side ? "A" : "B", " of the ", chain_.dims[d].name, " step ", ahead,
                       " ahead"));
  w_.Open("");
  w_.Line(absl::StrCat("const long next_origin = ", n_.O(d), " + ", ahead * s_.tile[d], "L;"));
  w_.Open(absl::StrCat("if (next_origin < ", LoopEnd(d), ")"));
  w_.Line(absl::StrCat("const long ", n_.O(d), " = next_origin, ", n_.N(d), " = ", x_.RangeOf(d, "next_origin"),
                       ";"));
  w_.Line(StagePointer(on, a_side, absl::StrCat("(", StageVar(d), " + ", ahead, "L) % ", stages_, "L")));
  Stage(on, a_side, /*wait=*/false);
  w_.Close();
  w_.Close();
}

// In the loop, after this step's prefetch is issued: commit it, and wait
// for this step's tiles (committed stages_ - 1 steps earlier) while the
// later steps' stay in flight.
void CudaEmitter::CommitAndWaitForThisStep() {
  w_.Line("fusor_cp_async_commit();");
  w_.Line(absl::StrCat("fusor_cp_async_wait<", stages_ - 1, ">();"));
}

// Tiles pipelined across the stream loop: the first steps' before it.
void CudaEmitter::OpenStreamLoop() {
  const int sd = nest_.stream_dim;
  std::vector<std::pair<const space::OpNest*, bool>> sides;
  for (const space::OpNest& on : nest_.ops) {
    if (!on.gemm.ok || on.region != space::Region::kStream) continue;
    for (bool a_side : {true, false}) {
      const SideLayout& side = SideOf(on, a_side);
      if (side.pipelined && side.loop_dim == sd && DepthOf(on, a_side) == 0) sides.push_back({&on, a_side});
    }
  }
  FirstStages(sides, [this](const space::OpNest& on) { x_.DefineFullRanges(w_, on); });
  Sync();
  OpenStreamTiles();
  if (!sides.empty()) DefineStage(sd);
}

// The accumulator cleared inside the output loops, and the tiles staged
// at their depth: a pipelined one's stage picked and the next step's
// prefetched, any other staged and waited for.
void CudaEmitter::StageAtLevel(const space::OpNest& on, int level) {
  if (on.gemm.ok && level == 0) {
    // Tiles pipelined across the stream loop: the stage this step reads.
    for (bool a_side : {true, false}) {
      if (SideOf(on, a_side).pipelined && DepthOf(on, a_side) == 0) CurrentStage(on, a_side);
    }
  }
  bool staged = false;
  if (level == on.num_out_loops) {
    ZeroShared(absl::StrCat("acc", on.op), on.acc_floats);
    staged = true;
  }
  bool prefetched = false;
  for (bool a_side : {true, false}) {
    if (!StagedAtLevel(on, a_side, level)) continue;
    staged = true;
    if (SideOf(on, a_side).pipelined) {
      if (level > 0) CurrentStage(on, a_side);  // depth 0: picked above
      Prefetch(on, a_side);
      prefetched = true;
    } else {
      Pack(on, a_side);
    }
  }
  if (prefetched) CommitAndWaitForThisStep();
  if (staged) Sync();
}

// Tiles pipelined across this own loop: the first steps' before it.
void CudaEmitter::OpenOwnLoop(const space::OpNest& on, int level) {
  std::vector<std::pair<const space::OpNest*, bool>> sides;
  for (bool a_side : {true, false}) {
    if (on.gemm.ok && SideOf(on, a_side).pipelined && DepthOf(on, a_side) == level + 1) sides.push_back({&on, a_side});
  }
  FirstStages(sides, [](const space::OpNest&) {});
  x_.OpenTileLoop(w_, on.loops[level], &on);
  if (!sides.empty()) DefineStage(on.loops[level]);
}

}  // namespace fusor::codegen::cuda
