#include "common/codegen/cuda/cuda_emitter.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

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
  const std::string x = ExprToC(op.body, [this](const Access& a) { return x_.Load(a); });
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
// elementwise ops and an online softmax over S's points, then GEMM O over
// the stream dim). Warp w owns rows 16w..16w+15 of the block's tile: S's
// accumulator fragments stay in its registers, the elementwise ops and
// the softmax run on them (row reductions across the 4 lanes of a
// fragment row), and pairs of S fragments become the A fragments of O's
// mma, whose accumulator lives in registers across the stream loop. Only
// the GEMMs' other operands go through shared memory: S's A tile once,
// S's B and O's B tile per stream step (prefetched with 2 stages).

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
// (v_ of its dims defined): S's accumulator (scaled) or an elementwise
// op's body over the earlier ones.
std::string CudaEmitter::RegisterValue(int t) const {
  const int o = chain_.tensors[t].producer;
  if (o == 0) {
    const double scale = nest_.ops[0].gemm.scale;
    return scale == 1 ? "sf[f][e]" : absl::StrCat("sf[f][e] * ", FloatLit(scale));
  }
  return "(" + ExprToC(chain_.ops[o].body, [this](const Access& a) {
           return chain_.tensors[a.tensor].producer >= 0 ? RegisterValue(a.tensor) : x_.Load(a);
         }) + ")";
}

void CudaEmitter::EmitRegisterResident() {
  const int last = LastOp(), sd = nest_.stream_dim;
  const space::OpNest& son = nest_.ops[0];
  const space::OpNest& oon = nest_.ops[last];
  const GemmLayout& ls = gemm_[0];
  const GemmLayout& lo = gemm_[last];
  const RegisterFragments f{son.cols_pad / 8, ls.k_pad / ls.kstep, oon.cols_pad / 8, lo.k_pad / lo.kstep};
  DefineRegisterStaging();
  w_.Line(absl::StrCat("// intermediates in registers: warp w owns rows 16w..16w+15 of the ",
                       chain_.dims[son.gemm.rows[0]].name, " tile"));
  w_.Line("const int g = lane / 4, t = lane % 4;");
  w_.Line(absl::StrCat("const long r0 = warp * 16L;"));
  w_.Line(absl::StrCat("const bool has_rows = r0 < ", son.rows_pad, "L;"));
  w_.Line(absl::StrCat("// A of ", chain_.tensors[chain_.ops[0].output].name, ", staged once"));
  Pack(son, /*a_side=*/true);
  bool pipeline = false;
  for (const space::OpNest* on : {&son, &oon}) {
    if (!SideOf(*on, false).pipelined) continue;
    FirstStage(*on, false);
    pipeline = true;
  }
  if (pipeline) w_.Line("fusor_cp_async_commit();");
  Sync();
  LoadQFragments(f);
  w_.Line(absl::StrCat("float of[", f.nfo, "][4];"));
  w_.Line(absl::StrCat("for (int f = 0; f < ", f.nfo, "; ++f) of[f][0] = of[f][1] = of[f][2] = of[f][3] = 0.0f;"));
  w_.Line("float row_max[2] = {-FUSOR_INFINITY, -FUSOR_INFINITY}, row_sum[2] = {0.0f, 0.0f};");

  w_.Line(absl::StrCat("// stream loop over ", chain_.dims[sd].name));
  x_.OpenTileLoop(w_, sd);
  if (pipeline) DefineStage(sd);
  StageStep(son);
  StageStep(oon);
  if (pipeline) {
    w_.Line("fusor_cp_async_commit();");
    w_.Line("fusor_cp_async_wait<1>();");
  }
  Sync();
  w_.Open("if (has_rows)");
  EmitScoreMma(f);
  EmitScoreOps(f);
  EmitFragmentSoftmax(f);
  EmitProbabilityMma(f);
  w_.Close();  // has_rows
  Sync();      // the next step's staging reuses these buffers
  w_.Close();  // stream loop
  EmitRegisterStore(f);
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
  x_.DefineBlockOrigins(w_, "blockIdx.x");
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

// The warp's A fragments of S (its 16 rows of the staged A tile), held
// in registers for the whole stream loop.
void CudaEmitter::LoadQFragments(const RegisterFragments& f) {
  const GemmLayout& ls = gemm_[0];
  w_.Line(absl::StrCat("fusor_u32 qf[", f.ks, "][4];"));
  w_.Open("if (has_rows)");
  w_.Line("#pragma unroll");
  w_.Open(absl::StrCat("for (int kq = 0; kq < ", f.ks, "; ++kq)"));
  LoadAFragment(ls, "pa0", "qf[kq]", "0L", "r0", absl::StrCat("kq * ", ls.kstep, "L"));
  w_.Close();
  w_.Close();
}

// S = A B over the whole reduction, in registers.
void CudaEmitter::EmitScoreMma(const RegisterFragments& f) {
  const GemmLayout& ls = gemm_[0];
  w_.Line(absl::StrCat("float sf[", f.nfs, "][4];"));
  w_.Line("#pragma unroll");
  w_.Open(absl::StrCat("for (int f = 0; f < ", f.nfs, "; ++f)"));
  w_.Line("sf[f][0] = sf[f][1] = sf[f][2] = sf[f][3] = 0.0f;");
  w_.Line(absl::StrCat("if (8 * f >= ", n_.N(nest_.stream_dim), ") continue;  // columns this step did not stage"));
  w_.Line("#pragma unroll");
  w_.Open(absl::StrCat("for (int kq = 0; kq < ", f.ks, "; ++kq)"));
  w_.Line("fusor_u32 b[2];");
  LoadBFragment(ls, "pb0", "b", "0L", "8 * f", absl::StrCat("kq * ", ls.kstep, "L"));
  Mma(ls, "sf[f]", "qf[kq]", "b");
  w_.Close();
  w_.Close();
}

// The elementwise ops and the softmax's input, element by element;
// points outside the extents are -inf (they weigh nothing).
void CudaEmitter::EmitScoreOps(const RegisterFragments& f) {
  const int last = LastOp(), sd = nest_.stream_dim, rows_dim = nest_.ops[0].gemm.rows[0];
  int softmax = -1;
  for (int o = 1; o < last; ++o) softmax = chain_.ops[o].kind == OpKind::kSoftmax ? o : softmax;
  w_.Line("#pragma unroll");
  w_.Open(absl::StrCat("for (int f = 0; f < ", f.nfs, "; ++f)"));
  w_.Line("#pragma unroll");
  w_.Open("for (int e = 0; e < 4; ++e)");
  w_.Line("const long ri = r0 + g + 8 * (e / 2), ci = 8 * f + 2 * t + e % 2;");
  w_.Line("float x = -FUSOR_INFINITY;");
  w_.Open(absl::StrCat("if (ri < ", n_.N(rows_dim), " && ci < ", n_.N(sd), ")"));
  for (int d : chain_.ops[0].index) {
    const std::string within = d == rows_dim ? " + ri" : d == sd ? " + ci" : "";
    w_.Line(absl::StrCat("const long ", n_.V(d), " = ", n_.O(d), within, ";"));
  }
  w_.Line(absl::StrCat("x = ", ExprToC(chain_.ops[softmax].body, [this](const Access& a) {
                         return chain_.tensors[a.tensor].producer >= 0 ? RegisterValue(a.tensor) : x_.Load(a);
                       }),
                       ";"));
  w_.Close();
  w_.Line("sf[f][e] = x;");
  w_.Close();
  w_.Close();
}

// Online softmax per fragment row (g and g + 8), across the 4 lanes that
// hold it; O's accumulator is rescaled with it.
void CudaEmitter::EmitFragmentSoftmax(const RegisterFragments& f) {
  w_.Line("#pragma unroll");
  w_.Open("for (int h2 = 0; h2 < 2; ++h2)");
  w_.Line("float mx = -FUSOR_INFINITY;");
  w_.Line(absl::StrCat("for (int f = 0; f < ", f.nfs,
                       "; ++f) mx = fmaxf(mx, fmaxf(sf[f][2 * h2], sf[f][2 * h2 + 1]));"));
  w_.Line("mx = fmaxf(mx, fusor_shfl_xor(mx, 1));");
  w_.Line("mx = fmaxf(mx, fusor_shfl_xor(mx, 2));");
  w_.Line("const float m_new = fmaxf(row_max[h2], mx);");
  w_.Line("const float rescale = m_new == -FUSOR_INFINITY ? 1.0f : expf(row_max[h2] - m_new);");
  w_.Line("float total = 0.0f;");
  w_.Line("#pragma unroll");
  w_.Open(absl::StrCat("for (int f = 0; f < ", f.nfs, "; ++f)"));
  w_.Line("#pragma unroll");
  w_.Open("for (int c = 0; c < 2; ++c)");
  w_.Line("const float p = m_new == -FUSOR_INFINITY ? 0.0f : expf(sf[f][2 * h2 + c] - m_new);");
  w_.Line("sf[f][2 * h2 + c] = p;");
  w_.Line("total += p;");
  w_.Close();
  w_.Close();
  w_.Line("total += fusor_shfl_xor(total, 1);");
  w_.Line("total += fusor_shfl_xor(total, 2);");
  w_.Line("row_sum[h2] = row_sum[h2] * rescale + total;");
  w_.Line("row_max[h2] = m_new;");
  w_.Line(absl::StrCat("for (int f = 0; f < ", f.nfo,
                       "; ++f) { of[f][2 * h2] *= rescale; of[f][2 * h2 + 1] *= rescale; }"));
  w_.Close();
}

// O += P V. f16/bf16: two S fragments (16 columns) are one A fragment.
// tf32: one S fragment is one A fragment, whose lane holds columns t
// and t + 4 where the accumulator's holds 2t and 2t + 1: shuffled in
// from the lanes of the same fragment row.
void CudaEmitter::EmitProbabilityMma(const RegisterFragments& f) {
  const int last = LastOp();
  const GemmLayout& lo = gemm_[last];
  const std::string mma_in = chain_.dtype == ir::DType::kBF16 ? "fusor_f32_to_bf16" : "fusor_f32_to_f16";
  w_.Line("#pragma unroll");
  w_.Open(absl::StrCat("for (int kq = 0; kq < ", f.kp, "; ++kq)"));
  w_.Line(absl::StrCat("if (", lo.kstep, " * kq >= ", n_.N(nest_.stream_dim),
                       ") break;  // rows of B this step did not stage"));
  w_.Line("fusor_u32 a[4];");
  w_.Line("#pragma unroll");
  w_.Open("for (int i = 0; i < 4; ++i)");
  if (lo.kind == MmaKind::kTF32) {
    w_.Line("const int e = 2 * (i % 2), src = g * 4 + t / 2 + 2 * (i / 2);");
    w_.Line("const float lo = fusor_shfl(sf[kq][e], src), hi = fusor_shfl(sf[kq][e + 1], src);");
    w_.Line("a[i] = fusor_bits(fusor_round_tf32(t % 2 ? hi : lo));");
  } else {
    w_.Line("const int f = 2 * kq + i / 2, e = 2 * (i % 2);");
    w_.Line(absl::StrCat("a[i] = f < ", f.nfs, " ? (fusor_u32)", mma_in, "(sf[f][e]) | ((fusor_u32)", mma_in,
                         "(sf[f][e + 1]) << 16) : 0u;"));
  }
  w_.Close();
  w_.Line("#pragma unroll");
  w_.Open(absl::StrCat("for (int f = 0; f < ", f.nfo, "; ++f)"));
  w_.Line("fusor_u32 b[2];");
  LoadBFragment(lo, absl::StrCat("pb", last), "b", "0L", "8 * f", absl::StrCat("kq * ", lo.kstep, "L"));
  Mma(lo, "of[f]", "a", "b");
  w_.Close();
  w_.Close();
}

// After the stream loop: O = accumulator / row sum, to global memory.
void CudaEmitter::EmitRegisterStore(const RegisterFragments& f) {
  const int last = LastOp();
  const space::OpNest& oon = nest_.ops[last];
  const int rows_dim = nest_.ops[0].gemm.rows[0], cols_dim = oon.gemm.cols[0];
  const Op& oop = chain_.ops[last];
  w_.Line(absl::StrCat("// ", chain_.tensors[oop.output].name, " is complete"));
  w_.Open("if (has_rows)");
  w_.Line("#pragma unroll");
  w_.Open(absl::StrCat("for (int f = 0; f < ", f.nfo, "; ++f)"));
  w_.Line("#pragma unroll");
  w_.Open("for (int e = 0; e < 4; ++e)");
  w_.Line("const long ri = r0 + g + 8 * (e / 2), ci = 8 * f + 2 * t + e % 2;");
  w_.Open(absl::StrCat("if (ri < ", n_.N(rows_dim), " && ci < ", n_.N(cols_dim), ")"));
  for (int d : oop.index) {
    const std::string within = d == rows_dim ? " + ri" : d == cols_dim ? " + ci" : "";
    w_.Line(absl::StrCat("const long ", n_.V(d), " = ", n_.O(d), within, ";"));
  }
  std::string value = "of[f][e] / row_sum[e / 2]";
  if (oon.gemm.scale != 1) value = absl::StrCat("(", value, ") * ", FloatLit(oon.gemm.scale));
  w_.Line(absl::StrCat(n_.Global(oop.output), "[", GlobalOffset(emit::NestIndex::SelfAccess(oop), n_), "] = ",
                       StoreConvert(chain_.dtype, value), ";"));
  w_.Close();
  w_.Close();
  w_.Close();
  w_.Close();
}

}  // namespace fusor::codegen::cuda
