#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codegen/cpu/cpu_codegen.h"
#include "common/codegen/cpu/cpu_emit.h"
#include "common/codegen/emit.h"
#include "common/mapping/mapping.h"
#include "common/space/split.h"

namespace fusor::codegen {
namespace {

using emit::CloseScopes;
using emit::ExprToC;
using emit::FlatIndex;
using emit::FloatLit;
using emit::GlobalOffset;
using emit::GlobalStrides;
using emit::LinearToC;
using emit::LoadConvert;
using emit::LoadFn;
using emit::Names;
using emit::OpenPointLoops;
using emit::ProductToC;
using emit::StoreConvert;
using emit::Writer;
using ir::Access;
using ir::Chain;
using ir::Op;
using ir::OpKind;
using ir::TensorRole;

class BaselineEmitter {
 public:
  BaselineEmitter(const Chain& chain, CpuBlas blas) : chain_(chain), blas_(blas), n_{chain} {}

  std::string Emit() {
    std::string title = absl::StrCat("// fusor unfused baseline for chain '", chain_.name,
                                     "': each op over whole tensors, GEMMs through ", CpuBlasName(blas_),
                                     ", the other ops as vector passes\n");
    std::string out = cpu::Preamble(title) + "#include <omp.h>\n" +
                      (blas_ == CpuBlas::kOneDnn ? "#include <dnnl.h>\n\n" : "#include <cblas.h>\n\n") +
                      "// A calling thread's buffer, kept for its next call.\n"
                      "struct fusor_owned { float* p = 0; ~fusor_owned() { free(p); } };\n\n";
    Writer& w = w_;
    w.Open("extern \"C\" int fusor_run(const void* const* fusor_inputs, void* const* fusor_outputs, "
           "int num_threads)");
    cpu::DeclareArguments(w, chain_, n_);
    w.Line("const int nt = num_threads > 0 ? num_threads : 1;");
    w.Line("int failed = 0;");
    const bool f32 = chain_.dtype == ir::DType::kF32;
    // f32 views of every tensor: aliases where the dtype is already f32,
    // buffers allocated on a thread's first call otherwise (as a framework's
    // caching allocator would), so that threads may call it at once.
    std::vector<int> owned;
    for (size_t t = 0; t < chain_.tensors.size(); ++t) {
      const ir::Tensor& tensor = chain_.tensors[t];
      bool alias = f32 && tensor.role != TensorRole::kIntermediate;
      if (alias) {
        w.Line(absl::StrCat("float* const ", n_.Full(t), " = (float*)", n_.Global(t), ";"));
      } else {
        owned.push_back(static_cast<int>(t));
      }
    }
    for (int t : owned) {
      const std::string own = "own_" + chain_.tensors[t].name;
      w.Line(absl::StrCat("static thread_local fusor_owned ", own, ";"));
      w.Line(absl::StrCat("if (!", own, ".p) ", own, ".p = (float*)malloc(sizeof(float) * ",
                          chain_.tensors[t].NumElements(), "L);"));
      w.Line(absl::StrCat("if (!", own, ".p) return 1;"));
      w.Line(absl::StrCat("float* const ", n_.Full(t), " = ", own, ".p;"));
    }
    // The library's threads: OpenBLAS's own count, oneDNN's from OpenMP. A
    // call inside a parallel region runs on its one thread either way.
    w.Line("omp_set_num_threads(nt);");
    if (blas_ == CpuBlas::kOpenBlas) w.Line("openblas_set_num_threads(nt);");
    if (!f32) {
      for (int t : chain_.inputs) ConvertPass(t, /*to_f32=*/true);
    }
    for (const Op& op : chain_.ops) {
      w.Line(absl::StrCat("// ", ir::OpToString(op, chain_)));
      w.Open("");
      std::vector<int> dims = op.index;
      dims.insert(dims.end(), op.reduce.begin(), op.reduce.end());
      for (int d : dims) {
        w.Line(absl::StrCat("const long ", n_.O(d), " = 0, ", n_.N(d), " = ", chain_.dims[d].extent, "L;"));
      }
      w.Line(absl::StrCat("(void)", absl::StrJoin(dims, ", (void)", [&](std::string* s, int d) {
                            s->append(n_.O(d));
                          }), ";"));
      space::GemmForm g = BaselineForm(static_cast<int>(&op - chain_.ops.data()));
      if (op.kind == OpKind::kSum && g.ok) {
        if (!EmitDirectGemm(op, g)) EmitPackedGemm(op, g);
      } else if (op.kind == OpKind::kSum) {
        EmitLoopSum(op);
      } else if (op.kind == OpKind::kMap) {
        EmitMap(op);
      } else {
        EmitSoftmax(op);
      }
      w.Close();
    }
    if (!f32) {
      for (int t : chain_.outputs) ConvertPass(t, /*to_f32=*/false);
    }
    w.Line("return failed;");
    w.Close();
    return out + w.Take();
  }

 private:
  // One row-major GEMM C = scale * op(A) op(B) through the library.
  std::string Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double scale, const std::string& a,
                   int64_t lda, const std::string& b, int64_t ldb, const std::string& c, int64_t ldc) const {
    if (blas_ == CpuBlas::kOneDnn) {
      return absl::StrCat("if (dnnl_sgemm('", trans_a ? "T" : "N", "', '", trans_b ? "T" : "N", "', ", m, ", ", n, ", ",
                          k, ", ", FloatLit(scale), ", ", a, ", ", lda, ", ", b, ", ", ldb, ", 0.0f, ", c, ", ", ldc,
                          ") != dnnl_success) failed = 1;");
    }
    return absl::StrCat("cblas_sgemm(CblasRowMajor, ", trans_a ? "CblasTrans" : "CblasNoTrans", ", ",
                        trans_b ? "CblasTrans" : "CblasNoTrans", ", ", m, ", ", n, ", ", k, ", ", FloatLit(scale),
                        ", ", a, ", ", lda, ", ", b, ", ", ldb, ", 0.0f, ", c, ", ", ldc, ");");
  }

  // A parallel loop over `trips`, when there are enough of them.
  static std::string ParallelIf(int64_t trips) {
    return absl::StrCat("#pragma omp parallel for num_threads(nt) schedule(static) if (", trips, " >= nt)");
  }

  // The lanes of an access along dim d in the f32 views.
  cpu::Lanes FullLanes(const Access& a, int d) const {
    int64_t constant = 0;
    std::map<int, int64_t> strides = GlobalStrides(a, chain_, &constant);
    cpu::Lanes l;
    l.ptr = absl::StrCat("&", n_.Full(a.tensor), "[", GlobalOffset(a, n_), "]");
    l.stride = strides.count(d) ? strides.at(d) : 0;
    return l;
  }

  // An elementwise op: rows in parallel, the last dim in vectors.
  void EmitMap(const Op& op) {
    const int inner = op.index.back();
    std::vector<int> outer(op.index.begin(), op.index.end() - 1);
    const int64_t rows = outer.empty() ? 1 : chain_.dims[outer[0]].extent;
    int opened = OpenPointLoops(w_, outer, n_, outer.empty() ? "" : ParallelIf(rows));
    const cpu::Lanes out = FullLanes(ir::ResultAccess(op), inner);
    cpu::VectorLoop(w_, n_.I(inner), n_.N(inner), absl::StrCat("const long ", n_.V(inner), " = ", n_.I(inner), ";"),
                    [&](bool vector) {
                      if (vector) {
                        w_.Line(cpu::VectorStore(out, cpu::VectorExpr(op.body, [&](const Access& a) {
                                                   return FullLanes(a, inner);
                                                 })));
                      } else {
                        w_.Line(absl::StrCat(FullAt(op), " = ", ExprToC(op.body, Loader()), ";"));
                      }
                    });
    CloseScopes(w_, opened);
  }

  // f16/bf16 storage to its f32 view (inputs) or back (outputs), in vectors.
  void ConvertPass(int t, bool to_f32) {
    const int64_t n = chain_.tensors[t].NumElements();
    const int64_t chunk = 4096;
    const std::string suffix = chain_.dtype == ir::DType::kF16 ? "_f16" : "_bf16";
    w_.Line("#pragma omp parallel for num_threads(nt) schedule(static)");
    w_.Open(absl::StrCat("for (long c = 0; c < ", (n + chunk - 1) / chunk, "L; ++c)"));
    w_.Line(absl::StrCat("const long lo = c * ", chunk, "L, hi = lo + ", chunk, "L < ", n, "L ? lo + ", chunk, "L : ",
                         n, "L;"));
    w_.Line("long i = lo;");
    if (to_f32) {
      w_.Line(absl::StrCat("for (; i + FUSOR_VL <= hi; i += FUSOR_VL) fusor_vstore(", n_.Full(t), " + i, fusor_vload",
                           suffix, "(", n_.Global(t), " + i));"));
      w_.Line(absl::StrCat("for (; i < hi; ++i) ", n_.Full(t), "[i] = ",
                           LoadConvert(chain_.dtype, absl::StrCat(n_.Global(t), "[i]")), ";"));
    } else {
      w_.Line(absl::StrCat("for (; i + FUSOR_VL <= hi; i += FUSOR_VL) fusor_vstore", suffix, "(", n_.Global(t),
                           " + i, fusor_vload(", n_.Full(t), " + i));"));
      w_.Line(absl::StrCat("for (; i < hi; ++i) ", n_.Global(t), "[i] = ",
                           StoreConvert(chain_.dtype, absl::StrCat(n_.Full(t), "[i]")), ";"));
    }
    w_.Close();
  }


  LoadFn Loader() const {
    return [this](const Access& a) { return absl::StrCat(n_.Full(a.tensor), "[", GlobalOffset(a, n_), "]"); };
  }

  // The GEMM view a framework would take: the default mapping's rows and
  // columns (oriented so the output's last dim is a column), every reduced
  // dim in the reduction (im2col for convolutions).
  space::GemmForm BaselineForm(int op) const {
    auto sw = mapping::ViewOp(chain_, op);
    if (!sw.ok()) return {};
    auto m = mapping::DefaultMapping(chain_, *sw, *hw::FindIntrinsic("scalar.4x4"));
    if (!m) return {};
    space::GemmForm g = space::FormOf(chain_, *sw, *m);
    g.kdims = chain_.ops[op].reduce;
    g.outer_reduce.clear();
    const int last = chain_.ops[op].index.back();
    if (std::find(g.rows.begin(), g.rows.end(), last) != g.rows.end()) {
      std::swap(g.rows, g.cols);
      std::swap(g.a_side, g.b_side);
    }
    return g;
  }

  std::string FullAt(const Op& op) const {
    return absl::StrCat(n_.Full(op.output), "[", GlobalOffset(ir::ResultAccess(op), n_), "]");
  }

  // One cblas_sgemm per batch point when both sides are single plain
  // accesses with one row, one column and one reduced dim, strided so BLAS
  // can read them in place. Returns false (emitting nothing) otherwise.
  bool EmitDirectGemm(const Op& op, const space::GemmForm& g) {
    if (g.a_side.size() != 1 || g.b_side.size() != 1 || g.rows.size() != 1 || g.cols.size() != 1 ||
        op.reduce.size() != 1) {
      return false;
    }
    for (const Access* a : {&g.a_side[0], &g.b_side[0]}) {
      for (const ir::AffineExpr& e : a->index) {
        if (!e.IsPlainDim()) return false;
      }
    }
    const int r = g.rows[0], c = g.cols[0], k = op.reduce[0];
    const int64_t m_ext = chain_.dims[r].extent, n_ext = chain_.dims[c].extent, k_ext = chain_.dims[k].extent;
    int64_t const_a = 0, const_b = 0, const_c = 0;
    auto sa = GlobalStrides(g.a_side[0], chain_, &const_a);
    auto sb = GlobalStrides(g.b_side[0], chain_, &const_b);
    auto sc = GlobalStrides(ir::ResultAccess(op), chain_, &const_c);
    // A is M x K: element (r, k) at r*sa[r] + k*sa[k].
    bool trans_a, trans_b;
    int64_t lda, ldb;
    if (sa[k] == 1 && sa[r] >= k_ext) {
      trans_a = false, lda = sa[r];
    } else if (sa[r] == 1 && sa[k] >= m_ext) {
      trans_a = true, lda = sa[k];
    } else {
      return false;
    }
    if (sb[c] == 1 && sb[k] >= n_ext) {
      trans_b = false, ldb = sb[k];
    } else if (sb[k] == 1 && sb[c] >= k_ext) {
      trans_b = true, ldb = sb[c];
    } else {
      return false;
    }
    if (sc[c] != 1 || sc[r] < n_ext) return false;
    auto base = [&](const std::map<int, int64_t>& s, int64_t constant) {
      std::vector<std::pair<int64_t, std::string>> terms;
      for (int d : g.batch) {
        auto it = s.find(d);
        if (it != s.end()) terms.push_back({it->second, n_.V(d)});
      }
      return LinearToC(terms, constant);
    };
    // With oneDNN, batches in parallel, each GEMM on one thread, when they
    // are enough to occupy the threads (OpenBLAS, called from a parallel
    // region, runs many times slower); else one after another, each GEMM
    // on every thread.
    const int64_t first_batch = g.batch.empty() ? 1 : chain_.dims[g.batch[0]].extent;
    int opened = OpenPointLoops(w_, g.batch, n_, blas_ == CpuBlas::kOneDnn ? ParallelIf(first_batch) : "");
    w_.Line(Gemm(trans_a, trans_b, m_ext, n_ext, k_ext, g.scale,
                 absl::StrCat(n_.Full(g.a_side[0].tensor), " + ", base(sa, const_a)), lda,
                 absl::StrCat(n_.Full(g.b_side[0].tensor), " + ", base(sb, const_b)), ldb,
                 absl::StrCat(n_.Full(op.output), " + ", base(sc, const_c)), sc[r]));
    CloseScopes(w_, opened);
    return true;
  }

  // Packs each side into dense row-major matrices (im2col for affine
  // accesses), multiplies with cblas_sgemm, scatters the result.
  void EmitPackedGemm(const Op& op, const space::GemmForm& g) {
    int64_t m = 1, n = 1, k = 1;
    for (int d : g.rows) m *= chain_.dims[d].extent;
    for (int d : g.cols) n *= chain_.dims[d].extent;
    for (int d : op.reduce) k *= chain_.dims[d].extent;
    for (const char* name : {"ta", "tb", "tc"}) {
      int64_t size = std::string(name) == "ta" ? m * k : std::string(name) == "tb" ? k * n : m * n;
      w_.Line(absl::StrCat("static float* ", name, " = 0;"));
      w_.Line(absl::StrCat("if (!", name, ") ", name, " = (float*)malloc(sizeof(float) * ", size, "L);"));
      w_.Line(absl::StrCat("if (!", name, ") return 1;"));
    }
    const std::string pragma = "#pragma omp parallel for num_threads(nt)";
    int outer = OpenPointLoops(w_, g.batch, n_);
    std::vector<int> a_dims = g.rows;
    a_dims.insert(a_dims.end(), op.reduce.begin(), op.reduce.end());
    int opened = OpenPointLoops(w_, a_dims, n_, pragma);
    w_.Line(absl::StrCat("ta[(", FlatIndex(g.rows, n_), ") * ", k, "L + (", FlatIndex(op.reduce, n_), ")] = ",
                         ProductToC(g.a_side, g.scale, Loader()), ";"));
    CloseScopes(w_, opened);
    std::vector<int> b_dims = op.reduce;
    b_dims.insert(b_dims.end(), g.cols.begin(), g.cols.end());
    opened = OpenPointLoops(w_, b_dims, n_, pragma);
    w_.Line(absl::StrCat("tb[(", FlatIndex(op.reduce, n_), ") * ", n, "L + (", FlatIndex(g.cols, n_), ")] = ",
                         ProductToC(g.b_side, 1, Loader()), ";"));
    CloseScopes(w_, opened);
    w_.Line(Gemm(false, false, m, n, k, 1, "ta", k, "tb", n, "tc", n));
    std::vector<int> c_dims = g.rows;
    c_dims.insert(c_dims.end(), g.cols.begin(), g.cols.end());
    opened = OpenPointLoops(w_, c_dims, n_, pragma);
    w_.Line(absl::StrCat(FullAt(op), " = tc[(", FlatIndex(g.rows, n_), ") * ", n, "L + (",
                         FlatIndex(g.cols, n_), ")];"));
    CloseScopes(w_, opened);
    CloseScopes(w_, outer);
  }

  void EmitLoopSum(const Op& op) {
    int opened = OpenPointLoops(w_, op.index, n_, "#pragma omp parallel for num_threads(nt)");
    w_.Line("float s = 0.0f;");
    int inner = OpenPointLoops(w_, op.reduce, n_);
    w_.Line(absl::StrCat("s += ", ExprToC(op.body, Loader()), ";"));
    CloseScopes(w_, inner);
    w_.Line(absl::StrCat(FullAt(op), " = s;"));
    CloseScopes(w_, opened);
  }

  // Softmax rows in parallel: the row's inputs into the output row, then
  // max, exponentials and the sum (vector helpers), then the scaling. Along
  // an axis that is not the last, elementwise.
  void EmitSoftmax(const Op& op) {
    std::vector<int> others;
    for (int d : op.index) {
      if (d != op.axis) others.push_back(d);
    }
    const int ax = op.axis;
    const std::string def = absl::StrCat("const long ", n_.V(ax), " = ", n_.I(ax), ";");
    const int64_t rows = others.empty() ? 1 : chain_.dims[others[0]].extent;
    int opened = OpenPointLoops(w_, others, n_, others.empty() ? "" : ParallelIf(rows));
    const cpu::Lanes out = FullLanes(ir::ResultAccess(op), ax);
    if (out.stride == 1) {
      w_.Line(absl::StrCat("float* const row = &", n_.Full(op.output), "[", RowStart(op), "];"));
      cpu::VectorLoop(w_, n_.I(ax), n_.N(ax), def, [&](bool vector) {
        if (vector) {
          w_.Line(cpu::VectorStore(out, cpu::VectorExpr(op.body, [&](const Access& a) { return FullLanes(a, ax); })));
        } else {
          w_.Line(absl::StrCat(FullAt(op), " = ", ExprToC(op.body, Loader()), ";"));
        }
      });
      if (op.Causal()) {
        w_.Line(absl::StrCat("for (long j = ", emit::CausalKept(op, n_), "; j < ", n_.N(ax), "; ++j) row[j] = -INFINITY;"));
      }
      w_.Line(absl::StrCat("const float inv = 1.0f / fusor_row_exp_sum(row, ", n_.N(ax), ", fusor_row_max(row, ",
                           n_.N(ax), "));"));
      w_.Line(absl::StrCat("for (long j = 0; j < ", n_.N(ax), "; ++j) row[j] *= inv;"));
      CloseScopes(w_, opened);
      return;
    }
    const std::string loop = absl::StrCat("for (long ", n_.I(ax), " = 0; ", n_.I(ax), " < ", chain_.dims[ax].extent,
                                          "L; ++", n_.I(ax), ")");
    w_.Line("float mx = -INFINITY;");
    w_.Open(loop);
    w_.Line(def);
    w_.Line(absl::StrCat("const float x = ", emit::CausalValue(op, n_, ExprToC(op.body, Loader()), "-INFINITY"), ";"));
    w_.Line(absl::StrCat(FullAt(op), " = x;"));
    w_.Line("mx = x > mx ? x : mx;");
    w_.Close();
    w_.Line("float total = 0.0f;");
    w_.Open(loop);
    w_.Line(def);
    w_.Line(absl::StrCat("const float e = mx == -INFINITY ? 0.0f : fusor_exp(", FullAt(op), " - mx);"));
    w_.Line(absl::StrCat(FullAt(op), " = e;"));
    w_.Line("total += e;");
    w_.Close();
    w_.Line("const float inv = 1.0f / total;");
    w_.Open(loop);
    w_.Line(def);
    w_.Line(absl::StrCat(FullAt(op), " *= inv;"));
    w_.Close();
    CloseScopes(w_, opened);
  }

  // The offset of the softmax output row's first element (axis at 0).
  std::string RowStart(const Op& op) const {
    Access self = ir::ResultAccess(op);
    for (size_t axis = 0; axis < op.index.size(); ++axis) {
      if (op.index[axis] == op.axis) self.index[axis] = ir::AffineExpr{};
    }
    return GlobalOffset(self, n_);
  }

  const Chain& chain_;
  const CpuBlas blas_;
  Names n_;
  Writer w_;
};

}  // namespace

const char* CpuBlasName(CpuBlas blas) { return blas == CpuBlas::kOneDnn ? "onednn" : "openblas"; }

std::optional<CpuBlas> CpuBlasNamed(absl::string_view name) {
  for (CpuBlas blas : {CpuBlas::kOpenBlas, CpuBlas::kOneDnn}) {
    if (name == CpuBlasName(blas)) return blas;
  }
  return std::nullopt;
}

absl::StatusOr<KernelSource> EmitCpuUnfusedBaseline(const Chain& chain, CpuBlas blas) {
  if (!chain.RangedDims().empty()) {
    return absl::InvalidArgumentError(
        "the unfused chain is built at one size (ir::AtSizes); a chain with ranged dims has no unfused kernel");
  }
  KernelSource k;
  k.source = BaselineEmitter(chain, blas).Emit();
  k.compile_flags = cpu::CompileFlags();
  k.link_libs = {blas == CpuBlas::kOneDnn ? "dnnl" : "openblas"};
  nlohmann::json meta = cpu::KernelJson(chain, absl::StrCat(space::kUnfusedPrefix, CpuBlasName(blas)));
  meta["baseline"] = absl::StrCat("unfused, GEMMs through ", CpuBlasName(blas));
  meta["link_libs"] = k.link_libs;
  k.metadata_json = meta.dump(2);
  return k;
}

}  // namespace fusor::codegen
