#include "common/codegen/cuda/cuda_emitter.h"

#include <algorithm>
#include <functional>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusor::codegen::cuda {

using emit::Count;
using emit::ExprToC;
using emit::FloatLit;
using emit::GlobalOffset;
using emit::StoreConvert;
using ir::Access;
using ir::Op;
using ir::OpKind;

void CudaEmitter::WarpReduce(const std::string& var, bool max) {
  w_.Line("#pragma unroll");
  w_.Open("for (int m = 16; m > 0; m /= 2)");
  w_.Line(absl::StrCat("const float other = fusor_shfl_xor(", var, ", m);"));
  w_.Line(max ? absl::StrCat(var, " = other > ", var, " ? other : ", var, ";")
              : absl::StrCat(var, " += other;"));
  w_.Close();
}

void CudaEmitter::ResetOnlineState(const space::OpNest& on) {
  w_.Line(absl::StrCat("for (long p = tid; p < ", on.state_floats / 3, "L; p += ", threads_, ") { smax", on.op,
                       "[p] = -FUSOR_INFINITY; ssum", on.op, "[p] = 0.0f; }"));
}

// One warp per row; lanes stride along the axis. Plain: max, sum of
// exponentials, normalized values. Online (along the stream dim): the
// tile's exponentials against the running max, the running sum, and the
// factor the consumer rescales its accumulator by.
void CudaEmitter::EmitSoftmax(const Op& op, const space::OpNest& on) {
  const int ax = op.axis;
  std::vector<int> rows;
  for (int d : op.index) {
    if (d != ax) rows.push_back(d);
  }
  const std::string x =
      emit::CausalValue(op, n_, ExprToC(op.body, [this](const Access& a) { return x_.Load(a); }), "-FUSOR_INFINITY");
  const std::string axis_loop = absl::StrCat("for (long ", n_.I(ax), " = lane; ", n_.I(ax), " < ", n_.N(ax), "; ",
                                             n_.I(ax), " += 32)");
  const std::string axis_var = absl::StrCat("const long ", n_.V(ax), " = ", n_.O(ax), " + ", n_.I(ax), ";");
  const std::string o = absl::StrCat(on.op);
  w_.Open(absl::StrCat("for (long row = warp; row < ", Count(rows, n_), "; row += ", threads_ / 32, ")"));
  Decompose("row", rows);
  w_.Line("float mx = -FUSOR_INFINITY;");
  w_.Open(axis_loop);
  w_.Line(axis_var);
  w_.Line(absl::StrCat("const float x = ", x, ";"));
  w_.Line("mx = x > mx ? x : mx;");
  w_.Close();
  WarpReduce("mx", true);
  if (!on.online) {
    w_.Line("float total = 0.0f;");
    w_.Open(axis_loop);
    w_.Line(axis_var);
    w_.Line(absl::StrCat("total += expf(", x, " - mx);"));
    w_.Close();
    WarpReduce("total", false);
    w_.Line("const float inv = 1.0f / total;");
    w_.Open(axis_loop);
    w_.Line(axis_var);
    x_.Store(w_, on, absl::StrCat("expf(", x, " - mx) * inv"));
    w_.Close();
  } else {
    w_.Line(absl::StrCat("const long sr = ", x_.StateOffset(op), ";"));
    w_.Line(absl::StrCat("const float m_old = smax", o, "[sr];"));
    w_.Line("const float m_new = m_old > mx ? m_old : mx;");
    w_.Line("const float rescale = m_new == -FUSOR_INFINITY ? 1.0f : expf(m_old - m_new);");
    w_.Line("float total = 0.0f;");
    w_.Open(axis_loop);
    w_.Line(axis_var);
    w_.Line(absl::StrCat("const float e = m_new == -FUSOR_INFINITY ? 0.0f : expf(", x, " - m_new);"));
    w_.Line("total += e;");
    x_.Store(w_, on, "e");
    w_.Close();
    WarpReduce("total", false);
    w_.Open("if (lane == 0)");
    w_.Line(absl::StrCat("ssum", o, "[sr] = ssum", o, "[sr] * rescale + total;"));
    w_.Line(absl::StrCat("smax", o, "[sr] = m_new;"));
    w_.Line(absl::StrCat("sscale", o, "[sr] = rescale;"));
    w_.Close();
  }
  w_.Close();
  Sync();
}

// ---------------------------------------------- registers (FlashAttention)
//
// Schedule "registers" (BuildLoopNest checked the shape: GEMM S, then
// elementwise ops and at most one online softmax over S's points, then
// GEMM O over the stream dim; FlashAttention, or a GEMM chain). Warp w owns rf row fragments of 16 rows (rf is 2 when
// the row tile has 32 rows a warp, so that every B fragment read from
// shared memory feeds two mma): S's accumulator fragments stay in its
// registers, the elementwise ops and the softmax run on them (row
// reductions across the 4 lanes of a fragment row, in base 2 with
// log2(e) folded into the scores), and pairs of S fragments become the A
// fragments of O's mma, whose accumulator lives in registers across the
// stream loop. Only the GEMMs' other operands go through shared memory:
// S's A tile once, S's B and O's B tile per stream step (prefetched with 2
// or 3 stages), read two 8-column blocks at a time (ldmatrix.x4).

namespace {

constexpr double kLog2E = 1.4426950408889634;

// True when the softmax reads S itself, unscaled and unmasked: log2(e)
// then folds into S's scale, one multiply per score.
bool ReadsScoresAlone(const ir::Expr& body, int scores) {
  return body.kind == ir::Expr::Kind::kAccess && body.access.tensor == scores;
}

}  // namespace

// Issues this stream step's tile of a B side: the current stage and the
// next step's prefetch, or a plain staging that waits.
void CudaEmitter::StageStep(const space::OpNest& on) {
  if (SideOf(on, false).pipelined) {
    CurrentStage(on, false);
    Prefetch(on, false);
  } else {
    Pack(on, false);
  }
}

// The C expression of intermediate `t` at the current fragment element
// (v_ of its dims defined): S's accumulator (scaled by `scale` more) or an
// elementwise op's body over the earlier ones.
std::string CudaEmitter::RegisterValue(int t, double scale) const {
  const int o = chain_.tensors[t].producer;
  if (o == 0) {
    scale *= nest_.ops[0].gemm.scale;
    return scale == 1 ? "sf[fr][f][e]" : absl::StrCat("sf[fr][f][e] * ", FloatLit(scale));
  }
  return "(" + ExprToC(chain_.ops[o].body, [this](const Access& a) {
           return chain_.tensors[a.tensor].producer >= 0 ? RegisterValue(a.tensor, 1) : x_.Load(a);
         }) + ")";
}

// The online softmax between the GEMMs, or -1.
int CudaEmitter::SoftmaxOp() const {
  for (int o = 1; o < LastOp(); ++o) {
    if (chain_.ops[o].kind == OpKind::kSoftmax) return o;
  }
  return -1;
}

// `body` once per row fragment fr of the warp (#pragma unroll).
void CudaEmitter::ForEachRowFragment(const RegisterFragments& f, const std::function<void()>& body) {
  w_.Line("#pragma unroll");
  w_.Open(absl::StrCat("for (int fr = 0; fr < ", f.rf, "; ++fr)"));
  body();
  w_.Close();
}

void CudaEmitter::EmitRegisterResident() {
  const int last = LastOp(), sd = nest_.stream_dim;
  const space::OpNest& son = nest_.ops[0];
  const space::OpNest& oon = nest_.ops[last];
  const GemmLayout& ls = gemm_[0];
  const GemmLayout& lo = gemm_[last];
  RegisterFragments f;
  f.rf = space::RowFragmentsPerWarp(son.rows_pad, threads_ / 32);
  f.nfs = son.cols_pad / 8;
  f.ks = ls.k_pad / ls.kstep;
  f.nfo = oon.cols_pad / 8;
  f.kp = lo.k_pad / lo.kstep;
  if (nest_.split > 1) DefineSplitPart();
  DefineRegisterStaging();
  w_.Line(absl::StrCat("// intermediates in registers: warp w owns rows ", 16 * f.rf, "w..", 16 * f.rf, "w+",
                       16 * f.rf - 1, " of the ", chain_.dims[son.gemm.rows[0]].name, " tile"));
  w_.Line("const int g = lane / 4, t = lane % 4;");
  w_.Line(absl::StrCat("const long r0 = warp * ", 16 * f.rf, "L;"));
  w_.Line(absl::StrCat("const bool has_rows = r0 < ", son.rows_pad, "L;"));
  std::vector<std::pair<const space::OpNest*, bool>> sides;
  for (const space::OpNest* on : {&son, &oon}) {
    if (SideOf(*on, false).pipelined) sides.push_back({on, false});
  }
  const bool pipeline = !sides.empty();
  // With a pipeline, A's copies join the first step's group: one wait
  // for A and the first B tiles together.
  w_.Line(absl::StrCat("// A of ", chain_.tensors[chain_.ops[0].output].name, ", staged once",
                       pipeline ? ", in the first step's copy group" : ""));
  Stage(son, /*a_side=*/true, /*wait=*/!pipeline);
  FirstStages(sides, [](const space::OpNest&) {});
  if (pipeline) w_.Line(absl::StrCat("fusor_cp_async_wait<", stages_ - 2, ">();  // A and step 0's tiles"));
  Sync();
  LoadQFragments(f);
  const bool softmax = SoftmaxOp() >= 0;
  w_.Line(absl::StrCat("float of[", f.rf, "][", f.nfo, "][4];"));
  if (softmax) {
    w_.Line(absl::StrCat("// running max (base 2) and this lane's share of the row sums"));
    w_.Line(absl::StrCat("float row_max[", f.rf, "][2], row_sum[", f.rf, "][2];"));
  }
  ForEachRowFragment(f, [&] {
    w_.Line(absl::StrCat("for (int f = 0; f < ", f.nfo, "; ++f) of[fr][f][0] = of[fr][f][1] = of[fr][f][2] = ",
                         "of[fr][f][3] = 0.0f;"));
    if (softmax) {
      w_.Line("row_max[fr][0] = row_max[fr][1] = -FUSOR_INFINITY;");
      w_.Line("row_sum[fr][0] = row_sum[fr][1] = 0.0f;");
    }
  });

  w_.Line(absl::StrCat("// stream loop over ", chain_.dims[sd].name, nest_.split > 1 ? ", this part of it" : ""));
  OpenStreamTiles();
  if (pipeline) DefineStage(sd);
  StageStep(son);
  StageStep(oon);
  if (pipeline) CommitAndWaitForThisStep();
  Sync();
  w_.Open("if (has_rows)");
  EmitScoreMma(f);
  EmitScoreOps(f);
  if (softmax) EmitFragmentSoftmax(f);
  EmitProbabilityMma(f);
  w_.Close();  // has_rows
  Sync();      // the next step's staging reuses these buffers
  w_.Close();  // stream loop
  if (nest_.split > 1) {
    EmitSplitStore(f);
  } else {
    EmitRegisterStore(f);
  }
}

// The staging buffers of the GEMMs' shared-memory operands (S's A and B,
// O's B), the block's origins, and the ranges no loop sets (the GEMMs'
// reductions and O's columns), once.
void CudaEmitter::DefineRegisterStaging() {
  const int last = LastOp(), sd = nest_.stream_dim;
  const space::OpNest& son = nest_.ops[0];
  const space::OpNest& oon = nest_.ops[last];
  const GemmLayout& ls = gemm_[0];
  const GemmLayout& lo = gemm_[last];
  const std::string stage_type = StageType(son);
  for (const auto& [side, name, op] :
       {std::tuple{&ls.a, "pa", 0}, std::tuple{&ls.b, "pb", 0}, std::tuple{&lo.b, "pb", last}}) {
    w_.Line(absl::StrCat(stage_type, "* const ", name, op, side->pipelined ? "_stages" : "", " = (", stage_type,
                         "*)(fusor_smem + ", side->offset, ");"));
  }
  x_.DefineBlockOrigins(w_, TileIndex());
  std::vector<int> dims;
  for (const space::OpNest* on : {&son, &oon}) {
    const Op& op = chain_.ops[on->op];
    for (const std::vector<int>* list : {&op.index, &op.reduce}) {
      for (int d : *list) {
        if (!x_.IsBlock(d) && d != sd && std::find(dims.begin(), dims.end(), d) == dims.end()) dims.push_back(d);
      }
    }
  }
  for (int d : dims) {
    w_.Line(absl::StrCat("const long ", n_.O(d), " = 0, ", n_.N(d), " = ", chain_.dims[d].extent, "L;"));
  }
}

// The warp's A fragments of S (its rows of the staged A tile), held in
// registers for the whole stream loop.
void CudaEmitter::LoadQFragments(const RegisterFragments& f) {
  const GemmLayout& ls = gemm_[0];
  w_.Line(absl::StrCat("fusor_u32 qf[", f.rf, "][", f.ks, "][4];"));
  w_.Open("if (has_rows)");
  ForEachRowFragment(f, [&] {
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int kq = 0; kq < ", f.ks, "; ++kq)"));
    LoadAFragment(ls, "pa0", "qf[fr][kq]", "0L", "r0 + 16 * fr", absl::StrCat("kq * ", ls.kstep, "L"));
    w_.Close();
  });
  w_.Close();
}

// C[fr][f..] += A[fr] B for every row fragment fr: the B fragments of
// `blocks` 8-column blocks from f on (1, or 2 with one ldmatrix.x4) at
// reduction step kq, each read once for all row fragments.
void CudaEmitter::EmitFragmentMma(const GemmLayout& l, const RegisterFragments& f, const std::string& buf,
                                  const std::string& c, const std::string& a, int blocks) {
  w_.Line(absl::StrCat("fusor_u32 b[", 2 * blocks, "];"));
  const std::string kk = absl::StrCat("kq * ", l.kstep, "L");
  if (blocks == 2) {
    LoadBFragmentPair(l, buf, "b", "8 * f", kk);
  } else {
    LoadBFragment(l, buf, "b", "0L", "8 * f", kk);
  }
  ForEachRowFragment(f, [&] {
    for (int j = 0; j < blocks; ++j) {
      Mma(l, absl::StrCat(c, "[fr][f + ", j, "]"), a, j == 0 ? "b" : "b + 2");
    }
  });
}

// `body(blocks)` over S's or O's 8-column blocks f (#pragma unroll): in
// pairs (blocks = 2) where ldmatrix.x4 applies (f16, bf16), then one at a
// time.
void CudaEmitter::ForEachColumnBlock(const GemmLayout& l, int64_t count, const std::function<void(int)>& body) {
  const int64_t pairs = l.kind == MmaKind::kTF32 ? 0 : count / 2;
  if (pairs > 0) {
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int f = 0; f < ", 2 * pairs, "; f += 2)"));
    body(2);
    w_.Close();
  }
  if (2 * pairs < count) {
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int f = ", 2 * pairs, "; f < ", count, "; ++f)"));
    body(1);
    w_.Close();
  }
}

// S = A B over the whole reduction, in registers.
void CudaEmitter::EmitScoreMma(const RegisterFragments& f) {
  const GemmLayout& ls = gemm_[0];
  w_.Line(absl::StrCat("float sf[", f.rf, "][", f.nfs, "][4];"));
  ForEachRowFragment(f, [&] {
    w_.Line(absl::StrCat("for (int f = 0; f < ", f.nfs, "; ++f) sf[fr][f][0] = sf[fr][f][1] = sf[fr][f][2] = ",
                         "sf[fr][f][3] = 0.0f;"));
  });
  ForEachColumnBlock(ls, f.nfs, [&](int blocks) {
    w_.Line(absl::StrCat("if (8 * f >= ", n_.N(nest_.stream_dim), ") continue;  // columns this step did not stage"));
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int kq = 0; kq < ", f.ks, "; ++kq)"));
    EmitFragmentMma(ls, f, "pb0", "sf", "qf[fr][kq]", blocks);
    w_.Close();
  });
}

// The elementwise ops, element by element, up to the softmax's input
// (times log2(e)) or, without a softmax, the last GEMM's A operand; points
// outside the extents are -inf before a softmax, else 0 (they weigh
// nothing). The bounds are checked only where a tile may be short.
void CudaEmitter::EmitScoreOps(const RegisterFragments& f) {
  const int sd = nest_.stream_dim, rows_dim = nest_.ops[0].gemm.rows[0];
  const space::OpNest& son = nest_.ops[0];
  const int softmax = SoftmaxOp();
  auto full = [&](int d, int64_t pad) {
    return chain_.dims[d].extent % nest_.schedule.tile[d] == 0 && nest_.schedule.tile[d] == pad;
  };
  std::vector<std::string> bounds;
  if (!full(rows_dim, son.rows_pad)) bounds.push_back(absl::StrCat("ri < ", n_.N(rows_dim)));
  if (!full(sd, son.cols_pad)) bounds.push_back(absl::StrCat("ci < ", n_.N(sd)));
  if (softmax >= 0 && chain_.ops[softmax].Causal()) {
    // Past the diagonal (CheckRegisters: the softmax's rows are S's rows).
    bounds.push_back(absl::StrCat(n_.O(sd), " + ci <= ", n_.O(rows_dim), " + ri + ", chain_.ops[softmax].causal_offset,
                                  "L"));
  }
  std::string x;
  if (softmax < 0) {
    x = RegisterValue(chain_.ops[LastOp() - 1].output, 1);
  } else if (const ir::Expr& body = chain_.ops[softmax].body; ReadsScoresAlone(body, chain_.ops[0].output)) {
    x = RegisterValue(chain_.ops[0].output, kLog2E);
  } else {
    x = absl::StrCat("(", ExprToC(body, [this](const Access& a) {
                       return chain_.tensors[a.tensor].producer >= 0 ? RegisterValue(a.tensor, 1) : x_.Load(a);
                     }),
                     ") * ", FloatLit(kLog2E));
  }
  ForEachRowFragment(f, [&] {
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int f = 0; f < ", f.nfs, "; ++f)"));
    w_.Line("#pragma unroll");
    w_.Open("for (int e = 0; e < 4; ++e)");
    w_.Line("const long ri = r0 + 16 * fr + g + 8 * (e / 2), ci = 8 * f + 2 * t + e % 2;");
    if (!bounds.empty()) {
      w_.Line(softmax >= 0 ? "float x = -FUSOR_INFINITY;" : "float x = 0.0f;");
      w_.Open(absl::StrCat("if (", absl::StrJoin(bounds, " && "), ")"));
    } else {
      w_.Line("float x;");
      w_.Open("");
    }
    for (int d : chain_.ops[0].index) {
      const std::string within = d == rows_dim ? " + ri" : d == sd ? " + ci" : "";
      w_.Line(absl::StrCat("const long ", n_.V(d), " = ", n_.O(d), within, ";"));
    }
    w_.Line(absl::StrCat("x = ", x, ";"));
    w_.Close();
    w_.Line("sf[fr][f][e] = x;");
    w_.Close();
    w_.Close();
  });
}

// Online softmax per fragment row (g and g + 8 of each row fragment),
// across the 4 lanes that hold it, branch-free: a row with no score yet
// (max -inf) subtracts 0, and 2^-inf is 0. O's accumulator is rescaled;
// each lane keeps its own share of the row sum (summed across the lanes
// once, at the end).
void CudaEmitter::EmitFragmentSoftmax(const RegisterFragments& f) {
  ForEachRowFragment(f, [&] {
    w_.Line("#pragma unroll");
    w_.Open("for (int h2 = 0; h2 < 2; ++h2)");
    w_.Line("float mx = row_max[fr][h2];");
    w_.Line("#pragma unroll");
    w_.Line(absl::StrCat("for (int f = 0; f < ", f.nfs,
                         "; ++f) mx = fmaxf(mx, fmaxf(sf[fr][f][2 * h2], sf[fr][f][2 * h2 + 1]));"));
    w_.Line("mx = fmaxf(mx, fusor_shfl_xor(mx, 1));");
    w_.Line("mx = fmaxf(mx, fusor_shfl_xor(mx, 2));");
    w_.Line("const float base = mx == -FUSOR_INFINITY ? 0.0f : mx;");
    w_.Line("const float rescale = fusor_exp2(row_max[fr][h2] - base);");
    w_.Line("float total = 0.0f;");
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int f = 0; f < ", f.nfs, "; ++f)"));
    w_.Line("#pragma unroll");
    w_.Open("for (int c = 0; c < 2; ++c)");
    w_.Line("const float p = fusor_exp2(sf[fr][f][2 * h2 + c] - base);");
    w_.Line("sf[fr][f][2 * h2 + c] = p;");
    w_.Line("total += p;");
    w_.Close();
    w_.Close();
    w_.Line("row_sum[fr][h2] = row_sum[fr][h2] * rescale + total;");
    w_.Line("row_max[fr][h2] = mx;");
    w_.Line("#pragma unroll");
    w_.Line(absl::StrCat("for (int f = 0; f < ", f.nfo,
                         "; ++f) { of[fr][f][2 * h2] *= rescale; of[fr][f][2 * h2 + 1] *= rescale; }"));
    w_.Close();
  });
}

// O += P V. f16/bf16: two S fragments (16 columns) are one A fragment.
// tf32: one S fragment is one A fragment, whose lane holds columns t
// and t + 4 where the accumulator's holds 2t and 2t + 1: shuffled in
// from the lanes of the same fragment row.
void CudaEmitter::EmitProbabilityMma(const RegisterFragments& f) {
  const int last = LastOp();
  const GemmLayout& lo = gemm_[last];
  const std::string pack = chain_.dtype == ir::DType::kBF16 ? "fusor_pack_bf16x2" : "fusor_pack_f16x2";
  w_.Line("#pragma unroll");
  w_.Open(absl::StrCat("for (int kq = 0; kq < ", f.kp, "; ++kq)"));
  w_.Line(absl::StrCat("if (", lo.kstep, " * kq >= ", n_.N(nest_.stream_dim),
                       ") break;  // rows of B this step did not stage"));
  w_.Line(absl::StrCat("fusor_u32 a[", f.rf, "][4];"));
  ForEachRowFragment(f, [&] {
    w_.Line("#pragma unroll");
    w_.Open("for (int q = 0; q < 4; ++q)");
    if (lo.kind == MmaKind::kTF32) {
      w_.Line("const int e = 2 * (q % 2), src = g * 4 + t / 2 + 2 * (q / 2);");
      w_.Line("const float lo = fusor_shfl(sf[fr][kq][e], src), hi = fusor_shfl(sf[fr][kq][e + 1], src);");
      w_.Line("a[fr][q] = fusor_bits(fusor_round_tf32(t % 2 ? hi : lo));");
    } else {
      w_.Line("const int f = 2 * kq + q / 2, e = 2 * (q % 2);");
      w_.Line(absl::StrCat("a[fr][q] = f < ", f.nfs, " ? ", pack, "(sf[fr][f][e], sf[fr][f][e + 1]) : 0u;"));
    }
    w_.Close();
  });
  ForEachColumnBlock(lo, f.nfo, [&](int blocks) {
    EmitFragmentMma(lo, f, absl::StrCat("pb", last), "of", "a[fr]", blocks);
  });
  w_.Close();
}

// A loop over the fragment row pair (h2: rows g and g + 8) with `total`,
// the row's sum of the lanes' shares; the caller closes it.
void CudaEmitter::OpenRowTotals() {
  w_.Line("#pragma unroll");
  w_.Open("for (int h2 = 0; h2 < 2; ++h2)");
  w_.Line("float total = row_sum[fr][h2];");
  w_.Line("total += fusor_shfl_xor(total, 1);");
  w_.Line("total += fusor_shfl_xor(total, 2);");
}

// After the stream loop: O = accumulator (times the reciprocal of the row
// sum, summed across the row's 4 lanes, after a softmax), to global memory.
void CudaEmitter::EmitRegisterStore(const RegisterFragments& f) {
  const int last = LastOp();
  const space::OpNest& oon = nest_.ops[last];
  const int rows_dim = nest_.ops[0].gemm.rows[0], cols_dim = oon.gemm.cols[0];
  const Op& oop = chain_.ops[last];
  w_.Line(absl::StrCat("// ", chain_.tensors[oop.output].name, " is complete"));
  const bool softmax = SoftmaxOp() >= 0;
  w_.Open("if (has_rows)");
  ForEachRowFragment(f, [&] {
    if (softmax) {
      w_.Line("float inv[2];");
      OpenRowTotals();
      w_.Line("inv[h2] = 1.0f / total;");
      w_.Close();
    }
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int f = 0; f < ", f.nfo, "; ++f)"));
    w_.Line("#pragma unroll");
    w_.Open("for (int e = 0; e < 4; ++e)");
    w_.Line("const long ri = r0 + 16 * fr + g + 8 * (e / 2), ci = 8 * f + 2 * t + e % 2;");
    w_.Open(absl::StrCat("if (ri < ", n_.N(rows_dim), " && ci < ", n_.N(cols_dim), ")"));
    StoreOutputElement(softmax ? "of[fr][f][e] * inv[e / 2]" : "of[fr][f][e]");
    w_.Close();
    w_.Close();
    w_.Close();
  });
  w_.Close();
}

// ------------------------------------------------- split stream loop
//
// Block b runs part b % split of the stream loop for tile b / split. It
// writes its share of O (f32, before normalization) and, after a softmax,
// each row's running max (base 2) and sum into the workspace, then counts
// itself in on the tile's counter. The part that arrives last reads every
// part back and writes O: with a softmax, each part weighted by
// 2^(its max - the rows' max), over the weighted sums. Workspace:
//   [tiles][split][rows_pad][cols_pad] partial O,
//   [tiles][split][rows_pad][2] row max and sum (after a softmax),
//   [tiles] arrival counters (zero between launches).

void CudaEmitter::EmitSplitStore(const RegisterFragments& f) {
  const int last = LastOp();
  const int64_t rows = nest_.ops[0].rows_pad, cols = nest_.ops[last].cols_pad;
  const int64_t tiles = nest_.num_blocks / nest_.split;
  const bool softmax = SoftmaxOp() >= 0;
  const int64_t part_floats = nest_.num_blocks * rows * cols, state_floats = softmax ? nest_.num_blocks * rows * 2 : 0;
  workspace_bytes_ = (part_floats + state_floats) * 4 + tiles * 4;
  w_.Line(absl::StrCat("// this part's share of ", chain_.tensors[chain_.ops[last].output].name, " to the workspace"));
  w_.Open("");
  w_.Line(absl::StrCat("float* const part_o = (float*)args.work + blockIdx.x * ", rows * cols, "L;"));
  if (softmax) {
    w_.Line(absl::StrCat("float* const part_state = (float*)args.work + ", part_floats, "L + blockIdx.x * ",
                         rows * 2, "L;"));
  }
  w_.Open("if (has_rows)");
  ForEachRowFragment(f, [&] {
    if (softmax) {
      OpenRowTotals();
      w_.Open("if (t == 0)");
      w_.Line("const long ri = r0 + 16 * fr + g + 8 * h2;");
      w_.Line("part_state[2 * ri] = row_max[fr][h2];");
      w_.Line("part_state[2 * ri + 1] = total;");
      w_.Close();
      w_.Close();
    }
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int f = 0; f < ", f.nfo, "; ++f)"));
    w_.Line("#pragma unroll");
    w_.Open("for (int e = 0; e < 4; ++e)");
    w_.Line(absl::StrCat("part_o[(r0 + 16 * fr + g + 8 * (e / 2)) * ", cols, "L + 8 * f + 2 * t + e % 2] = of[fr][f][e];"));
    w_.Close();
    w_.Close();
  });
  w_.Close();  // has_rows
  w_.Close();
  CountInAndCombine(part_floats + state_floats, [this] { EmitSplitCombine(); });
}

// The last part's block: O from every part's share, each element by one
// thread.
void CudaEmitter::EmitSplitCombine() {
  const int split = nest_.split;
  const space::OpNest& oon = nest_.ops[LastOp()];
  const int rows_dim = nest_.ops[0].gemm.rows[0], cols_dim = oon.gemm.cols[0];
  const int64_t rows = nest_.ops[0].rows_pad, cols = oon.cols_pad;
  const bool softmax = SoftmaxOp() >= 0;
  w_.Open(absl::StrCat("for (long p = tid; p < ", rows * cols, "L; p += ", threads_, ")"));
  w_.Line(absl::StrCat("const long ri = p / ", cols, "L, ci = p % ", cols, "L;"));
  w_.Line(absl::StrCat("if (ri >= ", n_.N(rows_dim), " || ci >= ", n_.N(cols_dim), ") continue;"));
  w_.Line(absl::StrCat("const float* const o = work + tile_id * ", split * rows * cols, "L + ri * ", cols, "L + ci;"));
  if (softmax) {
    w_.Line(absl::StrCat("const float* const state = work + ", nest_.num_blocks * rows * cols, "L + tile_id * ",
                         split * rows * 2, "L + 2 * ri;"));
    w_.Line("float mx = -FUSOR_INFINITY;");
    w_.Line(absl::StrCat("for (int q = 0; q < ", split, "; ++q) mx = fmaxf(mx, fusor_load_cg(state + q * ", rows * 2,
                         "L));"));
    w_.Line("const float base = mx == -FUSOR_INFINITY ? 0.0f : mx;");
    w_.Line("float num = 0.0f, den = 0.0f;");
    w_.Open(absl::StrCat("for (int q = 0; q < ", split, "; ++q)"));
    w_.Line(absl::StrCat("const float weight = fusor_exp2(fusor_load_cg(state + q * ", rows * 2, "L) - base);"));
    w_.Line(absl::StrCat("num += weight * fusor_load_cg(o + q * ", rows * cols, "L);"));
    w_.Line(absl::StrCat("den += weight * fusor_load_cg(state + q * ", rows * 2, "L + 1);"));
    w_.Close();
  } else {
    w_.Line("float num = 0.0f;");
    w_.Line(absl::StrCat("for (int q = 0; q < ", split, "; ++q) num += fusor_load_cg(o + q * ", rows * cols, "L);"));
  }
  StoreOutputElement(softmax ? "num / den" : "num");
  w_.Close();
}

// The last GEMM's output at row ri and column ci of the tile: `value`
// times the GEMM's scale, to global memory.
void CudaEmitter::StoreOutputElement(const std::string& value) {
  const int last = LastOp();
  const space::OpNest& oon = nest_.ops[last];
  const int rows_dim = nest_.ops[0].gemm.rows[0], cols_dim = oon.gemm.cols[0];
  const Op& oop = chain_.ops[last];
  for (int d : oop.index) {
    const std::string within = d == rows_dim ? " + ri" : d == cols_dim ? " + ci" : "";
    w_.Line(absl::StrCat("const long ", n_.V(d), " = ", n_.O(d), within, ";"));
  }
  const std::string scaled = oon.gemm.scale != 1 ? absl::StrCat("(", value, ") * ", FloatLit(oon.gemm.scale)) : value;
  w_.Line(absl::StrCat(n_.Global(oop.output), "[", GlobalOffset(ir::ResultAccess(oop), n_), "] = ",
                       StoreConvert(chain_.dtype, scaled), ";"));
}

}  // namespace fusor::codegen::cuda
