// The register-tile micro-kernels and the tile product that calls them;
// sums stored and accumulated (cpu_emitter.h).
#include "common/codegen/cpu/cpu_emitter.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusor::codegen::cpu {

FusedEmitter::GemmNames FusedEmitter::Gemm(const space::OpNest& on, bool packed_outside) const {
  const hw::MicroKernel& k = on.kernel;
  auto count = [&](const std::vector<int>& dims) {
    std::vector<std::string> factors;
    for (int d : dims) {
      const bool full = packed_outside && x_.Bounded(d, &on) && !x_.Bounded(d, &on, /*in_stream=*/false);
      factors.push_back(full ? n_.Extent(d) : n_.N(d));
    }
    return factors.empty() ? std::string("1L") : absl::StrCat("(", absl::StrJoin(factors, " * "), ")");
  };
  GemmNames g;
  g.mr = absl::StrCat(k.mr, "L");
  g.nr = absl::StrCat(k.nr, "L");
  g.rows = count(on.gemm.rows);
  g.cols = count(on.gemm.cols);
  g.kc = count(on.gemm.kdims);
  g.nbatch = count(on.gemm.batch);
  g.rows_pad = absl::StrCat("((", g.rows, " + ", k.mr - 1, "L) / ", g.mr, " * ", g.mr, ")");
  g.cols_pad = absl::StrCat("((", g.cols, " + ", k.nr - 1, "L) / ", g.nr, " * ", g.nr, ")");
  return g;
}

std::string FusedEmitter::MicroKernel(const space::OpNest& on) const {
  const hw::MicroKernel& k = on.kernel;
  const int vecs = k.nr / k.lanes;
  const std::string vt = absl::StrCat("fusor_v", k.lanes);
  const ASide& a = a_[on.op];
  const std::optional<int64_t> kc = ConstCount(on.gemm.kdims, on);
  std::string splat = "{av";
  for (int l = 1; l < k.lanes; ++l) splat += ", av";
  splat += "}";
  const bool epilogue = epilogue_[on.op] != nullptr, tail = c_tail_[on.op], fold = points_[on.op];
  const std::string ap = fold ? "ap" : "a", bp = fold ? "bp" : "b";
  Writer w;
  const Window& win = window_[on.op];
  w.Line(absl::StrCat("// ", chain_.tensors[chain_.ops[on.op].output].name, ": ", k.name, ", A ",
                      a.direct ? "read in place" : "packed",
                      win.dim >= 0 ? ", B a window" : b_direct_[on.op] > 0 ? ", B read in place" : ", B packed",
                      ", C in registers",
                      epilogue ? "; when LAST, epi(row, column, tile) writes the finished tile" : ""));
  w.Line(epilogue ? "template <int MR, bool FIRST, bool LAST, class EPI>" : "template <int MR, bool FIRST>");
  w.Open(absl::StrCat("static inline void fusor_mk", on.op,
                      "(const float* __restrict a, const float* __restrict b, float* __restrict c, long ldc, "
                      "long kc", tail ? ", long nc" : "",
                      fold ? ", const long* __restrict aoff, const long* __restrict boff" : "",
                      epilogue ? ", const EPI& epi)" : ")"));
  if (kc) w.Line("(void)kc;");
  w.Line(absl::StrCat(vt, " acc[MR][", vecs, "];"));
  w.Line("#pragma GCC unroll 16");
  w.Open("for (int r = 0; r < MR; ++r)");
  w.Line("#pragma GCC unroll 16");
  const std::string load = absl::StrCat("*(const ", vt, "*)(c + r * ldc + v * ", k.lanes, ")");
  if (tail) {
    w.Open(absl::StrCat("for (int v = 0; v < ", vecs, "; ++v)"));
    w.Line(absl::StrCat("const long nl = nc - v * ", k.lanes, ";"));
    w.Line(absl::StrCat("if (FIRST || nl < ", k.lanes, ") acc[r][v] = ", vt, "{};"));
    w.Line(absl::StrCat("if (!FIRST && nl >= ", k.lanes, ") acc[r][v] = ", load, ";"));
    w.Line(absl::StrCat("else if (!FIRST && nl > 0) for (long l = 0; l < nl; ++l) acc[r][v][l] = c[r * ldc + v * ",
                        k.lanes, " + l];"));
    w.Close();
  } else {
    w.Line(absl::StrCat("for (int v = 0; v < ", vecs, "; ++v) acc[r][v] = FIRST ? ", vt, "{} : ", load, ";"));
  }
  w.Close();
  if (fold) {
    w.Open(absl::StrCat("for (int pt = 0; pt < ", *ConstCount(on.gemm.outer_reduce, on), "; ++pt)"));
    w.Line("const float* const ap = a + aoff[pt];");
    w.Line("const float* const bp = b + boff[pt];");
  }
  w.Line("#pragma GCC unroll 4");
  w.Open(absl::StrCat("for (long p = 0; p < ", kc ? absl::StrCat(*kc, "L") : "kc", "; ++p)"));
  w.Line(absl::StrCat(vt, " bv[", vecs, "];"));
  w.Line("#pragma GCC unroll 16");
  w.Line(absl::StrCat("for (int v = 0; v < ", vecs, "; ++v) bv[v] = *(const ", vt, "*)(", bp, " + p * ",
                      win.dim >= 0 ? win.ld : b_direct_[on.op] > 0 ? b_direct_[on.op] : k.nr, " + v * ", k.lanes,
                      ");"));
  w.Line("#pragma GCC unroll 16");
  w.Open("for (int r = 0; r < MR; ++r)");
  w.Line(absl::StrCat("const float av = ", ap, "[r * ", a.row_stride, "L + p * ", a.k_stride, "L];"));
  w.Line(absl::StrCat("const ", vt, " ar = ", splat, ";"));
  w.Line("#pragma GCC unroll 16");
  w.Line(absl::StrCat("for (int v = 0; v < ", vecs, "; ++v) acc[r][v] += ar * bv[v];"));
  w.Close();
  w.Close();
  if (fold) w.Close();
  w.Line("#pragma GCC unroll 16");
  w.Open("for (int r = 0; r < MR; ++r)");
  w.Line("#pragma GCC unroll 16");
  const std::string store =
      absl::StrCat("*(", vt, "*)(c + r * ldc + v * ", k.lanes, ") = acc[r][v];");
  if (tail) {
    w.Open(absl::StrCat("for (int v = 0; v < ", vecs, "; ++v)"));
    w.Line(absl::StrCat("const long nl = nc - v * ", k.lanes, " < ", k.lanes, " ? nc - v * ", k.lanes, " : ",
                        k.lanes, ";"));
    w.Line("if (nl <= 0) break;");
    if (epilogue) w.Line(absl::StrCat("if (LAST) epi(r, v * ", k.lanes, ", acc[r][v], nl);"));
    w.Line(absl::StrCat(epilogue ? "else if" : "if", " (nl == ", k.lanes, ") ", store));
    w.Line(absl::StrCat("else for (long l = 0; l < nl; ++l) c[r * ldc + v * ", k.lanes, " + l] = acc[r][v][l];"));
    w.Close();
  } else if (epilogue) {
    w.Open(absl::StrCat("for (int v = 0; v < ", vecs, "; ++v)"));
    w.Line(absl::StrCat("if (LAST) epi(r, v * ", k.lanes, ", acc[r][v]);"));
    w.Line(absl::StrCat("else ", store));
    w.Close();
  } else {
    w.Line(absl::StrCat("for (int v = 0; v < ", vecs, "; ++v) ", store));
  }
  w.Close();
  w.Close();
  return w.Take();
}

void FusedEmitter::DefineAtOrigin(const std::string& type, const std::string& name, const std::vector<int>& origin,
                    const Access& a, int lanes_dim) {
  w_.Line(absl::StrCat(type, " ", name, ";"));
  w_.Open("");
  for (int d : origin) w_.Line(absl::StrCat("const long ", n_.V(d), " = ", n_.O(d), ";"));
  w_.Line(absl::StrCat(name, " = ", AccessLanes(a, lanes_dim).ptr, ";"));
  w_.Close();
}

void FusedEmitter::EmitPointOffsets(const space::OpNest& on) {
  const space::GemmForm& g = on.gemm;
  const Window& win = window_[on.op];
  const int64_t points = *ConstCount(g.outer_reduce, on);
  w_.Line(absl::StrCat("long aoff[", points, "], boff[", points, "];"));
  w_.Open("");
  w_.Line("long pt = 0;");
  const int opened = OpenPointLoops(w_, g.outer_reduce, n_);
  std::vector<std::string> a_terms = {"0"}, b_terms = {"0"};
  if (a_[on.op].direct) {
    for (int d : g.outer_reduce) {
      const int64_t st = Stride(g.a_side[0], d);
      if (st != 0) a_terms.push_back(absl::StrCat(n_.I(d), " * ", st, "L"));
    }
  }
  if (on.b_per_point) {
    b_terms.push_back(absl::StrCat("(", FlatIndex(PackPoints(on), n_), ") * ", BSlotFloats(on), "L"));
    if (win.dim >= 0) b_terms.push_back(absl::StrCat(n_.I(win.dim), " * (", WindowShift(on), ")"));
  }
  w_.Line(absl::StrCat("aoff[pt] = ", absl::StrJoin(a_terms, " + "), ";"));
  w_.Line(absl::StrCat("boff[pt] = ", absl::StrJoin(b_terms, " + "), ";"));
  w_.Line("++pt;");
  CloseScopes(w_, opened);
  w_.Close();
}

void FusedEmitter::EmitTileProduct(const space::OpNest& on, const std::string& first, const std::string& last) {
  const space::GemmForm& g = on.gemm;
  const GemmNames names = Gemm(on);
  const ASide& a = a_[on.op];
  const int mr = on.kernel.mr, nr = on.kernel.nr;
  const std::string o = Sfx(on.op);
  w_.Open("");
  w_.Line(absl::StrCat("const long rows = ", names.rows, ", rows_pad = ", names.rows_pad, ", cols_pad = ",
                       names.cols_pad, ", kc = ", names.kc, ";"));
  if (c_tail_[on.op]) w_.Line(absl::StrCat("const long cols = ", names.cols, ";"));
  // A side packed before the stream loop keeps the layout it was packed
  // in: over a causal axis's full extent, which the loop bounds.
  const GemmNames outside = Gemm(on, /*packed_outside=*/true);
  std::string a_kc = "kc", a_pad = "rows_pad", b_kc = "kc", b_pad = "cols_pad";
  if (on.a_hoisted && !a.direct && (outside.kc != names.kc || outside.rows_pad != names.rows_pad)) {
    w_.Line(absl::StrCat("const long kc_a = ", outside.kc, ", rows_pad_a = ", outside.rows_pad, ";"));
    a_kc = "kc_a", a_pad = "rows_pad_a";
  }
  if (on.b_hoisted && b_direct_[on.op] == 0 && window_[on.op].dim < 0 &&
      (outside.kc != names.kc || outside.cols_pad != names.cols_pad)) {
    w_.Line(absl::StrCat("const long kc_b = ", outside.kc, ", cols_pad_b = ", outside.cols_pad, ";"));
    b_kc = "kc_b", b_pad = "cols_pad_b";
  }
  if (points_[on.op]) EmitPointOffsets(on);
  int opened = OpenPointLoops(w_, g.batch, n_);
  w_.Line(absl::StrCat("const long bi = ", FlatIndex(g.batch, n_), ";"));
  if (a.direct) {
    // A's element at the tile's first row and k (and first point).
    std::vector<int> origin = g.rows;
    origin.push_back(g.kdims[0]);
    if (points_[on.op]) origin.insert(origin.end(), g.outer_reduce.begin(), g.outer_reduce.end());
    DefineAtOrigin("const float*", "a0", origin, g.a_side[0], RowDim(on));
  } else {
    w_.Line(absl::StrCat("const float* const a0 = pa", o, " + bi * ", a_pad, " * ", a_kc, ";"));
  }
  const Window& win = window_[on.op];
  if (win.dim >= 0) {
    w_.Line(absl::StrCat("const float* const b0 = pb", o, " + bi * kc * ", win.ld, "L",
                         points_[on.op] ? "" : absl::StrCat(" + ", n_.I(win.dim), " * (", WindowShift(on), ")"),
                         ";"));
  } else if (b_direct_[on.op] > 0) {
    // B's element at the tile's first column and k.
    std::vector<int> origin = g.cols;
    origin.push_back(g.kdims[0]);
    DefineAtOrigin("const float*", "b0", origin, g.b_side[0], g.cols.back());
  } else {
    w_.Line(absl::StrCat("const float* const b0 = pb", o, " + bi * ", b_pad, " * ", b_kc, ";"));
  }
  const int64_t c_stride = direct_c_[on.op];
  if (c_stride > 0) {
    // The result's element at the tile's first row and column.
    std::vector<int> origin = g.cols;
    origin.insert(origin.end(), g.rows.begin(), g.rows.end());
    DefineAtOrigin("float*", "c0", origin, ir::ResultAccess(chain_.ops[on.op]), g.cols.back());
  } else {
    w_.Line(absl::StrCat("float* const c0 = acc", o, " + bi * rows_pad * cols_pad;"));
  }
  const std::string ldc = c_stride > 0 ? absl::StrCat(c_stride, "L") : "cols_pad";
  // Row strip r starts at a0 + r * (row stride); packed A holds strips of
  // mr rows, kc * mr floats each.
  const std::string a_at = a.direct ? absl::StrCat("a0 + r * ", a.row_stride, "L") : "a0 + r * " + a_kc;
  const bool epilogue = epilogue_[on.op] != nullptr;
  const std::string args = absl::StrCat(
      "(", a_at, win.dim >= 0 || b_direct_[on.op] > 0 ? ", b0 + c, c0 + r * " : ", b0 + c * " + b_kc + ", c0 + r * ", ldc,
      " + c, ", ldc, ", kc",
      c_tail_[on.op] ? absl::StrCat(", cols - c < ", nr, "L ? cols - c : ", nr, "L") : "",
      points_[on.op] ? ", aoff, boff" : "", epilogue ? ", epi);" : ");");
  auto calls = [&](const std::string& mr_value) { EmitKernelCalls(on, mr_value, args, first, last); };
  w_.Line("long r = 0;");
  w_.Open(absl::StrCat("for (; r + ", mr, "L <= rows; r += ", mr, "L)"));
  calls(absl::StrCat(mr));
  w_.Close();
  // The last rows: a micro-kernel of exactly that many.
  const std::optional<int64_t> rows = ConstCount(g.rows, on);
  if (rows) {
    if (*rows % mr != 0) calls(absl::StrCat(*rows % mr));
  } else if (mr > 1) {
    w_.Open("switch (rows - r)");
    for (int m = 1; m < mr; ++m) {
      w_.Open(absl::StrCat("case ", m, ":"));
      calls(absl::StrCat(m));
      w_.Line("break;");
      w_.Close();
    }
    w_.Line("default: break;");
    w_.Close();
  }
  CloseScopes(w_, opened);
  w_.Close();
}

void FusedEmitter::EmitKernelCalls(const space::OpNest& on, const std::string& mr_value, const std::string& args,
                                   const std::string& first, const std::string& last) {
  const bool epilogue = epilogue_[on.op] != nullptr;
  const std::string o = Sfx(on.op);
  w_.Open(absl::StrCat("for (long c = 0; c < cols_pad; c += ", on.kernel.nr, "L)"));
  if (epilogue) EmitEpilogue(on);
  // One call per variant, each under the conditions that pick it.
  std::vector<std::pair<std::string, std::string>> variants;
  for (const auto& [f, f_when] : Variants(first)) {
    for (const auto& [l, l_when] : epilogue ? Variants(last) : Variants("true")) {
      std::vector<std::string> when;
      for (const std::string& c : {f_when, l_when}) {
        if (!c.empty()) when.push_back(c);
      }
      variants.push_back({absl::StrCat("fusor_mk", o, "<", mr_value, ", ", f, epilogue ? ", " + l : "", ">", args),
                          absl::StrJoin(when, " && ")});
    }
  }
  for (size_t i = 0; i < variants.size(); ++i) {
    const std::string call = variants[i].first;
    if (variants.size() == 1) {
      w_.Line(call);
    } else if (i == 0) {
      w_.Line(absl::StrCat("if (", variants[i].second, ") ", call));
    } else if (i + 1 < variants.size()) {
      w_.Line(absl::StrCat("else if (", variants[i].second, ") ", call));
    } else {
      w_.Line(absl::StrCat("else ", call));
    }
  }
  w_.Close();
}

void FusedEmitter::StageAtLevel(const space::OpNest& on, int level) {
  if (!on.gemm.ok) {
    if (prep_mode_) return;
    if (level == on.num_out_loops) {
      w_.Line(absl::StrCat("memset(acc", Sfx(on.op), ", 0, sizeof(float) * ", Count(chain_.ops[on.op].index, n_),
                           ");"));
    }
    return;
  }
  if (StagedAtLevel(on, true, level)) Pack(on, true);
  if (StagedAtLevel(on, false, level)) Pack(on, false);
}

void FusedEmitter::TileProduct(const space::OpNest& on) {
  if (prep_mode_) return;  // the prepare walk: loops and constant packs only
  // The first and the last partial sum of the tile: its reduced own loops'
  // first and last trips, and the first and last points of the reduced
  // dims outside the micro-kernel.
  std::vector<std::string> firsts, lasts;
  for (size_t i = on.num_out_loops; i < on.loops.size(); ++i) {
    const int d = on.loops[i];
    firsts.push_back(absl::StrCat(n_.O(d), " == 0"));
    lasts.push_back(absl::StrCat(n_.O(d), " + ", n_.N(d), " >= ", n_.Extent(d)));
  }
  for (int d : points_[on.op] ? std::vector<int>{} : on.gemm.outer_reduce) {
    firsts.push_back(absl::StrCat(n_.I(d), " == 0"));
    lasts.push_back(absl::StrCat(n_.I(d), " + 1 == ", n_.N(d)));
  }
  EmitTileProduct(on, firsts.empty() ? "true" : absl::StrJoin(firsts, " && "),
                  lasts.empty() ? "true" : absl::StrJoin(lasts, " && "));
}

std::string FusedEmitter::RowFactor(const space::OpNest& on, int d) const {
  const int sm = Normalizes(on);
  if (sm < 0) return "";
  const std::string at = absl::StrCat("sinv", sm, "[", x_.StateOffset(chain_.ops[sm]), "]");
  if (d < 0) return " * " + at;
  Lanes inv;
  inv.ptr = "&" + at;
  inv.stride = x_.StateStride(chain_.ops[sm], d);
  return " * " + VectorLoad(inv);
}

void FusedEmitter::StoreSum(const Op& op, const space::OpNest& on) {
  if (prep_mode_) return;  // the prepare walk: loops and constant packs only
  if (!on.gemm.ok) {
    const int opened = OpenPointLoops(w_, op.index, n_);
    x_.Store(w_, on, absl::StrCat("acc", Sfx(on.op), "[", FlatIndex(op.index, n_), "]", RowFactor(on, -1)));
    CloseScopes(w_, opened);
    return;
  }
  if (direct_c_[on.op] > 0) {
    // The micro-kernels wrote it; what is left is dividing its rows.
    if (Normalizes(on) < 0) return;
    w_.Line("// divided by the softmax's row sums");
    const Access self = ir::ResultAccess(op);
    const int inner = InnerDim(op.index, [&](int d) { return ResultStride(on, d); });
    PointwiseLoops(op.index, inner, [&](bool vector) {
      if (vector) {
        StoreVector(on, inner, VectorLoad(AccessLanes(self, inner)) + RowFactor(on, inner));
      } else {
        x_.Store(w_, on, x_.Load(self) + RowFactor(on, -1));
      }
    });
    return;
  }
  // Store the finished tile.
  const space::GemmForm& g = on.gemm;
  const GemmNames names = Gemm(on);
  w_.Open("");
  w_.Line(absl::StrCat("const long rows_pad = ", names.rows_pad, ", cols_pad = ", names.cols_pad, ";"));
  const std::string at = absl::StrCat("acc", Sfx(on.op), "[((", FlatIndex(g.batch, n_), ") * rows_pad + (",
                                      FlatIndex(g.rows, n_), ")) * cols_pad + (", FlatIndex(g.cols, n_), ")]");
  std::vector<int> dims = g.batch;
  dims.insert(dims.end(), g.rows.begin(), g.rows.end());
  dims.insert(dims.end(), g.cols.begin(), g.cols.end());
  if (!g.cols.empty()) {
    // Along the last column dim, adjacent in the accumulator.
    const int inner = g.cols.back();
    PointwiseLoops(dims, inner, [&](bool vector) {
      if (vector) {
        StoreVector(on, inner, absl::StrCat("fusor_vload(&", at, ")", RowFactor(on, inner)));
      } else {
        x_.Store(w_, on, at + RowFactor(on, -1));
      }
    });
  } else {
    int opened = OpenPointLoops(w_, dims, n_);
    x_.Store(w_, on, at + RowFactor(on, -1));
    CloseScopes(w_, opened);
  }
  w_.Close();
}

void FusedEmitter::AccumulateSum(const Op& op, const space::OpNest& on) {
  if (prep_mode_) return;  // the prepare walk: loops and constant packs only
  auto load = [this](const Access& a) { return x_.Load(a); };
  const int opened = OpenPointLoops(w_, op.index, n_);
  w_.Line("float s = 0.0f;");
  const int inner = OpenPointLoops(w_, op.reduce, n_);
  w_.Line(absl::StrCat("s += ", ExprToC(op.body, load), ";"));
  CloseScopes(w_, inner);
  w_.Line(absl::StrCat("acc", Sfx(on.op), "[", FlatIndex(op.index, n_), "] += s;"));
  CloseScopes(w_, opened);
}
}  // namespace fusor::codegen::cpu
