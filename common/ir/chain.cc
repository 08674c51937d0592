#include "common/ir/chain.h"

#include <algorithm>
#include <charconv>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusor::ir {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "f32" || name == "DTYPE_F32") return DType::kF32;
  if (name == "f16" || name == "DTYPE_F16") return DType::kF16;
  if (name == "bf16" || name == "DTYPE_BF16") return DType::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "' (expected f32, f16 or bf16)"));
}

int DTypeBytes(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

AffineExpr AffineExpr::OfDim(int dim) {
  AffineExpr e;
  e.terms.push_back({dim, 1});
  return e;
}

bool AffineExpr::DependsOn(int dim) const { return Coefficient(dim) != 0; }

int64_t AffineExpr::Coefficient(int dim) const {
  for (const auto& [d, c] : terms) {
    if (d == dim) return c;
  }
  return 0;
}

Expr Expr::Const(double v) {
  Expr e;
  e.kind = Kind::kConst;
  e.value = v;
  return e;
}

Expr Expr::Of(Access a) {
  Expr e;
  e.kind = Kind::kAccess;
  e.access = std::move(a);
  return e;
}

Expr Expr::Binary(Kind kind, Expr lhs, Expr rhs) {
  Expr e;
  e.kind = kind;
  e.args.push_back(std::move(lhs));
  e.args.push_back(std::move(rhs));
  return e;
}

Expr Expr::Unary(Kind kind, Expr arg) {
  Expr e;
  e.kind = kind;
  e.args.push_back(std::move(arg));
  return e;
}

Expr Expr::Call(Func f, Expr arg) {
  Expr e = Unary(Kind::kCall, std::move(arg));
  e.func = f;
  return e;
}

absl::string_view FuncName(Func func) {
  switch (func) {
    case Func::kRelu: return "relu";
    case Func::kGelu: return "gelu";
    case Func::kGeluTanh: return "gelu_tanh";
    case Func::kExp: return "exp";
    case Func::kTanh: return "tanh";
    case Func::kSigmoid: return "sigmoid";
  }
  return "?";
}

absl::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kSum: return "sum";
    case OpKind::kSoftmax: return "softmax";
    case OpKind::kMap: return "map";
  }
  return "?";
}

int64_t Tensor::NumElements() const {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

std::string ExtentText(const Dim& dim) {
  return dim.Ranged() ? absl::StrCat(dim.min, "..", dim.extent) : absl::StrCat(dim.extent);
}

std::vector<int> Chain::RangedDims() const {
  std::vector<int> ranged;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d].Ranged()) ranged.push_back(static_cast<int>(d));
  }
  return ranged;
}

absl::StatusOr<Chain> AtSizes(const Chain& chain, const std::vector<int64_t>& sizes) {
  const std::vector<int> ranged = chain.RangedDims();
  if (sizes.size() != ranged.size()) {
    return absl::InvalidArgumentError(absl::StrCat("chain '", chain.name, "' has ", ranged.size(),
                                                   " ranged dims; ", sizes.size(), " sizes were given"));
  }
  Chain at = chain;
  for (size_t i = 0; i < ranged.size(); ++i) {
    Dim& dim = at.dims[ranged[i]];
    if (sizes[i] < dim.min || sizes[i] > dim.extent) {
      return absl::InvalidArgumentError(absl::StrCat("size ", sizes[i], " of dim '", dim.name, "' is outside its range ",
                                                     ExtentText(dim)));
    }
    dim.extent = sizes[i];
    dim.min = 0;
  }
  for (Tensor& t : at.tensors) {
    for (size_t a = 0; a < t.shape.size(); ++a) {
      if (t.axis_dims[a] >= 0) t.shape[a] = at.dims[t.axis_dims[a]].extent;
    }
  }
  return at;
}

int Chain::FindDim(absl::string_view name) const {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

int Chain::FindTensor(absl::string_view name) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::string AffineToString(const AffineExpr& e, const Chain& chain) {
  std::string out;
  for (const auto& [d, c] : e.terms) {
    const std::string& name = chain.dims[d].name;
    if (out.empty()) {
      if (c == -1) out += "-";
    } else {
      out += c < 0 ? "-" : "+";
    }
    out += name;
    int64_t mag = c < 0 ? -c : c;
    if (mag != 1) absl::StrAppend(&out, "*", mag);
  }
  if (e.constant != 0 || out.empty()) {
    if (!out.empty()) out += e.constant < 0 ? "-" : "+";
    else if (e.constant < 0) out += "-";
    absl::StrAppend(&out, e.constant < 0 ? -e.constant : e.constant);
  }
  return out;
}

std::string AccessToString(const Access& a, const Chain& chain) {
  std::vector<std::string> parts;
  for (const AffineExpr& e : a.index) parts.push_back(AffineToString(e, chain));
  return absl::StrCat(chain.tensors[a.tensor].name, "[", absl::StrJoin(parts, ","), "]");
}

namespace {

std::string FormatNumber(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

int Precedence(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kAdd:
    case Expr::Kind::kSub: return 1;
    case Expr::Kind::kMul:
    case Expr::Kind::kDiv: return 2;
    case Expr::Kind::kNeg: return 3;
    default: return 4;
  }
}

std::string ExprToStringPrec(const Expr& e, const Chain& chain, int min_prec) {
  std::string s;
  int prec = Precedence(e);
  switch (e.kind) {
    case Expr::Kind::kConst:
      s = FormatNumber(e.value);
      if (e.value < 0) prec = 3;
      break;
    case Expr::Kind::kAccess: s = AccessToString(e.access, chain); break;
    case Expr::Kind::kAdd:
    case Expr::Kind::kSub:
    case Expr::Kind::kMul:
    case Expr::Kind::kDiv: {
      const char* op = e.kind == Expr::Kind::kAdd   ? " + "
                       : e.kind == Expr::Kind::kSub ? " - "
                       : e.kind == Expr::Kind::kMul ? " * "
                                                    : " / ";
      // Left-associative: the right operand needs strictly higher precedence.
      s = ExprToStringPrec(e.args[0], chain, prec) + op +
          ExprToStringPrec(e.args[1], chain, prec + 1);
      break;
    }
    case Expr::Kind::kNeg: s = "-" + ExprToStringPrec(e.args[0], chain, 3); break;
    case Expr::Kind::kCall:
      s = absl::StrCat(FuncName(e.func), "(", ExprToStringPrec(e.args[0], chain, 0), ")");
      break;
  }
  if (prec < min_prec) return "(" + s + ")";
  return s;
}

std::string DimList(const std::vector<int>& dims, const Chain& chain) {
  std::vector<std::string> names;
  for (int d : dims) names.push_back(chain.dims[d].name);
  return absl::StrJoin(names, ",");
}

}  // namespace

std::string ExprToString(const Expr& e, const Chain& chain) {
  return ExprToStringPrec(e, chain, 0);
}

std::string OpToString(const Op& op, const Chain& chain) {
  std::string lhs =
      absl::StrCat(chain.tensors[op.output].name, "[", DimList(op.index, chain), "] = ");
  switch (op.kind) {
    case OpKind::kSum:
      return absl::StrCat(lhs, "sum(", DimList(op.reduce, chain), ") ", ExprToString(op.body, chain));
    case OpKind::kSoftmax:
      return absl::StrCat(lhs, "softmax(", SoftmaxAxisText(op, chain), ") ", ExprToString(op.body, chain));
    case OpKind::kMap: return lhs + ExprToString(op.body, chain);
  }
  return lhs;
}

std::string SoftmaxAxisText(const Op& op, const Chain& chain) {
  std::string text = chain.dims[op.axis].name;
  if (!op.Causal()) return text;
  absl::StrAppend(&text, " <= ", chain.dims[op.causal_row].name);
  if (op.causal_offset != 0) absl::StrAppend(&text, " + ", op.causal_offset);
  return text;
}

double CausalShare(const Op& op, const Chain& chain) {
  if (!op.Causal()) return 1;
  const int64_t n = chain.dims[op.axis].extent, m = chain.dims[op.causal_row].extent;
  double kept = 0;
  for (int64_t r = 0; r < m; ++r) kept += static_cast<double>(std::min(n, r + op.causal_offset + 1));
  return kept / (static_cast<double>(n) * static_cast<double>(m));
}

std::string ChainToText(const Chain& chain) {
  std::vector<int> dims(chain.dims.size()), ops(chain.ops.size());
  for (size_t d = 0; d < dims.size(); ++d) dims[d] = static_cast<int>(d);
  for (size_t o = 0; o < ops.size(); ++o) ops[o] = static_cast<int>(o);
  return ChainToText(chain, chain.name, dims, ops, chain.inputs, chain.outputs);
}

std::string ChainToText(const Chain& chain, const std::string& name, const std::vector<int>& dims,
                        const std::vector<int>& ops, const std::vector<int>& inputs, const std::vector<int>& outputs) {
  std::string out = absl::StrCat("chain ", name, "\ndtype ", DTypeName(chain.dtype), "\ndim");
  for (int d : dims) absl::StrAppend(&out, " ", chain.dims[d].name, "=", ExtentText(chain.dims[d]));
  out += "\nin ";
  std::vector<std::string> decls;
  for (int t : inputs) {
    const Tensor& tensor = chain.tensors[t];
    std::vector<std::string> axes;
    for (size_t a = 0; a < tensor.shape.size(); ++a) {
      int d = tensor.axis_dims[a];
      axes.push_back(d >= 0 ? chain.dims[d].name : absl::StrCat(tensor.shape[a]));
    }
    decls.push_back(absl::StrCat(tensor.name, "[", absl::StrJoin(axes, ","), "]"));
  }
  out += absl::StrJoin(decls, " ") + "\n";
  std::vector<std::string> constants;
  for (int t : inputs) {
    if (chain.tensors[t].constant) constants.push_back(chain.tensors[t].name);
  }
  if (!constants.empty()) out += "const " + absl::StrJoin(constants, " ") + "\n";
  for (int o : ops) out += OpToString(chain.ops[o], chain) + "\n";
  std::vector<std::string> outs;
  for (int t : outputs) outs.push_back(chain.tensors[t].name);
  out += "out " + absl::StrJoin(outs, " ") + "\n";
  return out;
}

double ChainFlops(const Chain& chain, bool dense) {
  double total = 0;
  auto over = [](const Op& op, int d) {
    return std::find(op.index.begin(), op.index.end(), d) != op.index.end() ||
           std::find(op.reduce.begin(), op.reduce.end(), d) != op.reduce.end();
  };
  for (const Op& op : chain.ops) {
    double points = static_cast<double>(chain.tensors[op.output].NumElements());
    if (op.kind == OpKind::kSum) {
      for (int d : op.reduce) points *= static_cast<double>(chain.dims[d].extent);
      // Under a causal softmax, a sum over its rows and axis does the kept keys' work only.
      for (const Op& softmax : chain.ops) {
        if (!dense && softmax.Causal() && over(op, softmax.axis) && over(op, softmax.causal_row)) {
          points *= CausalShare(softmax, chain);
        }
      }
      total += 2 * points;
    } else {
      total += points * (op.kind == OpKind::kSoftmax ? 4 : 1);
    }
  }
  return total;
}

Access ResultAccess(const Op& op) {
  Access self;
  self.tensor = op.output;
  for (int d : op.index) self.index.push_back(AffineExpr::OfDim(d));
  return self;
}

std::vector<int> TensorsRead(const Op& op) {
  std::vector<int> out;
  ForEachAccess(op.body, [&](const Access& a) {
    if (std::find(out.begin(), out.end(), a.tensor) == out.end()) out.push_back(a.tensor);
  });
  return out;
}

}  // namespace fusor::ir
