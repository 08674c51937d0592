#include "common/codegen/cuda/cuda_emitter.h"

#include "absl/strings/str_cat.h"

namespace fusor::codegen::cuda {

// The A fragment (rows r0.., reduction kk..) of a staged tile into `a`
// (fusor_u32[4]); `g` and `t` are the lane's group and thread in it.
void CudaEmitter::LoadAFragment(const GemmLayout& l, const std::string& buf, const std::string& a,
                                const std::string& bi, const std::string& r0, const std::string& kk) {
  if (l.kind == MmaKind::kTF32) {
    w_.Line("#pragma unroll");
    w_.Open("for (int i = 0; i < 4; ++i)");
    w_.Line(absl::StrCat(a, "[i] = fusor_bits(", buf, "[",
                         PackIndex(l.a, l, bi, r0 + " + g + 8 * (i % 2)", kk + " + t + 4 * (i / 2)"), "]);"));
    w_.Close();
  } else if (l.a.k_major) {
    w_.Line(absl::StrCat("fusor_ldmatrix_x4(", a, ", ", buf, " + ",
                         PackIndex(l.a, l, bi, r0 + " + lane % 16", kk + " + lane / 16 * 8"), ");"));
  } else {
    w_.Line(absl::StrCat("fusor_ldmatrix_x4_trans(", a, ", ", buf, " + ",
                         PackIndex(l.a, l, bi, r0 + " + (lane / 8) % 2 * 8", kk + " + lane / 16 * 8 + lane % 8"),
                         ");"));
  }
}

// The B fragment (columns n0.., reduction kk..) into `b` (fusor_u32[2]).
void CudaEmitter::LoadBFragment(const GemmLayout& l, const std::string& buf, const std::string& b,
                                const std::string& bi, const std::string& n0, const std::string& kk) {
  const std::string n = "(" + n0 + ")";
  if (l.kind == MmaKind::kTF32) {
    w_.Line(absl::StrCat(b, "[0] = fusor_bits(", buf, "[", PackIndex(l.b, l, bi, n + " + g", kk + " + t"), "]);"));
    w_.Line(absl::StrCat(b, "[1] = fusor_bits(", buf, "[", PackIndex(l.b, l, bi, n + " + g", kk + " + t + 4"),
                         "]);"));
  } else if (l.b.k_major) {
    w_.Line(absl::StrCat("fusor_ldmatrix_x2(", b, ", ", buf, " + ",
                         PackIndex(l.b, l, bi, n + " + lane % 8", kk + " + (lane / 8) % 2 * 8"), ");"));
  } else {
    w_.Line(absl::StrCat("fusor_ldmatrix_x2_trans(", b, ", ", buf, " + ",
                         PackIndex(l.b, l, bi, n, kk + " + (lane / 8) % 2 * 8 + lane % 8"), ");"));
  }
}

// The B fragments of columns n0..n0+15 (two 8-column blocks) at reduction
// kk.. into `b` (fusor_u32[4]: the first block's two, then the second's)
// with one ldmatrix.x4; f16 and bf16.
void CudaEmitter::LoadBFragmentPair(const GemmLayout& l, const std::string& buf, const std::string& b,
                                    const std::string& n0, const std::string& kk) {
  const std::string n = "(" + n0 + ")";
  if (l.b.k_major) {
    w_.Line(absl::StrCat("fusor_ldmatrix_x4(", b, ", ", buf, " + ",
                         PackIndex(l.b, l, "0L", n + " + lane / 16 * 8 + lane % 8", kk + " + (lane / 8) % 2 * 8"),
                         ");"));
  } else {
    w_.Line(absl::StrCat("fusor_ldmatrix_x4_trans(", b, ", ", buf, " + ",
                         PackIndex(l.b, l, "0L", n + " + lane / 16 * 8", kk + " + (lane / 8) % 2 * 8 + lane % 8"),
                         ");"));
  }
}

void CudaEmitter::Mma(const GemmLayout& l, const std::string& c, const std::string& a, const std::string& b) {
  const char* fn = l.kind == MmaKind::kTF32  ? "fusor_mma_m16n8k8_tf32"
                   : l.kind == MmaKind::kF16 ? "fusor_mma_m16n8k16_f16"
                                             : "fusor_mma_m16n8k16_bf16";
  w_.Line(absl::StrCat(fn, "(", c, ", ", a, ", ", b, ");"));
}

// Warps take 16 x (8 nf) units of the tile and run the mma over its
// whole reduction, accumulating into acc (f32, shared) between calls.
void CudaEmitter::MmaTile(const space::OpNest& on) {
  const GemmLayout& l = gemm_[on.op];
  const std::string o = absl::StrCat(on.op);
  const int64_t rp = on.rows_pad, cp = on.cols_pad;
  const int nf = l.nf;
  w_.Open("");
  DefineGemmSizes(on, Sides::kBoth);
  w_.Line(absl::StrCat("const long units_r = rows_pad / 16L, units_c = (cols_pad + ", 8 * nf - 1, "L) / ", 8 * nf,
                       "L;"));
  w_.Open(absl::StrCat("for (long u = warp; u < nb * units_r * units_c; u += ", threads_ / 32, ")"));
  w_.Line("const long bi = u / (units_r * units_c), r0 = (u / units_c) % units_r * 16L, c0 = u % units_c * "
          + absl::StrCat(8 * nf) + "L;");
  w_.Line("const int g = lane / 4, t = lane % 4;");
  w_.Line(absl::StrCat("float c[", nf, "][4];"));
  auto acc_at = [&](const std::string& row, const std::string& col) {
    return absl::StrCat("acc", o, "[(bi * ", rp, "L + ", row, ") * ", cp, "L + ", col, "]");
  };
  w_.Line("#pragma unroll");
  w_.Open(absl::StrCat("for (int f = 0; f < ", nf, "; ++f)"));
  w_.Line("const long col = c0 + 8 * f + 2 * t;");
  w_.Line(absl::StrCat("c[f][0] = ", acc_at("r0 + g", "col"), "; c[f][1] = ", acc_at("r0 + g", "col + 1"), ";"));
  w_.Line(absl::StrCat("c[f][2] = ", acc_at("r0 + g + 8", "col"), "; c[f][3] = ", acc_at("r0 + g + 8", "col + 1"),
                       ";"));
  w_.Close();
  w_.Open(absl::StrCat("for (long kk = 0; kk < kc_pad; kk += ", l.kstep, ")"));
  w_.Line("fusor_u32 a[4];");
  LoadAFragment(l, "pa" + o, "a", "bi", "r0", "kk");
  w_.Line("#pragma unroll");
  w_.Open(absl::StrCat("for (int f = 0; f < ", nf, "; ++f)"));
  w_.Line("fusor_u32 b[2];");
  LoadBFragment(l, "pb" + o, "b", "bi", "c0 + 8 * f", "kk");
  Mma(l, "c[f]", "a", "b");
  w_.Close();
  w_.Close();  // kk
  w_.Line("#pragma unroll");
  w_.Open(absl::StrCat("for (int f = 0; f < ", nf, "; ++f)"));
  w_.Line("const long col = c0 + 8 * f + 2 * t;");
  w_.Line(absl::StrCat(acc_at("r0 + g", "col"), " = c[f][0]; ", acc_at("r0 + g", "col + 1"), " = c[f][1];"));
  w_.Line(absl::StrCat(acc_at("r0 + g + 8", "col"), " = c[f][2]; ", acc_at("r0 + g + 8", "col + 1"), " = c[f][3];"));
  w_.Close();
  w_.Close();  // units
  w_.Close();
  Sync();
}

// The product of the current tile, once every thread has staged the
// operands staged per point.
void CudaEmitter::TileProduct(const space::OpNest& on) {
  if (on.a_per_point || on.b_per_point) Sync();
  MmaTile(on);
}

}  // namespace fusor::codegen::cuda
