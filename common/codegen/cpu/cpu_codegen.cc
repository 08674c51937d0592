#include "common/codegen/cpu/cpu_codegen.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/codegen/cpu/prelude.h"
#include "common/codegen/emit.h"

namespace fusor::codegen {
namespace {

using ir::Access;
using ir::Chain;
using ir::Expr;
using ir::Op;
using ir::OpKind;
using ir::TensorRole;
using emit::CallFunc;
using emit::CloseScopes;
using emit::OpenPointLoops;
using emit::Count;
using emit::ExprToC;
using emit::FlatIndex;
using emit::FloatLit;
using emit::GlobalOffset;
using emit::GlobalStrides;
using emit::LinearToC;
using emit::LoadConvert;
using emit::LoadFn;
using emit::Names;
using emit::ProductToC;
using emit::StoreConvert;
using emit::TensorsJson;
using emit::Writer;

const std::vector<std::string> kCompileFlags = {
    "-O3", "-march=native", "-std=gnu++17", "-fopenmp", "-ffp-contract=fast", "-fno-math-errno"};

std::string StorageType(ir::DType dtype) { return dtype == ir::DType::kF32 ? "float" : "uint16_t"; }

// The micro-kernel function of intrinsic `k`, named `fn`, using the vector
// type `vt` (lanes floats).
// The micro-kernel function `fn` of intrinsic `k` (its vector type, of
// k.lanes floats, declared by VectorType).
std::string MicroKernel(const hw::MicroKernel& k, const std::string& fn) {
  const int vecs = k.nr / k.lanes;
  const std::string vt = absl::StrCat("fusor_v", k.lanes);
  Writer w;
  w.Line(absl::StrCat("// ", k.name, ": C[", k.mr, "x", k.nr,
                      "] += A[:, p] * B[p, :] for p < kc, C kept in registers."));
  w.Open(absl::StrCat("static inline void ", fn, "(long kc, const float* __restrict a, const float* __restrict b, "
                      "float* __restrict c, long ldc)"));
  for (int r = 0; r < k.mr; ++r) {
    for (int v = 0; v < vecs; ++v) {
      w.Line(absl::StrCat(vt, " c", r, "_", v, " = *(const ", vt, "*)(c + ", r, " * ldc + ", v * k.lanes, ");"));
    }
  }
  w.Open("for (long p = 0; p < kc; ++p)");
  for (int v = 0; v < vecs; ++v) {
    w.Line(absl::StrCat("const ", vt, " b", v, " = *(const ", vt, "*)(b + p * ", k.nr, " + ", v * k.lanes, ");"));
  }
  for (int r = 0; r < k.mr; ++r) {
    w.Line(absl::StrCat("{ const ", vt, " a", r, " = ", k.lanes > 1 ? absl::StrCat("(", vt, "){} + ") : "",
                        "a[p * ", k.mr, " + ", r, "];"));
    std::string updates;
    for (int v = 0; v < vecs; ++v) absl::StrAppend(&updates, " c", r, "_", v, " += a", r, " * b", v, ";");
    w.Line(absl::StrCat(" ", updates, " }"));
  }
  w.Close();
  for (int r = 0; r < k.mr; ++r) {
    for (int v = 0; v < vecs; ++v) {
      w.Line(absl::StrCat("*(", vt, "*)(c + ", r, " * ldc + ", v * k.lanes, ") = c", r, "_", v, ";"));
    }
  }
  w.Close();
  return w.Take();
}

// typedef of the vector type of `lanes` floats, unaligned loads allowed.
std::string VectorType(int lanes) {
  if (lanes <= 1) return "typedef float fusor_v1;\n";
  return absl::StrCat("typedef float fusor_v", lanes, " __attribute__((vector_size(", 4 * lanes, "), aligned(4)));\n");
}

std::string Preamble(const std::string& title_comment) {
  std::string s = title_comment;
  s += "#include <stdint.h>\n#include <stdlib.h>\n#include <string.h>\n#include <math.h>\n\n";
  s += std::string(CpuPreludeSource());
  s += "\n";
  return s;
}

void DeclareArguments(Writer& w, const Chain& chain, const Names& n) {
  const std::string type = StorageType(chain.dtype);
  for (size_t i = 0; i < chain.inputs.size(); ++i) {
    int t = chain.inputs[i];
    w.Line(absl::StrCat("const ", type, "* const ", n.Global(t), " = (const ", type,
                        "*)fusor_inputs[", i, "];"));
  }
  for (size_t i = 0; i < chain.outputs.size(); ++i) {
    int t = chain.outputs[i];
    w.Line(absl::StrCat(type, "* const ", n.Global(t), " = (", type, "*)fusor_outputs[", i, "];"));
  }
}

// ---------------------------------------------------------------- fused ---

class FusedEmitter {
 public:
  FusedEmitter(const Chain& chain, const space::LoopNest& nest)
      : chain_(chain), nest_(nest), s_(nest.schedule), n_{chain}, x_(chain, nest) {
    // Scratch layout: block-local buffers, then the temporaries of the ops
    // inside the stream loop (each its own: hoisted packs live across
    // iterations), then one area the other ops share in turn.
    int64_t offset = 0;
    auto take = [&](int64_t floats) {
      int64_t at = offset;
      offset += (floats + 15) / 16 * 16;
      return at;
    };
    local_offset_.assign(chain.tensors.size(), -1);
    for (size_t t = 0; t < chain.tensors.size(); ++t) {
      if (nest.local[t].floats > 0) local_offset_[t] = take(nest.local[t].floats);
    }
    temp_offset_.assign(chain.ops.size(), 0);
    for (const space::OpNest& on : nest.ops) {
      if (on.region == space::Region::kStream) temp_offset_[on.op] = take(Temps(on));
    }
    const int64_t shared = offset;
    int64_t shared_floats = 0;
    for (const space::OpNest& on : nest.ops) {
      if (on.region != space::Region::kStream) {
        temp_offset_[on.op] = shared;
        shared_floats = std::max(shared_floats, Temps(on));
      }
    }
    scratch_floats_ = shared + shared_floats;
  }

  std::string Emit(const std::string& schedule_text, const std::string& mapping) {
    std::string title = absl::StrCat(
        "// fusor fused CPU kernel for chain '", chain_.name, "'\n", "// schedule: ", schedule_text, "  (",
        space::TilingExpression(s_, chain_), ")\n", "// mapping:  ", mapping, "\n", "// blocks: ", nest_.num_blocks,
        ", scratch per thread: ", nest_.scratch_bytes, " bytes\n", "// chain:\n");
    for (const Op& op : chain_.ops) absl::StrAppend(&title, "//   ", ir::OpToString(op, chain_), "\n");
    std::string out = Preamble(title + "\n");
    std::set<int> lanes;
    for (const space::OpNest& on : nest_.ops) {
      if (on.gemm.ok) lanes.insert(on.kernel.lanes);
    }
    for (int l : lanes) out += VectorType(l);
    for (const space::OpNest& on : nest_.ops) {
      if (!on.gemm.ok || kernel_fn_.count(on.kernel.name)) continue;
      kernel_fn_[on.kernel.name] = absl::StrCat("fusor_mk", kernel_fn_.size());
      out += MicroKernel(on.kernel, kernel_fn_[on.kernel.name]);
    }
    out += "\n";

    Writer& w = w_;
    w.Open("extern \"C\" int fusor_run(const void* const* fusor_inputs, void* const* fusor_outputs, "
           "int num_threads)");
    DeclareArguments(w, chain_, n_);
    const int64_t scratch_bytes = std::max<int64_t>(64, (scratch_floats_ * 4 + 63) / 64 * 64);
    w.Line("int failed = 0;");
    w.Line(absl::StrCat("#pragma omp parallel num_threads(num_threads > 0 ? num_threads : 1) if (",
                        nest_.num_blocks, " > 1)"));
    w.Open("");
    w.Line(absl::StrCat("float* const scratch = (float*)aligned_alloc(64, ", scratch_bytes, ");"));
    w.Open("if (!scratch)");
    w.Line("#pragma omp atomic write");
    w.Line("failed = 1;");
    w.Close();
    w.Line("#pragma omp for schedule(dynamic, 1)");
    w.Open(absl::StrCat("for (long blk = 0; blk < ", nest_.num_blocks, "L; ++blk)"));
    w.Line("if (!scratch) continue;");
    DeclareScratchPointers();
    x_.DefineBlockOrigins(w, "blk");
    EmitRegion(space::Region::kBefore);
    if (nest_.stream_dim >= 0) EmitStream();
    EmitRegion(space::Region::kAfter);
    w.Close();  // block loop
    w.Line("free(scratch);");
    w.Close();  // parallel
    w.Line("return failed;");
    w.Close();
    return out + w.Take();
  }

 private:
  static int64_t Temps(const space::OpNest& on) {
    return on.acc_floats + on.pack_a_floats + on.pack_b_floats + on.row_floats + on.state_floats;
  }

  std::string Sfx(int o) const { return absl::StrCat(o); }

  void DeclareScratchPointers() {
    for (size_t t = 0; t < chain_.tensors.size(); ++t) {
      if (local_offset_[t] < 0) continue;
      w_.Line(absl::StrCat("float* const ", n_.Local(static_cast<int>(t)), " = scratch + ", local_offset_[t], ";"));
    }
    for (const space::OpNest& on : nest_.ops) {
      const std::string o = Sfx(on.op);
      int64_t at = temp_offset_[on.op];
      auto ptr = [&](const char* name, int64_t floats) {
        if (floats == 0) return;
        w_.Line(absl::StrCat("float* const ", name, o, " = scratch + ", at, "; (void)", name, o, ";"));
        at += floats;
      };
      ptr("acc", on.acc_floats);
      ptr("pa", on.pack_a_floats);
      ptr("pb", on.pack_b_floats);
      ptr("row", on.row_floats);
      ptr("smax", on.state_floats / 3);
      ptr("ssum", on.state_floats / 3);
      ptr("sscale", on.state_floats / 3);
    }
  }

  void EmitRegion(space::Region region) {
    for (const space::OpNest& on : nest_.ops) {
      if (on.region == region) EmitOp(on.op);
    }
  }

  void EmitStream() {
    const int sd = nest_.stream_dim;
    w_.Line(absl::StrCat("// stream loop over ", chain_.dims[sd].name));
    for (const space::OpNest& on : nest_.ops) {
      if (on.accumulates) {
        w_.Line(absl::StrCat("memset(", n_.Local(chain_.ops[on.op].output), ", 0, sizeof(float) * ",
                             nest_.local[chain_.ops[on.op].output].floats, ");"));
      }
      if (on.online) {
        w_.Line(absl::StrCat("for (long i = 0; i < ", on.state_floats / 3, "L; ++i) { smax", Sfx(on.op),
                             "[i] = -INFINITY; ssum", Sfx(on.op), "[i] = 0.0f; }"));
      }
    }
    for (const space::OpNest& on : nest_.ops) {
      if (on.region != space::Region::kStream || !on.gemm.ok || !(on.a_hoisted || on.b_hoisted)) continue;
      const Op& op = chain_.ops[on.op];
      w_.Line(absl::StrCat("// ", chain_.tensors[op.output].name, ": packs hoisted out of the stream loop"));
      w_.Open("");
      x_.DefineFullRanges(w_, on);
      if (on.a_hoisted) Pack(op, on, true);
      if (on.b_hoisted) Pack(op, on, false);
      w_.Close();
    }
    x_.OpenTileLoop(w_, sd);
    EmitRegion(space::Region::kStream);
    w_.Close();
    for (const space::OpNest& on : nest_.ops) {
      if (on.accumulates) EmitFinalize(on);
    }
  }

  void EmitOp(int o) {
    const Op& op = chain_.ops[o];
    const space::OpNest& on = nest_.ops[o];
    w_.Line(absl::StrCat("// ", ir::OpToString(op, chain_)));
    w_.Open("");
    x_.DefineFullRanges(w_, on);
    if (op.kind == OpKind::kSum && on.gemm.ok) {
      EmitGemmSum(op, on);
    } else if (op.kind == OpKind::kSum) {
      EmitGenericSum(op, on);
    } else if (op.kind == OpKind::kMap) {
      int opened = OpenPointLoops(w_, op.index, n_);
      x_.Store(w_, on, ExprToC(op.body, [this](const Access& a) { return x_.Load(a); }));
      CloseScopes(w_, opened);
    } else if (on.online) {
      EmitOnlineSoftmax(op, on);
    } else {
      EmitSoftmax(op, on);
    }
    w_.Close();
  }

  struct GemmNames {
    std::string rows, cols, kc, nbatch, rows_pad, cols_pad, mr, nr;
  };

  GemmNames Gemm(const Op& op, const space::OpNest& on) const {
    const hw::MicroKernel& k = on.kernel;
    GemmNames g;
    g.mr = absl::StrCat(k.mr, "L");
    g.nr = absl::StrCat(k.nr, "L");
    g.rows = Count(on.gemm.rows, n_);
    g.cols = Count(on.gemm.cols, n_);
    g.kc = Count(on.gemm.kdims, n_);
    g.nbatch = Count(on.gemm.batch, n_);
    g.rows_pad = absl::StrCat("((", g.rows, " + ", k.mr - 1, "L) / ", g.mr, " * ", g.mr, ")");
    g.cols_pad = absl::StrCat("((", g.cols, " + ", k.nr - 1, "L) / ", g.nr, " * ", g.nr, ")");
    return g;
  }

  // Packs one side of a GEMM-shaped sum for the current tile:
  // [batch][panel][k][mr or nr], zero-padded to whole panels.
  void Pack(const Op& op, const space::OpNest& on, bool a_side) {
    const space::GemmForm& g = on.gemm;
    const GemmNames names = Gemm(op, on);
    const std::vector<int>& own = a_side ? g.rows : g.cols;
    const std::string& pad = a_side ? names.rows_pad : names.cols_pad;
    const std::string& width = a_side ? names.mr : names.nr;
    const std::string buf = (a_side ? "pa" : "pb") + Sfx(on.op);
    auto load = [this](const Access& a) { return x_.Load(a); };
    w_.Line(absl::StrCat("// pack ", a_side ? "A" : "B", " side"));
    w_.Open("");
    w_.Line(absl::StrCat("const long own = ", a_side ? names.rows : names.cols, ", own_pad = ", pad,
                         ", kc = ", names.kc, ";"));
    int opened = OpenPointLoops(w_, g.batch, n_);
    opened += OpenPointLoops(w_, g.kdims, n_);
    w_.Line(absl::StrCat("float* const dst = ", buf, " + ((", FlatIndex(g.batch, n_), ") * (own_pad / ", width,
                         ") * kc + (", FlatIndex(g.kdims, n_), ")) * ", width, ";"));
    int inner = OpenPointLoops(w_, own, n_);
    w_.Line(absl::StrCat("const long x = ", FlatIndex(own, n_), ";"));
    w_.Line(absl::StrCat("dst[(x / ", width, ") * kc * ", width, " + x % ", width, "] = ",
                         ProductToC(a_side ? g.a_side : g.b_side, a_side ? g.scale : 1, load), ";"));
    CloseScopes(w_, inner);
    w_.Line(absl::StrCat("for (long x = own; x < own_pad; ++x) dst[(x / ", width, ") * kc * ", width, " + x % ",
                         width, "] = 0.0f;"));
    CloseScopes(w_, opened);
    w_.Close();
  }

  void EmitGemmSum(const Op& op, const space::OpNest& on) {
    const space::GemmForm& g = on.gemm;
    const GemmNames names = Gemm(op, on);
    const std::string o = Sfx(on.op);
    const int num_loops = static_cast<int>(on.loops.size());
    for (int level = 0; level <= num_loops; ++level) {
      if (level == on.num_out_loops) {
        w_.Line(absl::StrCat("memset(acc", o, ", 0, sizeof(float) * ", names.nbatch, " * ", names.rows_pad, " * ",
                             names.cols_pad, ");"));
      }
      if (on.a_depth == level && !on.a_hoisted && !on.a_per_point) Pack(op, on, true);
      if (on.b_depth == level && !on.b_hoisted && !on.b_per_point) Pack(op, on, false);
      if (level < num_loops) x_.OpenTileLoop(w_, on.loops[level]);
    }
    // Innermost: the micro-kernel over the whole tile, once per point of
    // the reduced dims no intrinsic axis took (packing what depends on them).
    w_.Open("");
    const int outer = OpenPointLoops(w_, g.outer_reduce, n_);
    if (on.a_per_point) Pack(op, on, true);
    if (on.b_per_point) Pack(op, on, false);
    w_.Line(absl::StrCat("const long rows_pad = ", names.rows_pad, ", cols_pad = ", names.cols_pad, ", kc = ",
                         names.kc, ";"));
    w_.Open(absl::StrCat("for (long bi = 0; bi < ", names.nbatch, "; ++bi)"));
    w_.Open(absl::StrCat("for (long r = 0; r < rows_pad; r += ", names.mr, ")"));
    w_.Open(absl::StrCat("for (long c = 0; c < cols_pad; c += ", names.nr, ")"));
    w_.Line(absl::StrCat(kernel_fn_.at(on.kernel.name), "(kc, pa", o, " + (bi * (rows_pad / ", names.mr, ") + r / ",
                         names.mr, ") * kc * ",
                         names.mr, ", pb", o, " + (bi * (cols_pad / ", names.nr, ") + c / ", names.nr, ") * kc * ",
                         names.nr, ", acc", o, " + (bi * rows_pad + r) * cols_pad + c, cols_pad);"));
    w_.Close();
    w_.Close();
    w_.Close();
    CloseScopes(w_, outer);
    w_.Close();
    for (int level = num_loops; level > on.num_out_loops; --level) w_.Close();
    // Store the finished tile.
    w_.Open("");
    w_.Line(absl::StrCat("const long rows_pad = ", names.rows_pad, ", cols_pad = ", names.cols_pad, ";"));
    int opened = OpenPointLoops(w_, g.batch, n_);
    opened += OpenPointLoops(w_, g.rows, n_);
    opened += OpenPointLoops(w_, g.cols, n_);
    x_.Store(w_, on, absl::StrCat("acc", o, "[((", FlatIndex(g.batch, n_), ") * rows_pad + (", FlatIndex(g.rows, n_),
                           ")) * cols_pad + (", FlatIndex(g.cols, n_), ")]"));
    CloseScopes(w_, opened);
    w_.Close();
    for (int level = on.num_out_loops; level > 0; --level) w_.Close();
  }

  void EmitGenericSum(const Op& op, const space::OpNest& on) {
    auto load = [this](const Access& a) { return x_.Load(a); };
    const std::string acc = "acc" + Sfx(on.op);
    for (int i = 0; i < on.num_out_loops; ++i) x_.OpenTileLoop(w_, on.loops[i]);
    w_.Line(absl::StrCat("memset(", acc, ", 0, sizeof(float) * ", Count(op.index, n_), ");"));
    for (size_t i = on.num_out_loops; i < on.loops.size(); ++i) x_.OpenTileLoop(w_, on.loops[i]);
    int opened = OpenPointLoops(w_, op.index, n_);
    w_.Line("float s = 0.0f;");
    int inner = OpenPointLoops(w_, op.reduce, n_);
    w_.Line(absl::StrCat("s += ", ExprToC(op.body, load), ";"));
    CloseScopes(w_, inner);
    w_.Line(absl::StrCat(acc, "[", FlatIndex(op.index, n_), "] += s;"));
    CloseScopes(w_, opened);
    for (size_t i = on.num_out_loops; i < on.loops.size(); ++i) w_.Close();
    opened = OpenPointLoops(w_, op.index, n_);
    x_.Store(w_, on, absl::StrCat(acc, "[", FlatIndex(op.index, n_), "]"));
    CloseScopes(w_, opened);
    for (int i = 0; i < on.num_out_loops; ++i) w_.Close();
  }

  std::vector<int> SoftmaxRows(const Op& op) const {
    std::vector<int> rows;
    for (int d : op.index) {
      if (d != op.axis) rows.push_back(d);
    }
    return rows;
  }

  // The axis loop of a softmax over [o_axis, o_axis + n_axis).
  std::string AxisLoop(int ax) const {
    return absl::StrCat("for (long ", n_.I(ax), " = 0; ", n_.I(ax), " < ", n_.N(ax), "; ++", n_.I(ax), ")");
  }
  std::string AxisVar(int ax) const {
    return absl::StrCat("const long ", n_.V(ax), " = ", n_.O(ax), " + ", n_.I(ax), ";");
  }

  // The softmax's inputs along its axis (within the current range) into
  // `row`, and their maximum into `max_var`.
  void EmitRowAndMax(const Op& op, const std::string& row, const std::string& max_var) {
    auto load = [this](const Access& a) { return x_.Load(a); };
    const int ax = op.axis;
    w_.Line(absl::StrCat("float ", max_var, " = -INFINITY;"));
    w_.Open(AxisLoop(ax));
    w_.Line(AxisVar(ax));
    w_.Line(absl::StrCat("const float x = ", ExprToC(op.body, load), ";"));
    w_.Line(absl::StrCat(row, "[", n_.I(ax), "] = x;"));
    w_.Line(absl::StrCat(max_var, " = x > ", max_var, " ? x : ", max_var, ";"));
    w_.Close();
  }

  void EmitSoftmax(const Op& op, const space::OpNest& on) {
    const int ax = op.axis;
    const std::string row = "row" + Sfx(on.op);
    int opened = OpenPointLoops(w_, SoftmaxRows(op), n_);
    EmitRowAndMax(op, row, "mx");
    w_.Line("float total = 0.0f;");
    w_.Open(absl::StrCat("for (long j = 0; j < ", n_.N(ax), "; ++j)"));
    w_.Line(absl::StrCat("const float e = expf(", row, "[j] - mx);"));
    w_.Line(absl::StrCat(row, "[j] = e;"));
    w_.Line("total += e;");
    w_.Close();
    w_.Line("const float inv = 1.0f / total;");
    w_.Open(AxisLoop(ax));
    w_.Line(AxisVar(ax));
    x_.Store(w_, on, absl::StrCat(row, "[", n_.I(ax), "] * inv"));
    w_.Close();
    CloseScopes(w_, opened);
  }

  // One stream step of a softmax along the stream dim: the tile's
  // exponentials against the running max; the running sum, and the factor
  // by which the consumer rescales what it accumulated so far.
  void EmitOnlineSoftmax(const Op& op, const space::OpNest& on) {
    const int ax = op.axis;
    const std::string o = Sfx(on.op), row = "row" + o;
    int opened = OpenPointLoops(w_, SoftmaxRows(op), n_);
    w_.Line(absl::StrCat("const long sr = ", x_.StateOffset(op), ";"));
    EmitRowAndMax(op, row, "mt");
    w_.Line(absl::StrCat("const float m_old = smax", o, "[sr];"));
    w_.Line("const float m_new = m_old > mt ? m_old : mt;");
    w_.Line("const float rescale = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);");
    w_.Line("float total = 0.0f;");
    w_.Open(AxisLoop(ax));
    w_.Line(AxisVar(ax));
    w_.Line(absl::StrCat("const float e = m_new == -INFINITY ? 0.0f : expf(", row, "[", n_.I(ax), "] - m_new);"));
    w_.Line("total += e;");
    x_.Store(w_, on, "e");
    w_.Close();
    w_.Line(absl::StrCat("ssum", o, "[sr] = ssum", o, "[sr] * rescale + total;"));
    w_.Line(absl::StrCat("smax", o, "[sr] = m_new;"));
    w_.Line(absl::StrCat("sscale", o, "[sr] = rescale;"));
    CloseScopes(w_, opened);
  }

  // After the stream loop: an accumulated result is complete; divide by
  // the online softmax's sums and write it out.
  void EmitFinalize(const space::OpNest& on) {
    const Op& op = chain_.ops[on.op];
    const bool output = chain_.tensors[op.output].role == TensorRole::kOutput;
    if (on.online_softmax < 0 && !output) return;
    w_.Line(absl::StrCat("// ", chain_.tensors[op.output].name, " is complete"));
    w_.Open("");
    for (int d : op.index) {
      if (!x_.IsBlock(d)) w_.Line(absl::StrCat("const long ", n_.O(d), " = 0, ", n_.N(d), " = ", chain_.dims[d].extent, "L;"));
    }
    int opened = OpenPointLoops(w_, op.index, n_);
    Access self = emit::NestIndex::SelfAccess(op);
    const std::string at = absl::StrCat(n_.Local(op.output), "[", x_.LocalOffset(self), "]");
    if (on.online_softmax >= 0) {
      w_.Line(absl::StrCat(at, " /= ssum", Sfx(on.online_softmax), "[", x_.StateOffset(chain_.ops[on.online_softmax]),
                           "];"));
    }
    if (output) {
      w_.Line(absl::StrCat(n_.Global(op.output), "[", GlobalOffset(self, n_), "] = ", StoreConvert(chain_.dtype, at),
                           ";"));
    }
    CloseScopes(w_, opened);
    w_.Close();
  }

  const Chain& chain_;
  const space::LoopNest& nest_;
  const space::Schedule& s_;
  Names n_;
  emit::NestIndex x_;
  Writer w_;
  std::vector<int64_t> local_offset_;
  std::vector<int64_t> temp_offset_;
  int64_t scratch_floats_ = 0;
  std::map<std::string, std::string> kernel_fn_;  // intrinsic -> micro-kernel function
};

// ------------------------------------------------------------- baseline ---

class BaselineEmitter {
 public:
  explicit BaselineEmitter(const Chain& chain) : chain_(chain), n_{chain} {}

  std::string Emit() {
    std::string title = absl::StrCat("// fusor unfused baseline for chain '", chain_.name,
                                     "': each op over whole tensors, GEMMs through OpenBLAS\n");
    std::string out = Preamble(title) + "#include <cblas.h>\n\n";
    Writer& w = w_;
    w.Open("extern \"C\" int fusor_run(const void* const* fusor_inputs, void* const* fusor_outputs, "
           "int num_threads)");
    DeclareArguments(w, chain_, n_);
    w.Line("const int nt = num_threads > 0 ? num_threads : 1;");
    const bool f32 = chain_.dtype == ir::DType::kF32;
    // f32 views of every tensor: aliases where the dtype is already f32,
    // buffers allocated on the first call otherwise (as a framework's
    // caching allocator would).
    std::vector<int> owned;
    for (size_t t = 0; t < chain_.tensors.size(); ++t) {
      const ir::Tensor& tensor = chain_.tensors[t];
      bool alias = f32 && tensor.role != TensorRole::kIntermediate;
      if (alias) {
        w.Line(absl::StrCat("float* const ", n_.Full(t), " = (float*)", n_.Global(t), ";"));
      } else {
        w.Line(absl::StrCat("static float* ", n_.Full(t), " = 0;"));
        owned.push_back(static_cast<int>(t));
      }
    }
    for (int t : owned) {
      w.Open(absl::StrCat("if (!", n_.Full(t), ")"));
      w.Line(absl::StrCat(n_.Full(t), " = (float*)malloc(sizeof(float) * ", chain_.tensors[t].NumElements(), "L);"));
      w.Line(absl::StrCat("if (!", n_.Full(t), ") return 1;"));
      w.Close();
    }
    w.Line("openblas_set_num_threads(nt);");
    if (!f32) {
      for (int t : chain_.inputs) {
        w.Line("#pragma omp parallel for num_threads(nt)");
        w.Line(absl::StrCat("for (long i = 0; i < ", chain_.tensors[t].NumElements(), "L; ++i) ", n_.Full(t),
                            "[i] = ", LoadConvert(chain_.dtype, absl::StrCat(n_.Global(t), "[i]")), ";"));
      }
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
        int opened = OpenPointLoops(w, op.index, n_, "#pragma omp parallel for num_threads(nt)");
        w.Line(absl::StrCat(FullAt(op), " = ", ExprToC(op.body, Loader()), ";"));
        CloseScopes(w, opened);
      } else {
        EmitSoftmax(op);
      }
      w.Close();
    }
    if (!f32) {
      for (int t : chain_.outputs) {
        w.Line("#pragma omp parallel for num_threads(nt)");
        w.Line(absl::StrCat("for (long i = 0; i < ", chain_.tensors[t].NumElements(), "L; ++i) ", n_.Global(t),
                            "[i] = ", StoreConvert(chain_.dtype, absl::StrCat(n_.Full(t), "[i]")), ";"));
      }
    }
    w.Line("return 0;");
    w.Close();
    return out + w.Take();
  }

 private:
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
    Access self;
    self.tensor = op.output;
    for (int d : op.index) self.index.push_back(ir::AffineExpr::OfDim(d));
    return absl::StrCat(n_.Full(op.output), "[", GlobalOffset(self, n_), "]");
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
    Access self;
    self.tensor = op.output;
    for (int d : op.index) self.index.push_back(ir::AffineExpr::OfDim(d));
    auto sc = GlobalStrides(self, chain_, &const_c);
    // A is M x K: element (r, k) at r*sa[r] + k*sa[k].
    std::string trans_a, trans_b;
    int64_t lda, ldb;
    if (sa[k] == 1 && sa[r] >= k_ext) {
      trans_a = "CblasNoTrans", lda = sa[r];
    } else if (sa[r] == 1 && sa[k] >= m_ext) {
      trans_a = "CblasTrans", lda = sa[k];
    } else {
      return false;
    }
    if (sb[c] == 1 && sb[k] >= n_ext) {
      trans_b = "CblasNoTrans", ldb = sb[k];
    } else if (sb[k] == 1 && sb[c] >= k_ext) {
      trans_b = "CblasTrans", ldb = sb[c];
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
    int opened = OpenPointLoops(w_, g.batch, n_);
    w_.Line(absl::StrCat("cblas_sgemm(CblasRowMajor, ", trans_a, ", ", trans_b, ", ", m_ext, ", ", n_ext, ", ",
                         k_ext, ", ", FloatLit(g.scale), ", ", n_.Full(g.a_side[0].tensor), " + ", base(sa, const_a),
                         ", ", lda, ", ", n_.Full(g.b_side[0].tensor), " + ", base(sb, const_b), ", ", ldb,
                         ", 0.0f, ", n_.Full(op.output), " + ", base(sc, const_c), ", ", sc[r], ");"));
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
    w_.Line(absl::StrCat("cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ", m, ", ", n, ", ", k,
                         ", 1.0f, ta, ", k, ", tb, ", n, ", 0.0f, tc, ", n, ");"));
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

  void EmitSoftmax(const Op& op) {
    std::vector<int> others;
    for (int d : op.index) {
      if (d != op.axis) others.push_back(d);
    }
    const int ax = op.axis;
    const std::string loop = absl::StrCat("for (long ", n_.I(ax), " = 0; ", n_.I(ax), " < ",
                                          chain_.dims[ax].extent, "L; ++", n_.I(ax), ")");
    const std::string def = absl::StrCat("const long ", n_.V(ax), " = ", n_.I(ax), ";");
    int opened = OpenPointLoops(w_, others, n_, "#pragma omp parallel for num_threads(nt)");
    w_.Line("float mx = -INFINITY;");
    w_.Open(loop);
    w_.Line(def);
    w_.Line(absl::StrCat("const float x = ", ExprToC(op.body, Loader()), ";"));
    w_.Line(absl::StrCat(FullAt(op), " = x;"));
    w_.Line("mx = x > mx ? x : mx;");
    w_.Close();
    w_.Line("float total = 0.0f;");
    w_.Open(loop);
    w_.Line(def);
    w_.Line(absl::StrCat("const float e = expf(", FullAt(op), " - mx);"));
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

  const Chain& chain_;
  Names n_;
  Writer w_;
};

}  // namespace

absl::StatusOr<KernelSource> EmitCpuFusedKernel(const Chain& chain, const space::LoopNest& nest,
                                                const std::string& schedule_text,
                                                const std::string& mapping) {
  if (nest.ops.size() != chain.ops.size()) {
    return absl::InvalidArgumentError("loop nest does not belong to this chain");
  }
  KernelSource k;
  k.source = FusedEmitter(chain, nest).Emit(schedule_text, mapping);
  k.compile_flags = kCompileFlags;
  nlohmann::json meta = {
      {"entry_point", k.entry_point},
      {"signature", "int fusor_run(const void* const* inputs, void* const* outputs, int num_threads)"},
      {"language", "c++"},
      {"inputs", TensorsJson(chain, chain.inputs)},
      {"outputs", TensorsJson(chain, chain.outputs)},
      {"schedule", schedule_text},
      {"mapping", mapping},
      {"blocks", nest.num_blocks},
      {"scratch_bytes_per_thread", nest.scratch_bytes},
      {"compile_flags", kCompileFlags}};
  k.metadata_json = meta.dump(2);
  return k;
}

absl::StatusOr<KernelSource> EmitCpuUnfusedBaseline(const Chain& chain) {
  KernelSource k;
  k.source = BaselineEmitter(chain).Emit();
  k.compile_flags = kCompileFlags;
  k.link_libs = {"openblas"};
  nlohmann::json meta = {{"entry_point", k.entry_point},
                         {"language", "c++"},
                         {"inputs", TensorsJson(chain, chain.inputs)},
                         {"outputs", TensorsJson(chain, chain.outputs)},
                         {"baseline", "unfused, cblas_sgemm"}};
  k.metadata_json = meta.dump(2);
  return k;
}

}  // namespace fusor::codegen
