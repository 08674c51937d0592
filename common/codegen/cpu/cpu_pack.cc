// Staging: the sides of GEMM-shaped sums packed into the panels the
// micro-kernels read (cpu_emitter.h).
#include "common/codegen/cpu/cpu_emitter.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusor::codegen::cpu {

void FusedEmitter::Pack(const space::OpNest& on, bool a_side) {
  const space::GemmForm& g = on.gemm;
  const GemmNames names = Gemm(on);
  PackSide side;
  side.a_side = a_side;
  side.own = a_side ? g.rows : g.cols;
  side.factors = a_side ? g.a_side : g.b_side;
  // The scale goes with A unless A is read in place.
  side.scale = a_side != a_[on.op].direct ? g.scale : 1;
  side.width = a_side ? on.kernel.mr : on.kernel.nr;
  side.buf = (a_side ? "pa" : "pb") + Sfx(on.op);
  auto load = [this](const Access& a) { return x_.Load(a); };
  const int c = ConstantSide(on.op, a_side);
  if (prep_mode_) {
    // Into this visit's slot of the prepared buffer, where this block is
    // the first of its key to pack it.
    if (c < 0) return;
    w_.Line(absl::StrCat("// prepare: pack ", a_side ? "A" : "B", " side (constant)"));
    w_.Open("");
    w_.Line(absl::StrCat("const long visit = fusor_visits[", c, "]++;"));
    w_.Line(absl::StrCat("float* const ", side.buf, " = fusor_dst[", c, "] ? fusor_dst[", c, "] + visit * ",
                         constant_[c].floats, "L : 0;"));
    w_.Open(absl::StrCat("if (", side.buf, ")"));
  } else if (c >= 0) {
    w_.Line(absl::StrCat("// pack ", a_side ? "A" : "B", " side: constant, packed once by fusor_prepare"));
    w_.Open("if (fusor_prep)");
    w_.Line(absl::StrCat(side.buf, " = fusor_prep->owned[", c, "][fusor_key[", c, "]] + fusor_visit[", c, "]++ * ",
                         constant_[c].floats, "L;"));
    w_.Close();
    w_.Line("else");
  } else if (a_side || window_[on.op].dim < 0) {
    w_.Line(absl::StrCat("// pack ", a_side ? "A" : "B", " side"));
  }
  side.value = ProductToC(side.factors, side.scale, load);
  // With the points in the micro-kernel, B has a slot for each point.
  const bool slotted = !a_side && c < 0 && points_[on.op] && on.b_per_point;
  if (slotted) {
    w_.Open("");
    w_.Line(absl::StrCat("float* const ", side.buf, "s = ", side.buf, " + (", FlatIndex(PackPoints(on), n_), ") * ",
                         BSlotFloats(on), "L;"));
    side.buf += "s";
  }
  if (!a_side && window_[on.op].dim >= 0) {
    PackWindow(on, side);
  } else {
    w_.Open("");
    w_.Line(absl::StrCat("const long own = ", a_side ? names.rows : names.cols, ", own_pad = ",
                         a_side ? names.rows_pad : names.cols_pad, ", kc = ", names.kc, ";"));
    const int opened = OpenPointLoops(w_, g.batch, n_);
    w_.Line(absl::StrCat("const long bi = ", FlatIndex(g.batch, n_), ";"));
    if (side.own.size() == 1) {
      PackPanels(on, side);
    } else {
      PackSeveralDims(on, side);
    }
    CloseScopes(w_, opened);
    w_.Close();
  }
  if (slotted) w_.Close();
  if (prep_mode_) {
    w_.Close();
    w_.Close();
  }
}

void FusedEmitter::PackWindow(const space::OpNest& on, const PackSide& side) {
  const space::GemmForm& g = on.gemm;
  const Window& win = window_[on.op];
  const int r = win.dim, p = win.row;
  const auto at = std::find(g.cols.begin(), g.cols.end(), p);
  const std::vector<int> before(g.cols.begin(), at), after(at + 1, g.cols.end());
  w_.Line(absl::StrCat("// pack B side once for every ", chain_.dims[r].name, ": its point ", chain_.dims[r].name,
                       " reads the window ", chain_.dims[r].name, " rows of ", chain_.dims[p].name, " on"));
  w_.Open("");
  w_.Line(absl::StrCat("const long kc = ", Gemm(on).kc, ", shift = ", WindowShift(on), ";"));
  w_.Line(absl::StrCat("const long ", n_.I(r), " = 0, ", n_.V(r), " = ", n_.O(r), ";"));
  int opened = OpenPointLoops(w_, g.batch, n_);
  w_.Line(absl::StrCat("const long bi = ", FlatIndex(g.batch, n_), ";"));
  opened += OpenPointLoops(w_, g.kdims, n_);
  w_.Line(absl::StrCat("float* const dst = ", side.buf, " + (bi * kc + (", FlatIndex(g.kdims, n_), ")) * ", win.ld,
                       "L;"));
  opened += OpenPointLoops(w_, before, n_);
  w_.Line(absl::StrCat("const long rows = ", n_.N(p), " + ", n_.N(r), " - 1;"));
  w_.Open(absl::StrCat("for (long ", n_.I(p), " = 0; ", n_.I(p), " < rows; ++", n_.I(p), ")"));
  w_.Line(absl::StrCat("const long ", n_.V(p), " = ", n_.O(p), " + ", n_.I(p), ";"));
  w_.Line(absl::StrCat("float* const run = dst + ", n_.I(p), " * shift;"));
  const bool adjacent = after.size() == 1 && Stride(side.factors[0], after[0]) == 1;
  if (adjacent) {
    const int q = after[0];
    CopyRun(side, q, n_.I(q), n_.N(q), absl::StrCat("const long ", n_.V(q), " = ", n_.O(q), " + ", n_.I(q), ";"),
            "run");
  } else {
    const int inner = OpenPointLoops(w_, after, n_);
    w_.Line(absl::StrCat("run[", after.empty() ? std::string("0") : FlatIndex(after, n_), "] = ", side.value, ";"));
    CloseScopes(w_, inner);
  }
  w_.Close();
  w_.Line(absl::StrCat("for (long x = rows * shift; x < ", win.ld, "L; ++x) dst[x] = 0.0f;"));
  CloseScopes(w_, opened);
  w_.Close();
}

std::string FusedEmitter::VectorProduct(const PackSide& side, int d) {
  std::vector<std::string> parts;
  for (const Access& a : side.factors) parts.push_back(VectorLoad(AccessLanes(a, d)));
  std::string v = absl::StrJoin(parts, " * ");
  if (side.scale != 1) absl::StrAppend(&v, " * ", emit::FloatLit(side.scale));
  return v;
}

void FusedEmitter::CopyRun(const PackSide& side, int d, const std::string& var, const std::string& count,
             const std::string& define, const std::string& dst) {
  VectorLoop(
      w_, var, count, define,
      [&](bool vector) {
        if (vector) {
          w_.Line(absl::StrCat("fusor_vstore(", dst, " + ", var, ", ", VectorProduct(side, d), ");"));
        } else {
          w_.Line(absl::StrCat(dst, "[", var, "] = ", side.value, ";"));
        }
      },
      /*masked_tail=*/true);
}

void FusedEmitter::OpenPanel(const PackSide& side) {
  w_.Open(absl::StrCat("for (long c0 = 0; c0 < own; c0 += ", side.width, "L)"));
  w_.Line(absl::StrCat("const long cn = own - c0 < ", side.width, "L ? own - c0 : ", side.width, "L;"));
  w_.Line(absl::StrCat("float* const panel = ", side.buf, " + (bi * (own_pad / ", side.width, "L) + c0 / ",
                       side.width, "L) * kc * ", side.width, "L;"));
}

void FusedEmitter::PackPanels(const space::OpNest& on, const PackSide& side) {
  const space::GemmForm& g = on.gemm;
  const int d = side.own[0];
  bool own_adjacent = false, k_adjacent = g.kdims.size() == 1;
  for (const Access& a : side.factors) {
    own_adjacent = own_adjacent || Stride(a, d) == 1;
    if (g.kdims.size() == 1) k_adjacent = k_adjacent && Stride(a, g.kdims[0]) == 1;
  }
  const bool by_k = k_adjacent && !own_adjacent;
  const bool may_pad = !side.a_side && (!ConstRange(d, on) || *ConstRange(d, on) % side.width != 0);
  if (by_k && side.factors.size() == 1) {
    PackTransposed(on, side, may_pad);
  } else if (by_k) {
    OpenPanel(side);
    w_.Open("for (long j = 0; j < cn; ++j)");
    w_.Line(DefineOwn(d));
    int inner = OpenPointLoops(w_, g.kdims, n_);
    w_.Line(absl::StrCat("panel[(", FlatIndex(g.kdims, n_), ") * ", side.width, "L + j] = ", side.value, ";"));
    CloseScopes(w_, inner);
    w_.Close();
    if (may_pad) PadColumns(side);
    w_.Close();
  } else {
    PackRowByRow(on, side, may_pad);
  }
}

void FusedEmitter::PackTransposed(const space::OpNest& on, const PackSide& side, bool may_pad) {
  const int d = side.own[0], k = on.gemm.kdims[0];
  const Lanes src = AccessLanes(side.factors[0], d);
  const char* fn = src.dtype == ir::DType::kF16    ? "fusor_pack_transposed_f16"
                   : src.dtype == ir::DType::kBF16 ? "fusor_pack_transposed_bf16"
                                                   : "fusor_pack_transposed";
  OpenPanel(side);
  w_.Open("");
  w_.Line(absl::StrCat("const long ", n_.I(d), " = c0, ", n_.V(d), " = ", n_.O(d), " + ", n_.I(d), ";"));
  w_.Line(absl::StrCat("const long ", n_.V(k), " = ", n_.O(k), ";"));
  w_.Line(absl::StrCat(fn, "(", src.ptr, ", ", src.stride_expr.empty() ? absl::StrCat(src.stride, "L") : src.stride_expr,
                       ", panel, ", side.width, "L, cn, kc, ", emit::FloatLit(side.scale), ");"));
  w_.Close();
  if (may_pad) PadColumns(side);
  w_.Close();
}

void FusedEmitter::PackRowByRow(const space::OpNest& on, const PackSide& side, bool may_pad) {
  const space::GemmForm& g = on.gemm;
  const int d = side.own[0];
  int inner = OpenPointLoops(w_, g.kdims, n_);
  w_.Line(absl::StrCat("const long p = ", FlatIndex(g.kdims, n_), ";"));
  if (g.kdims.size() == 1) PrefetchRowsAhead(side, d, g.kdims[0]);
  OpenPanel(side);
  w_.Line(absl::StrCat("float* const dst = panel + p * ", side.width, "L;"));
  VectorLoop(w_, "j", "cn", DefineOwn(d), [&](bool vector) {
    if (vector) {
      w_.Line(absl::StrCat("fusor_vstore(dst + j, ", VectorProduct(side, d), ");"));
    } else {
      w_.Line(absl::StrCat("dst[j] = ", side.value, ";"));
    }
  });
  if (may_pad) w_.Line(absl::StrCat("for (long j = cn; j < ", side.width, "L; ++j) dst[j] = 0.0f;"));
  w_.Close();
  CloseScopes(w_, inner);
}

void FusedEmitter::PrefetchRowsAhead(const PackSide& side, int d, int k) {
  for (const Access& a : side.factors) {
    const int64_t row = Stride(a, k);
    if (row == kRuntimeStride || row * (HasLocal(a.tensor) ? 4 : ir::DTypeBytes(chain_.dtype)) < 4096) continue;
    w_.Open("");
    w_.Line(absl::StrCat("const long ", n_.I(d), " = 0, ", n_.V(d), " = ", n_.O(d), ";"));
    w_.Line(absl::StrCat("const char* const ahead = (const char*)(", AccessLanes(a, d).ptr, " + ", 4 * row,
                         "L);"));
    w_.Line(absl::StrCat("for (long b = 0; b < own * ", HasLocal(a.tensor) ? 4 : ir::DTypeBytes(chain_.dtype),
                         "L; b += 64) __builtin_prefetch(ahead + b, 0, 1);"));
    w_.Close();
  }
}

void FusedEmitter::PackSeveralDims(const space::OpNest& on, const PackSide& side) {
  const space::GemmForm& g = on.gemm;
  const int width = side.width;
  const int k_loops = OpenPointLoops(w_, g.kdims, n_);
  w_.Line(absl::StrCat("float* const dst = ", side.buf, " + (bi * (own_pad / ", width, "L) * kc + (",
                       FlatIndex(g.kdims, n_), ")) * ", width, "L;"));
  if (side.own.empty()) {
    w_.Line(absl::StrCat("dst[0] = ", side.value, ";"));
    if (!side.a_side) w_.Line(absl::StrCat("for (long x = 1; x < ", width, "L; ++x) dst[x] = 0.0f;"));
    CloseScopes(w_, k_loops);
    return;
  }
  const int last = side.own.back();
  bool run_adjacent = false;
  for (const Access& a : side.factors) run_adjacent = run_adjacent || Stride(a, last) == 1;
  const std::vector<int> outer_own(side.own.begin(), side.own.end() - 1);
  int inner = OpenPointLoops(w_, outer_own, n_);
  w_.Line(absl::StrCat("const long x0 = (", FlatIndex(outer_own, n_), ") * ", n_.N(last), ";"));
  w_.Line(absl::StrCat("float* const run = dst + (x0 / ", width, "L) * kc * ", width, "L + x0 % ", width, "L;"));
  const std::string define_last = absl::StrCat("const long ", n_.V(last), " = ", n_.O(last), " + ", n_.I(last), ";");
  if (run_adjacent) {
    w_.Open(absl::StrCat("if (x0 % ", width, "L + ", n_.N(last), " <= ", width, "L)"));
    CopyRun(side, last, n_.I(last), n_.N(last), define_last, "run");
    w_.Close();
    // A run crossing panels: a piece into each.
    w_.Open("else");
    w_.Open(absl::StrCat("for (long i0 = 0; i0 < ", n_.N(last), ";)"));
    w_.Line(absl::StrCat("const long x = x0 + i0, left = ", width, "L - x % ", width, "L, piece = left < ",
                         n_.N(last), " - i0 ? left : ", n_.N(last), " - i0;"));
    w_.Line(absl::StrCat("float* const out = dst + (x / ", width, "L) * kc * ", width, "L + x % ", width, "L;"));
    CopyRun(side, last, "j", "piece",
            absl::StrCat("const long ", n_.I(last), " = i0 + j, ", n_.V(last), " = ", n_.O(last), " + ", n_.I(last),
                         ";"),
            "out");
    w_.Line("i0 += piece;");
    w_.Close();
    w_.Close();
  } else {
    w_.Open(absl::StrCat("for (long ", n_.I(last), " = 0; ", n_.I(last), " < ", n_.N(last), "; ++", n_.I(last),
                         ")"));
    w_.Line(define_last);
    w_.Line(absl::StrCat("const long x = x0 + ", n_.I(last), ";"));
    w_.Line(absl::StrCat("dst[(x / ", width, "L) * kc * ", width, "L + x % ", width, "L] = ", side.value, ";"));
    w_.Close();
  }
  CloseScopes(w_, inner);
  if (!side.a_side) {
    w_.Line(absl::StrCat("for (long x = own; x < own_pad; ++x) dst[(x / ", width, "L) * kc * ", width,
                         "L + x % ", width, "L] = 0.0f;"));
  }
  CloseScopes(w_, k_loops);
}
}  // namespace fusor::codegen::cpu
