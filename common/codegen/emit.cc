#include "common/codegen/emit.h"

#include <cstdio>

#include "absl/strings/str_join.h"

namespace fusor::codegen::emit {

using ir::Access;
using ir::Chain;
using ir::Expr;

std::string FloatLit(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  s += "f";
  return v < 0 ? "(" + s + ")" : s;
}

std::string LoadConvert(ir::DType dtype, const std::string& lvalue) {
  switch (dtype) {
    case ir::DType::kF32: return lvalue;
    case ir::DType::kF16: return absl::StrCat("fusor_f16_to_f32(", lvalue, ")");
    case ir::DType::kBF16: return absl::StrCat("fusor_bf16_to_f32(", lvalue, ")");
  }
  return lvalue;
}

std::string StoreConvert(ir::DType dtype, const std::string& value) {
  switch (dtype) {
    case ir::DType::kF32: return value;
    case ir::DType::kF16: return absl::StrCat("fusor_f32_to_f16(", value, ")");
    case ir::DType::kBF16: return absl::StrCat("fusor_f32_to_bf16(", value, ")");
  }
  return value;
}

std::string LinearToC(const std::vector<std::pair<int64_t, std::string>>& terms, int64_t constant) {
  std::string out;
  for (const auto& [c, var] : terms) {
    if (c == 0) continue;
    if (!out.empty()) out += c < 0 ? " - " : " + ";
    else if (c < 0) out += "-";
    int64_t mag = c < 0 ? -c : c;
    out += mag == 1 ? var : absl::StrCat(mag, "L*", var);
  }
  if (constant != 0 || out.empty()) {
    if (!out.empty()) out += constant < 0 ? " - " : " + ";
    else if (constant < 0) out += "-";
    absl::StrAppend(&out, constant < 0 ? -constant : constant, "L");
  }
  return out;
}

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (int a = static_cast<int>(shape.size()) - 1; a >= 0; --a) {
    strides[a] = s;
    s *= shape[a];
  }
  return strides;
}

std::string GlobalOffset(const Access& a, const Names& n) {
  const ir::Tensor& t = n.chain.tensors[a.tensor];
  std::vector<int64_t> strides = RowMajorStrides(t.shape);
  std::map<int, int64_t> coef;
  int64_t constant = 0;
  for (size_t axis = 0; axis < a.index.size(); ++axis) {
    constant += a.index[axis].constant * strides[axis];
    for (const auto& [d, c] : a.index[axis].terms) coef[d] += c * strides[axis];
  }
  std::vector<std::pair<int64_t, std::string>> terms;
  for (const auto& [d, c] : coef) terms.push_back({c, n.V(d)});
  return LinearToC(terms, constant);
}

std::map<int, int64_t> GlobalStrides(const Access& a, const Chain& chain, int64_t* constant) {
  std::vector<int64_t> strides = RowMajorStrides(chain.tensors[a.tensor].shape);
  std::map<int, int64_t> coef;
  *constant = 0;
  for (size_t axis = 0; axis < a.index.size(); ++axis) {
    *constant += a.index[axis].constant * strides[axis];
    for (const auto& [d, c] : a.index[axis].terms) coef[d] += c * strides[axis];
  }
  return coef;
}

std::string CallFunc(ir::Func f, const std::string& arg) {
  switch (f) {
    case ir::Func::kRelu: return absl::StrCat("fusor_relu(", arg, ")");
    case ir::Func::kGelu: return absl::StrCat("fusor_gelu(", arg, ")");
    case ir::Func::kExp: return absl::StrCat("expf(", arg, ")");
    case ir::Func::kTanh: return absl::StrCat("tanhf(", arg, ")");
    case ir::Func::kSigmoid: return absl::StrCat("fusor_sigmoid(", arg, ")");
  }
  return arg;
}


std::string ExprToC(const Expr& e, const LoadFn& load) {
  switch (e.kind) {
    case Expr::Kind::kConst: return FloatLit(e.value);
    case Expr::Kind::kAccess: return load(e.access);
    case Expr::Kind::kAdd: return absl::StrCat("(", ExprToC(e.args[0], load), " + ", ExprToC(e.args[1], load), ")");
    case Expr::Kind::kSub: return absl::StrCat("(", ExprToC(e.args[0], load), " - ", ExprToC(e.args[1], load), ")");
    case Expr::Kind::kMul: return absl::StrCat("(", ExprToC(e.args[0], load), " * ", ExprToC(e.args[1], load), ")");
    case Expr::Kind::kDiv: return absl::StrCat("(", ExprToC(e.args[0], load), " / ", ExprToC(e.args[1], load), ")");
    case Expr::Kind::kNeg: return absl::StrCat("(-", ExprToC(e.args[0], load), ")");
    case Expr::Kind::kCall: return CallFunc(e.func, ExprToC(e.args[0], load));
  }
  return "0.0f";
}

std::string ProductToC(const std::vector<Access>& factors, double scale, const LoadFn& load) {
  std::vector<std::string> parts;
  for (const Access& a : factors) parts.push_back(load(a));
  if (scale != 1 || parts.empty()) parts.push_back(FloatLit(scale));
  return absl::StrJoin(parts, " * ");
}

std::string FlatIndex(const std::vector<int>& dims, const Names& n) {
  if (dims.empty()) return "0L";
  std::string s = n.I(dims[0]);
  for (size_t i = 1; i < dims.size(); ++i) s = absl::StrCat("(", s, ") * ", n.N(dims[i]), " + ", n.I(dims[i]));
  return s;
}

std::string Count(const std::vector<int>& dims, const Names& n) {
  if (dims.empty()) return "1L";
  std::vector<std::string> parts;
  for (int d : dims) parts.push_back(n.N(d));
  return absl::StrCat("(", absl::StrJoin(parts, " * "), ")");
}

nlohmann::json TensorsJson(const Chain& chain, const std::vector<int>& ids) {
  nlohmann::json arr = nlohmann::json::array();
  for (int t : ids) {
    arr.push_back({{"name", chain.tensors[t].name},
                   {"dtype", std::string(ir::DTypeName(chain.dtype))},
                   {"shape", chain.tensors[t].shape}});
  }
  return arr;
}


}  // namespace fusor::codegen::emit
