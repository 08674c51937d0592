// Map ops, epilogues applied to finished tiles, softmax rows and results
// completed after the stream loop (cpu_emitter.h).
#include "common/codegen/cpu/cpu_emitter.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fusor::codegen::cpu {

void FusedEmitter::EmitSoftmax(const Op& op, const space::OpNest& on) {
  if (prep_mode_) return;  // the prepare walk: loops and constant packs only
  if (on.online) {
    EmitOnlineSoftmax(op, on);
  } else {
    EmitPlainSoftmax(op, on);
  }
}

int FusedEmitter::InnerDim(const std::vector<int>& dims, const std::function<int64_t(int)>& dest_stride) const {
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    if (dest_stride(*it) == 1) return *it;
  }
  return dims.back();
}

void FusedEmitter::PointwiseLoops(const std::vector<int>& dims, int inner, const std::function<void(bool)>& body) {
  std::vector<int> outer;
  for (int d : dims) {
    if (d != inner) outer.push_back(d);
  }
  const int opened = OpenPointLoops(w_, outer, n_);
  VectorLoop(w_, n_.I(inner), n_.N(inner), absl::StrCat("const long ", n_.V(inner), " = ", n_.O(inner), " + ",
                                                        n_.I(inner), ";"),
             body, /*masked_tail=*/true);
  CloseScopes(w_, opened);
}

void FusedEmitter::StoreVector(const space::OpNest& on, int d, const std::string& value) {
  const Op& op = chain_.ops[on.op];
  const Access self = ir::ResultAccess(op);
  if (HasLocal(op.output)) {
    const Lanes at = AccessLanes(self, d);
    if (on.online_softmax >= 0) {
      const Op& sm = chain_.ops[on.online_softmax];
      Lanes scale;
      scale.ptr = absl::StrCat("&sscale", on.online_softmax, "[", x_.StateOffset(sm), "]");
      scale.stride = x_.StateStride(sm, d);
      w_.Line(VectorStore(at, absl::StrCat(VectorLoad(at), " * ", VectorLoad(scale), " + ", value)));
    } else if (on.accumulates) {
      w_.Line(VectorStore(at, absl::StrCat(VectorLoad(at), " + ", value)));
    } else {
      w_.Line(VectorStore(at, value));
    }
  }
  if (chain_.tensors[op.output].role == TensorRole::kOutput && !on.accumulates) {
    w_.Line(VectorStore(OutputLanes(self, d, n_.Global(op.output), chain_.dtype), value));
  }
}

void FusedEmitter::EmitMap(const Op& op, const space::OpNest& on) {
  if (prep_mode_) return;  // the prepare walk: loops and constant packs only
  if (Folded(on)) {
    w_.Line("// applied by the micro-kernels above, to each register tile as its sum completes");
    return;
  }
  auto load = [this](const Access& a) { return x_.Load(a); };
  const int inner = InnerDim(op.index, [&](int d) { return ResultStride(on, d); });
  PointwiseLoops(op.index, inner, [&](bool vector) {
    if (vector) {
      w_.Line(absl::StrCat("const fusor_vf value = ", VectorExpr(op.body, LanesAlong(inner)), ";"));
      StoreVector(on, inner, "value");
    } else {
      x_.Store(w_, on, ExprToC(op.body, load));
    }
  });
}

void FusedEmitter::EmitEpilogue(const space::OpNest& on) {
  const Op& sum = chain_.ops[on.op];
  const space::OpNest& map_nest = *epilogue_[on.op];
  const Op& map = chain_.ops[map_nest.op];
  const std::vector<int>& cols = on.gemm.cols;
  const int row = RowDim(on), col = cols.back(), lanes = on.kernel.lanes;
  const bool tail = c_tail_[on.op];
  auto define = [&](int d, const std::string& at) {
    w_.Line(absl::StrCat("const long ", n_.I(d), " = ", at, ", ", n_.V(d), " = ", n_.O(d), " + ", n_.I(d), ";"));
  };
  // The column dims at flattened column `at`.
  auto define_cols = [&](const std::string& at) {
    if (cols.size() == 1) return define(col, at);
    w_.Line(absl::StrCat("long flat = ", at, ";"));
    for (size_t j = cols.size(); j-- > 1;) {
      define(cols[j], absl::StrCat("flat % ", n_.N(cols[j])));
      w_.Line(absl::StrCat("flat /= ", n_.N(cols[j]), ";"));
    }
    define(cols[0], "flat");
  };
  w_.Open(absl::StrCat("auto epi = [&](long rr, long cc, fusor_v", lanes, " h", tail ? ", long nl)" : ")"));
  for (int d : on.gemm.rows) define(d, d == row ? "r + rr" : "0");
  w_.Line(absl::StrCat("#if FUSOR_VL == ", lanes));
  if (tail) w_.Open(absl::StrCat("if (nl == ", lanes, ")"));
  define_cols("c + cc");
  w_.Line(absl::StrCat("const fusor_vf value = ", VectorExpr(map.body, [&](const Access& x) {
                         Lanes l = AccessLanes(x, col);
                         if (x.tensor == sum.output) l.value = "h";
                         return l;
                       }), ";"));
  StoreVector(map_nest, col, "value");
  if (tail) {
    w_.Line("return;");
    w_.Close();
  }
  w_.Line(tail ? "#endif" : "#else");
  w_.Open(absl::StrCat("for (int l = 0; l < ", tail ? "nl" : absl::StrCat(lanes), "; ++l)"));
  define_cols("c + cc + l");
  x_.Store(w_, map_nest, ExprToC(map.body, [&](const Access& x) {
             return x.tensor == sum.output ? std::string("h[l]") : x_.Load(x);
           }));
  w_.Close();
  if (!tail) w_.Line("#endif");
  w_.Close(";");
}

std::vector<int> FusedEmitter::SoftmaxRows(const Op& op) const {
  std::vector<int> rows;
  for (int d : op.index) {
    if (d != op.axis) rows.push_back(d);
  }
  return rows;
}

void FusedEmitter::EmitRowValues(const Op& op, const std::string& row, const std::string& max) {
  auto load = [this](const Access& a) { return x_.Load(a); };
  const int ax = op.axis;
  w_.Line("fusor_vf row_vmax = fusor_vsplat(-INFINITY);");
  w_.Line("float row_smax = -INFINITY;");
  // A causal softmax computes the entries it keeps; the rest are -inf.
  if (op.Causal()) w_.Line(absl::StrCat("const long kept = ", emit::CausalKept(op, n_), ";"));
  VectorLoop(w_, n_.I(ax), op.Causal() ? "kept" : n_.N(ax), AxisVar(ax), [&](bool vector) {
    if (vector) {
      w_.Line(absl::StrCat("const fusor_vf x = ", VectorExpr(op.body, LanesAlong(ax)), ";"));
      w_.Line(absl::StrCat("fusor_vstore(", row, " + ", n_.I(ax), ", x);"));
      w_.Line("row_vmax = fusor_vmax(row_vmax, x);");
    } else {
      w_.Line(absl::StrCat("const float x = ", ExprToC(op.body, load), ";"));
      w_.Line(absl::StrCat(row, "[", n_.I(ax), "] = x;"));
      w_.Line("row_smax = x > row_smax ? x : row_smax;");
    }
  });
  if (op.Causal()) w_.Line(absl::StrCat("for (long j = kept; j < ", n_.N(ax), "; ++j) ", row, "[j] = -INFINITY;"));
  w_.Line("const float row_hmax = fusor_vhmax(row_vmax);");
  w_.Line(absl::StrCat("const float ", max, " = row_hmax > row_smax ? row_hmax : row_smax;"));
}

void FusedEmitter::EmitRowStore(const space::OpNest& on, const std::string& row, const std::string& factor) {
  const int ax = chain_.ops[on.op].axis;
  const std::string f = factor.empty() ? "" : absl::StrCat(" * ", factor);
  VectorLoop(w_, n_.I(ax), n_.N(ax), AxisVar(ax), [&](bool vector) {
    if (vector) {
      StoreVector(on, ax, absl::StrCat("fusor_vload(", row, " + ", n_.I(ax), ")", f));
    } else {
      x_.Store(w_, on, absl::StrCat(row, "[", n_.I(ax), "]", f));
    }
  });
}

std::string FusedEmitter::SoftmaxRow(const Op& op, const space::OpNest& on) {
  if (!RowInPlace(op)) return "row" + Sfx(on.op);
  w_.Line("float* row;");
  w_.Open("");
  w_.Line(absl::StrCat("const long ", n_.V(op.axis), " = ", n_.O(op.axis), ";"));
  w_.Line(absl::StrCat("row = ", AccessLanes(ir::ResultAccess(op), op.axis).ptr, ";"));
  w_.Close();
  return "row";
}

void FusedEmitter::EmitPlainSoftmax(const Op& op, const space::OpNest& on) {
  int opened = OpenPointLoops(w_, SoftmaxRows(op), n_);
  const std::string row = SoftmaxRow(op, on);
  EmitRowValues(op, row, "mx");
  w_.Line(absl::StrCat("const float inv = 1.0f / fusor_row_exp_sum(", row, ", ", n_.N(op.axis), ", mx);"));
  if (normalizer_[on.op] >= 0) {
    w_.Line(absl::StrCat("sinv", Sfx(on.op), "[", x_.StateOffset(op), "] = inv;  // the consumer divides"));
    if (!RowInPlace(op)) EmitRowStore(on, row, "");
  } else if (RowInPlace(op)) {
    w_.Line(absl::StrCat("for (long j = 0; j < ", n_.N(op.axis), "; ++j) ", row, "[j] *= inv;"));
  } else {
    EmitRowStore(on, row, "inv");
  }
  CloseScopes(w_, opened);
}

void FusedEmitter::EmitOnlineSoftmax(const Op& op, const space::OpNest& on) {
  const std::string o = Sfx(on.op);
  int opened = OpenPointLoops(w_, SoftmaxRows(op), n_);
  const std::string row = SoftmaxRow(op, on);
  w_.Line(absl::StrCat("const long sr = ", x_.StateOffset(op), ";"));
  EmitRowValues(op, row, "mt");
  w_.Line(absl::StrCat("const float m_old = smax", o, "[sr];"));
  w_.Line("const float m_new = m_old > mt ? m_old : mt;");
  w_.Line("const float rescale = m_new == -INFINITY ? 1.0f : fusor_exp(m_old - m_new);");
  w_.Line(absl::StrCat("const float total = fusor_row_exp_sum(", row, ", ", n_.N(op.axis), ", m_new);"));
  if (!RowInPlace(op)) EmitRowStore(on, row, "");
  w_.Line(absl::StrCat("ssum", o, "[sr] = ssum", o, "[sr] * rescale + total;"));
  w_.Line(absl::StrCat("smax", o, "[sr] = m_new;"));
  w_.Line(absl::StrCat("sscale", o, "[sr] = rescale;"));
  CloseScopes(w_, opened);
}

Lanes FusedEmitter::OutputLanes(const Access& self, int d, const std::string& base, ir::DType dtype) const {
  Lanes out;
  out.ptr = absl::StrCat("&", base, "[", GlobalOffset(self, n_), "]");
  out.dtype = dtype;
  int64_t constant = 0;
  const std::map<int, int64_t> strides = GlobalStrides(self, chain_, &constant);
  out.stride = strides.count(d) ? strides.at(d) : 0;
  if (emit::RuntimeGlobalStride(self, d, chain_)) out.stride_expr = emit::GlobalStrideC(self, d, n_);
  return out;
}

std::string FusedEmitter::OutputAt(const Op& op) const {
  if (nest_.split == 1) return n_.Global(op.output);
  const int o = chain_.tensors[op.output].producer;
  return absl::StrCat("(partials + ", partial_slot_.at(o), "L + part * ",
                      chain_.tensors[op.output].NumElements(), "L)");
}

void FusedEmitter::WriteComplete(const space::OpNest& on, bool output) {
  if (prep_mode_) return;  // the prepare walk: loops and constant packs only
  const Op& op = chain_.ops[on.op];
  const Access self = ir::ResultAccess(op);
  const std::string at = absl::StrCat(n_.Local(op.output), "[", x_.LocalOffset(self), "]");
  const int inner = InnerDim(op.index, [&](int d) { return x_.LocalStride(self, d); });
  const Op* sm = on.online_softmax >= 0 ? &chain_.ops[on.online_softmax] : nullptr;
  PointwiseLoops(op.index, inner, [&](bool vector) {
    if (vector) {
      const Lanes local = AccessLanes(self, inner);
      std::string value = VectorLoad(local);
      if (sm != nullptr) {
        Lanes sum;
        sum.ptr = absl::StrCat("&ssum", on.online_softmax, "[", x_.StateOffset(*sm), "]");
        sum.stride = x_.StateStride(*sm, inner);
        value = absl::StrCat(value, " / ", VectorLoad(sum));
      }
      w_.Line(absl::StrCat("const fusor_vf value = ", value, ";"));
      if (sm != nullptr) w_.Line(VectorStore(local, "value"));
      if (output) {
        w_.Line(VectorStore(OutputLanes(self, inner, OutputAt(op), nest_.split > 1 ? ir::DType::kF32 : chain_.dtype),
                            "value"));
      }
    } else {
      if (sm != nullptr) w_.Line(absl::StrCat(at, " /= ssum", on.online_softmax, "[", x_.StateOffset(*sm), "];"));
      if (output) {
        w_.Line(absl::StrCat(OutputAt(op), "[", GlobalOffset(self, n_), "] = ",
                             nest_.split > 1 ? at : StoreConvert(chain_.dtype, at), ";"));
      }
    }
  });
}
}  // namespace fusor::codegen::cpu
