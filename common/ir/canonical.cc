#include "common/ir/canonical.h"

#include <algorithm>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/sha256.h"

namespace fusor::ir {
namespace {

std::string ShortHash(absl::string_view s) { return Sha256Hex(s).substr(0, 16); }

bool IsCommutative(Expr::Kind k) { return k == Expr::Kind::kAdd || k == Expr::Kind::kMul; }

// The operands of a maximal run of one commutative operator.
void Flatten(const Expr& e, Expr::Kind kind, std::vector<const Expr*>& out) {
  if (e.kind == kind) {
    for (const Expr& arg : e.args) Flatten(arg, kind, out);
  } else {
    out.push_back(&e);
  }
}

class Canonicalizer {
 public:
  explicit Canonicalizer(const Chain& chain) : in_(chain) {}

  CanonicalForm Run() {
    sig_.assign(in_.tensors.size(), "");
    for (int t : in_.inputs) {
      std::vector<std::string> shape;
      const Tensor& input = in_.tensors[t];
      for (size_t a = 0; a < input.shape.size(); ++a) {
        // A ranged axis is its dim's range (its dim is read there by name).
        const int d = input.axis_dims[a];
        shape.push_back(d >= 0 && in_.dims[d].Ranged() ? ExtentText(in_.dims[d]) : absl::StrCat(input.shape[a]));
      }
      sig_[t] = ShortHash(absl::StrCat(in_.tensors[t].constant ? "const" : "in", "[", absl::StrJoin(shape, ","), "]"));
    }
    bodies_.resize(in_.ops.size());
    for (size_t i = 0; i < in_.ops.size(); ++i) SignOp(static_cast<int>(i));

    // Outputs in order of their structure, then tensors in post-order.
    std::vector<int> outs = in_.outputs;
    std::stable_sort(outs.begin(), outs.end(), [&](int a, int b) { return sig_[a] < sig_[b]; });
    form_.tensor_map.assign(in_.tensors.size(), -1);
    form_.dim_map.assign(in_.dims.size(), -1);
    for (int t : outs) Visit(t);

    Chain& c = form_.chain;
    c.name = "c";
    c.dtype = in_.dtype;
    for (int t : order_) {
      const Tensor& src = in_.tensors[t];
      Tensor dst;
      dst.name = absl::StrCat("t", form_.tensor_map[t]);
      dst.shape = src.shape;
      dst.role = src.role;
      dst.constant = src.constant;
      if (src.role == TensorRole::kInput) {
        dst.axis_dims.assign(src.shape.size(), -1);
        for (size_t a = 0; a < src.shape.size(); ++a) {
          const int d = src.axis_dims[a];
          if (d >= 0 && in_.dims[d].Ranged()) dst.axis_dims[a] = form_.dim_map[d];
        }
        c.inputs.push_back(static_cast<int>(c.tensors.size()));
      } else {
        const Op& op = in_.ops[src.producer];
        Op cop;
        cop.kind = op.kind;
        cop.output = static_cast<int>(c.tensors.size());
        for (int d : op.index) cop.index.push_back(MapDim(d));
        for (int d : op.reduce) cop.reduce.push_back(MapDim(d));
        std::sort(cop.reduce.begin(), cop.reduce.end());
        if (op.axis >= 0) cop.axis = MapDim(op.axis);
        if (op.Causal()) cop.causal_row = MapDim(op.causal_row);
        cop.causal_offset = op.causal_offset;
        cop.body = Rewrite(bodies_[src.producer]);
        dst.axis_dims = cop.index;
        dst.producer = static_cast<int>(c.ops.size());
        c.ops.push_back(std::move(cop));
      }
      c.tensors.push_back(std::move(dst));
    }
    for (int t : outs) c.outputs.push_back(form_.tensor_map[t]);
    c.dims.resize(dim_order_.size());
    for (size_t i = 0; i < dim_order_.size(); ++i) {
      c.dims[i] = Dim{absl::StrCat("d", i), in_.dims[dim_order_[i]].extent, in_.dims[dim_order_[i]].min};
    }
    form_.text = ChainToText(c);
    form_.key = Sha256Hex(form_.text).substr(0, 32);
    return std::move(form_);
  }

 private:
  // Signature of an expression with dims named by `dim_name`, operands of
  // + and * sorted; also reorders those operands in `sorted` when given.
  std::string ExprSig(const Expr& e, const std::function<std::string(int)>& dim_name) {
    switch (e.kind) {
      case Expr::Kind::kConst: {
        char buf[64];
        snprintf(buf, sizeof(buf), "%a", e.value);
        return buf;
      }
      case Expr::Kind::kAccess: {
        std::vector<std::string> idx;
        for (const AffineExpr& a : e.access.index) {
          std::vector<std::string> terms;
          for (const auto& [d, c] : a.terms) terms.push_back(absl::StrCat(c, "*", dim_name(d)));
          std::sort(terms.begin(), terms.end());
          idx.push_back(absl::StrCat(absl::StrJoin(terms, "+"), "+", a.constant));
        }
        return absl::StrCat("T", sig_[e.access.tensor], "[", absl::StrJoin(idx, ","), "]");
      }
      case Expr::Kind::kCall:
        return absl::StrCat(FuncName(e.func), "(", ExprSig(e.args[0], dim_name), ")");
      case Expr::Kind::kNeg: return absl::StrCat("neg(", ExprSig(e.args[0], dim_name), ")");
      default: break;
    }
    if (IsCommutative(e.kind)) {
      std::vector<const Expr*> parts;
      Flatten(e, e.kind, parts);
      std::vector<std::string> sigs;
      for (const Expr* p : parts) sigs.push_back(ExprSig(*p, dim_name));
      std::sort(sigs.begin(), sigs.end());
      return absl::StrCat(e.kind == Expr::Kind::kAdd ? "add(" : "mul(", absl::StrJoin(sigs, ","), ")");
    }
    return absl::StrCat(e.kind == Expr::Kind::kSub ? "sub(" : "div(", ExprSig(e.args[0], dim_name),
                        ",", ExprSig(e.args[1], dim_name), ")");
  }

  // `e` with the operands of + and * runs sorted by signature.
  Expr Sorted(const Expr& e, const std::function<std::string(int)>& dim_name) {
    if (IsCommutative(e.kind)) {
      std::vector<const Expr*> parts;
      Flatten(e, e.kind, parts);
      std::vector<std::pair<std::string, Expr>> keyed;
      for (const Expr* p : parts) keyed.push_back({ExprSig(*p, dim_name), Sorted(*p, dim_name)});
      std::stable_sort(keyed.begin(), keyed.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      Expr out = std::move(keyed[0].second);
      for (size_t i = 1; i < keyed.size(); ++i) {
        out = Expr::Binary(e.kind, std::move(out), std::move(keyed[i].second));
      }
      return out;
    }
    Expr out = e;
    for (Expr& arg : out.args) arg = Sorted(arg, dim_name);
    return out;
  }

  void SignOp(int op_id) {
    const Op& op = in_.ops[op_id];
    auto position = [&](int d) -> int {
      auto it = std::find(op.index.begin(), op.index.end(), d);
      return it == op.index.end() ? -1 : static_cast<int>(it - op.index.begin());
    };
    // Provisional names: output dims by position, reduced dims by extent.
    auto provisional = [&](int d) {
      int p = position(d);
      return p >= 0 ? absl::StrCat("o", p) : absl::StrCat("r", ExtentText(in_.dims[d]));
    };
    bodies_[op_id] = Sorted(op.body, provisional);
    // Final names: reduced dims numbered by first use in the sorted body.
    std::map<int, int> reduce_no;
    ForEachAccess(bodies_[op_id], [&](const Access& a) {
      for (const AffineExpr& idx : a.index) {
        std::vector<std::pair<int64_t, int>> fresh;
        for (const auto& [d, c] : idx.terms) {
          if (position(d) < 0 && !reduce_no.count(d)) fresh.push_back({c, d});
        }
        std::sort(fresh.begin(), fresh.end());
        for (const auto& [c, d] : fresh) reduce_no.emplace(d, static_cast<int>(reduce_no.size()));
      }
    });
    auto final_name = [&](int d) {
      int p = position(d);
      if (p >= 0) return absl::StrCat("o", p);
      return absl::StrCat("r", reduce_no.at(d), ":", ExtentText(in_.dims[d]));
    };
    std::vector<std::string> extents;
    for (int d : op.index) extents.push_back(ExtentText(in_.dims[d]));
    std::string axis = op.axis >= 0 ? absl::StrCat(position(op.axis)) : "-";
    if (op.Causal()) absl::StrAppend(&axis, "<=", position(op.causal_row), "+", op.causal_offset);
    sig_[op.output] = ShortHash(absl::StrCat(OpKindName(op.kind), "[", absl::StrJoin(extents, ","),
                                             "] axis=", axis, " reduce=", reduce_no.size(), " ",
                                             ExprSig(bodies_[op_id], final_name)));
  }

  void Visit(int t) {
    if (form_.tensor_map[t] >= 0) return;
    const Tensor& tensor = in_.tensors[t];
    if (tensor.role != TensorRole::kInput) {
      const Op& op = in_.ops[tensor.producer];
      ForEachAccess(bodies_[tensor.producer], [&](const Access& a) { Visit(a.tensor); });
      // Dims are numbered by first use: output index, then the body.
      for (int d : op.index) NumberDim(d);
      ForEachAccess(bodies_[tensor.producer], [&](const Access& a) {
        for (const AffineExpr& idx : a.index) {
          std::vector<std::pair<int64_t, int>> fresh;
          for (const auto& [d, c] : idx.terms) {
            if (form_.dim_map[d] < 0) fresh.push_back({c, d});
          }
          std::sort(fresh.begin(), fresh.end());
          for (const auto& [c, d] : fresh) NumberDim(d);
        }
      });
    }
    form_.tensor_map[t] = static_cast<int>(order_.size());
    order_.push_back(t);
  }

  void NumberDim(int d) {
    if (form_.dim_map[d] >= 0) return;
    form_.dim_map[d] = static_cast<int>(dim_order_.size());
    dim_order_.push_back(d);
  }

  int MapDim(int d) const { return form_.dim_map[d]; }

  Expr Rewrite(const Expr& e) const {
    Expr out = e;
    if (out.kind == Expr::Kind::kAccess) {
      out.access.tensor = form_.tensor_map[e.access.tensor];
      for (AffineExpr& idx : out.access.index) {
        for (auto& term : idx.terms) term.first = MapDim(term.first);
        std::sort(idx.terms.begin(), idx.terms.end());
      }
    }
    for (Expr& arg : out.args) arg = Rewrite(arg);
    return out;
  }

  const Chain& in_;
  std::vector<std::string> sig_;
  std::vector<Expr> bodies_;
  std::vector<int> order_;
  std::vector<int> dim_order_;
  CanonicalForm form_;
};

}  // namespace

CanonicalForm Canonicalize(const Chain& chain) { return Canonicalizer(chain).Run(); }

}  // namespace fusor::ir
