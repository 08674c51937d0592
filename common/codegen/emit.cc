#include "common/codegen/emit.h"

#include <algorithm>
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

namespace {

// An axis's stride in its tensor's row-major layout: `literal` times the
// sizes of the ranged dims of the axes inside it.
struct AxisStride {
  int64_t literal = 1;
  std::vector<int> ranged;  // dim ids, innermost axis first
};

std::vector<AxisStride> Layout(const ir::Tensor& t, const Chain& chain) {
  std::vector<AxisStride> strides(t.shape.size());
  AxisStride s;
  for (int a = static_cast<int>(t.shape.size()) - 1; a >= 0; --a) {
    strides[a] = s;
    const int d = t.axis_dims[a];
    if (d >= 0 && chain.dims[d].Ranged()) {
      s.ranged.push_back(d);
    } else {
      s.literal *= t.shape[a];
    }
  }
  return strides;
}

std::string SizesTimes(const std::vector<int>& ranged, const std::string& var, const Names& n) {
  std::vector<std::string> parts;
  for (int d : ranged) parts.push_back(n.X(d));
  if (!var.empty()) parts.push_back(var);
  return absl::StrJoin(parts, "*");
}

}  // namespace

std::string GlobalOffset(const Access& a, const Names& n) {
  const std::vector<AxisStride> layout = Layout(n.chain.tensors[a.tensor], n.chain);
  // Coefficients by (ranged sizes, dim): the literal terms first, by dim.
  std::map<std::pair<std::vector<int>, int>, int64_t> coef;
  std::map<std::vector<int>, int64_t> constant;
  for (size_t axis = 0; axis < a.index.size(); ++axis) {
    constant[layout[axis].ranged] += a.index[axis].constant * layout[axis].literal;
    for (const auto& [d, c] : a.index[axis].terms) coef[{layout[axis].ranged, d}] += c * layout[axis].literal;
  }
  std::vector<std::pair<int64_t, std::string>> terms;
  for (const auto& [at, c] : coef) terms.push_back({c, SizesTimes(at.first, n.V(at.second), n)});
  for (const auto& [ranged, c] : constant) {
    if (!ranged.empty()) terms.push_back({c, SizesTimes(ranged, "", n)});
  }
  return LinearToC(terms, constant[{}]);
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

bool RuntimeGlobalStride(const Access& a, int d, const Chain& chain) {
  const std::vector<AxisStride> layout = Layout(chain.tensors[a.tensor], chain);
  for (size_t axis = 0; axis < a.index.size(); ++axis) {
    if (a.index[axis].DependsOn(d) && !layout[axis].ranged.empty()) return true;
  }
  return false;
}

std::string GlobalStrideC(const Access& a, int d, const Names& n) {
  const std::vector<AxisStride> layout = Layout(n.chain.tensors[a.tensor], n.chain);
  std::map<std::vector<int>, int64_t> coef;
  for (size_t axis = 0; axis < a.index.size(); ++axis) {
    const int64_t c = a.index[axis].Coefficient(d);
    if (c != 0) coef[layout[axis].ranged] += c * layout[axis].literal;
  }
  std::vector<std::pair<int64_t, std::string>> terms;
  int64_t literal = 0;
  for (const auto& [ranged, c] : coef) {
    if (ranged.empty()) {
      literal = c;
    } else {
      terms.push_back({c, SizesTimes(ranged, "", n)});
    }
  }
  return terms.empty() ? absl::StrCat(literal, "L") : absl::StrCat("(", LinearToC(terms, literal), ")");
}

std::string ElementsC(int t, const Names& n) {
  const ir::Tensor& tensor = n.chain.tensors[t];
  if (tensor.shape.empty()) return "1L";
  const AxisStride outer = Layout(tensor, n.chain)[0];
  const int d = tensor.axis_dims[0];
  const bool ranged = d >= 0 && n.chain.dims[d].Ranged();
  AxisStride all = outer;
  if (ranged) {
    all.ranged.push_back(d);
  } else {
    all.literal *= tensor.shape[0];
  }
  if (all.ranged.empty()) return absl::StrCat(all.literal, "L");
  return absl::StrCat("(", all.literal, "L*", SizesTimes(all.ranged, "", n), ")");
}

std::string CausalValue(const ir::Op& softmax, const Names& n, const std::string& x, const std::string& minus_infinity) {
  if (!softmax.Causal()) return x;
  return absl::StrCat("(", n.V(softmax.axis), " <= ", n.V(softmax.causal_row), " + ", softmax.causal_offset, "L ? ", x,
                      " : ", minus_infinity, ")");
}

std::string CausalKept(const ir::Op& softmax, const Names& n) {
  const std::string ax = n.N(softmax.axis);
  const std::string bound =
      absl::StrCat(n.V(softmax.causal_row), " + ", softmax.causal_offset + 1, "L - ", n.O(softmax.axis));
  return absl::StrCat("(", bound, " < 0L ? 0L : ", bound, " < ", ax, " ? ", bound, " : ", ax, ")");
}

std::string CallFunc(ir::Func f, const std::string& arg) {
  switch (f) {
    case ir::Func::kRelu: return absl::StrCat("fusor_relu(", arg, ")");
    case ir::Func::kGelu: return absl::StrCat("fusor_gelu(", arg, ")");
    case ir::Func::kGeluTanh: return absl::StrCat("fusor_gelu_tanh(", arg, ")");
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
    nlohmann::json entry = {{"name", chain.tensors[t].name},
                            {"dtype", std::string(ir::DTypeName(chain.dtype))},
                            {"shape", chain.tensors[t].shape}};
    if (chain.tensors[t].constant) entry["constant"] = true;
    const std::vector<int>& axes = chain.tensors[t].axis_dims;
    if (std::any_of(axes.begin(), axes.end(), [&](int d) { return d >= 0 && chain.dims[d].Ranged(); })) {
      nlohmann::json dims = nlohmann::json::array();
      for (int d : axes) dims.push_back(d >= 0 && chain.dims[d].Ranged() ? nlohmann::json(chain.dims[d].name) : nullptr);
      entry["dims"] = dims;
    }
    arr.push_back(std::move(entry));
  }
  return arr;
}


int OpenPointLoops(Writer& w, const std::vector<int>& dims, const Names& n, const std::string& pragma_on_first) {
  for (size_t i = 0; i < dims.size(); ++i) {
    int d = dims[i];
    if (i == 0 && !pragma_on_first.empty()) w.Line(pragma_on_first);
    w.Open(absl::StrCat("for (long ", n.I(d), " = 0; ", n.I(d), " < ", n.N(d), "; ++", n.I(d), ")"));
    w.Line(absl::StrCat("const long ", n.V(d), " = ", n.O(d), " + ", n.I(d), ";"));
  }
  return static_cast<int>(dims.size());
}

void CloseScopes(Writer& w, int count) {
  for (int i = 0; i < count; ++i) w.Close();
}

NestIndex::NestIndex(const ir::Chain& chain, const space::LoopNest& nest) : chain_(chain), nest_(nest), n_{chain} {
  block_.assign(chain.dims.size(), false);
  for (int d : nest.schedule.block) block_[d] = true;
}

std::string NestIndex::RangeOf(int d, const std::string& origin) const {
  const int64_t tile = nest_.schedule.tile[d], extent = chain_.dims[d].extent;
  // A constant where the tile divides the extent, so that the compiler
  // can unroll and vectorize with known trip counts.
  if (tile == 1 || (!chain_.dims[d].Ranged() && extent % tile == 0)) return absl::StrCat(tile, "L");
  const std::string size = n_.Extent(d);
  return absl::StrCat(size, " - ", origin, " < ", tile, "L ? ", size, " - ", origin, " : ", tile, "L");
}

std::string NestIndex::Trips(int d) const {
  return chain_.dims[d].Ranged() ? n_.T(d) : absl::StrCat(nest_.trips[d], "L");
}

std::string NestIndex::Blocks() const {
  std::vector<std::string> ranged;
  int64_t literal = nest_.num_blocks;
  for (int d : nest_.schedule.block) {
    if (!chain_.dims[d].Ranged()) continue;
    literal /= nest_.trips[d];
    ranged.push_back(n_.T(d));
  }
  if (ranged.empty()) return absl::StrCat(literal, "L");
  return absl::StrCat("(", literal, "L * ", absl::StrJoin(ranged, " * "), ")");
}

void NestIndex::DeclareSizes(Writer& w, const std::string& dims) const {
  const std::vector<int> ranged = chain_.RangedDims();
  for (size_t i = 0; i < ranged.size(); ++i) {
    const int d = ranged[i];
    const int64_t tile = nest_.schedule.tile[d];
    w.Line(absl::StrCat("const long ", n_.X(d), " = ",
                        dims.empty() ? absl::StrCat(chain_.dims[d].extent, "L") : absl::StrCat(dims, "[", i, "]"),
                        ", ", n_.T(d), " = (", n_.X(d), " + ", tile - 1, "L) / ", tile, "L;"));
    w.Line(absl::StrCat("(void)", n_.X(d), "; (void)", n_.T(d), ";"));
  }
}

std::string NestIndex::LocalOffset(const Access& a) const {
  const space::LocalBuffer& b = nest_.local[a.tensor];
  const std::vector<int>& index = chain_.ops[chain_.tensors[a.tensor].producer].index;
  std::vector<int64_t> strides = RowMajorStrides(b.shape);
  std::vector<std::pair<int64_t, std::string>> terms;
  int64_t constant = 0;
  for (size_t axis = 0; axis < a.index.size(); ++axis) {
    constant += a.index[axis].constant * strides[axis];
    for (const auto& [d, c] : a.index[axis].terms) terms.push_back({c * strides[axis], n_.V(d)});
    if (b.relative[axis]) terms.push_back({-strides[axis], n_.O(index[axis])});
  }
  return LinearToC(terms, constant);
}

std::string NestIndex::StateOffset(const ir::Op& softmax) const {
  std::vector<std::pair<int64_t, std::string>> terms;
  int64_t stride = 1;
  for (int i = static_cast<int>(softmax.index.size()) - 1; i >= 0; --i) {
    int d = softmax.index[i];
    if (d == softmax.axis) continue;
    terms.push_back({stride, n_.V(d)});
    if (block_[d]) terms.push_back({-stride, n_.O(d)});
    stride *= block_[d] ? nest_.schedule.tile[d] : chain_.dims[d].extent;
  }
  return LinearToC(terms, 0);
}

int64_t NestIndex::LocalStride(const Access& a, int d) const {
  std::vector<int64_t> strides = RowMajorStrides(nest_.local[a.tensor].shape);
  int64_t stride = 0;
  for (size_t axis = 0; axis < a.index.size(); ++axis) stride += a.index[axis].Coefficient(d) * strides[axis];
  return stride;
}

int64_t NestIndex::StateStride(const ir::Op& softmax, int d) const {
  int64_t stride = 1;
  for (int i = static_cast<int>(softmax.index.size()) - 1; i >= 0; --i) {
    const int e = softmax.index[i];
    if (e == softmax.axis) continue;
    if (e == d) return stride;
    stride *= block_[e] ? nest_.schedule.tile[e] : chain_.dims[e].extent;
  }
  return 0;
}

std::string NestIndex::Load(const Access& a) const {
  if (nest_.local[a.tensor].floats > 0) return absl::StrCat(n_.Local(a.tensor), "[", LocalOffset(a), "]");
  return LoadConvert(chain_.dtype, absl::StrCat(n_.Global(a.tensor), "[", GlobalOffset(a, n_), "]"));
}

void NestIndex::DefineFullRanges(Writer& w, const space::OpNest& on, bool in_stream) const {
  const ir::Op& op = chain_.ops[on.op];
  std::vector<int> dims = op.index;
  dims.insert(dims.end(), op.reduce.begin(), op.reduce.end());
  for (int d : dims) {
    bool looped = block_[d] || (d == nest_.stream_dim && on.region == space::Region::kStream) ||
                  std::find(on.loops.begin(), on.loops.end(), d) != on.loops.end();
    if (looped) continue;
    w.Line(absl::StrCat("const long ", n_.O(d), " = 0, ", n_.N(d), " = ",
                        Bounded(d, &on, in_stream) ? n_.E(d) : n_.Extent(d), ";"));
  }
}

void NestIndex::OpenTileLoop(Writer& w, int d, const space::OpNest* on) const {
  const std::string end = Bounded(d, on) ? n_.E(d) : n_.Extent(d);
  w.Open(absl::StrCat("for (long ", n_.O(d), " = 0; ", n_.O(d), " < ", end, "; ", n_.O(d), " += ",
                      nest_.schedule.tile[d], "L)"));
  w.Line(absl::StrCat("const long ", n_.N(d), " = ", RangeOf(d, n_.O(d)), ";"));
  if (nest_.causal_softmax >= 0 && chain_.ops[nest_.causal_softmax].causal_row == d && d == nest_.stream_dim) {
    DefineCausalEnd(w);
  }
}

void NestIndex::DefineCausalEnd(Writer& w) const {
  // The axis's tiles up to the one holding the row tile's last kept entry;
  // an untiled axis up to that entry.
  const ir::Op& causal = chain_.ops[nest_.causal_softmax];
  const int ax = causal.axis, row = causal.causal_row;
  const int64_t tile = nest_.schedule.tile[ax];
  const std::string extent = n_.Extent(ax);
  const std::string last = absl::StrCat(n_.O(row), " + ", n_.N(row), " + ", causal.causal_offset, "L");
  const std::string end =
      nest_.trips[ax] == 1 ? last : absl::StrCat("(", last, " - 1L) / ", tile, "L * ", tile, "L + ", tile, "L");
  w.Line(absl::StrCat("const long ", n_.E(ax), " = ", end, " < ", extent, " ? ", end, " : ", extent, ";"));
}

void NestIndex::DefineBlockOrigins(Writer& w, const std::string& block_index) const {
  const std::vector<int>& block = nest_.schedule.block;
  if (block.empty()) return;
  const ir::Op* causal = nest_.causal_softmax >= 0 ? &chain_.ops[nest_.causal_softmax] : nullptr;
  w.Line(absl::StrCat("long rest = ", block_index, ";"));
  for (int i = static_cast<int>(block.size()) - 1; i >= 0; --i) {
    const int d = block[i];
    const std::string trips = Trips(d);
    const std::string last_tile =
        chain_.dims[d].Ranged() ? absl::StrCat(trips, " - 1L") : absl::StrCat(nest_.trips[d] - 1, "L");
    const std::string tile = causal && causal->causal_row == d ? absl::StrCat(last_tile, " - rest % ", trips)
                                                               : absl::StrCat("rest % ", trips);
    w.Line(absl::StrCat("const long ", n_.O(d), " = (", tile, ") * ", nest_.schedule.tile[d], "L; rest /= ", trips,
                        ";"));
    w.Line(absl::StrCat("const long ", n_.N(d), " = ", RangeOf(d, n_.O(d)), ";"));
  }
  if (causal && block_[causal->causal_row]) DefineCausalEnd(w);
}

void NestIndex::Store(Writer& w, const space::OpNest& on, const std::string& value) const {
  const ir::Op& op = chain_.ops[on.op];
  Access self = ir::ResultAccess(op);
  if (nest_.local[op.output].floats > 0) {
    std::string at = absl::StrCat(n_.Local(op.output), "[", LocalOffset(self), "]");
    if (on.online_softmax >= 0) {
      w.Line(absl::StrCat(at, " = ", at, " * sscale", on.online_softmax, "[",
                          StateOffset(chain_.ops[on.online_softmax]), "] + ", value, ";"));
    } else if (on.accumulates) {
      w.Line(absl::StrCat(at, " += ", value, ";"));
    } else {
      w.Line(absl::StrCat(at, " = ", value, ";"));
    }
  }
  if (chain_.tensors[op.output].role == ir::TensorRole::kOutput && !on.accumulates) {
    w.Line(absl::StrCat(n_.Global(op.output), "[", GlobalOffset(self, n_), "] = ", StoreConvert(chain_.dtype, value),
                        ";"));
  }
}

}  // namespace fusor::codegen::emit
