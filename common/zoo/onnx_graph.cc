// The graph as the ONNX importer's patterns read it, and the helpers they
// share (onnx_patterns.h).
#include "common/zoo/onnx_patterns.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codegen/cpu/prelude.h"
#include "common/ir/parse.h"

namespace fusor::zoo::importer {

Graph::Graph(const onnx::GraphProto& g, int64_t opset) : g_(g), opset_(opset) {
  for (const onnx::NodeProto& n : g.node()) {
    for (const std::string& out : n.output()) producer_[out] = &n;
    for (const std::string& in : n.input()) {
      std::vector<const onnx::NodeProto*>& readers = consumers_[in];
      if (readers.empty() || readers.back() != &n) readers.push_back(&n);
    }
  }
  for (const onnx::TensorProto& t : g.initializer()) {
    initializer_[t.name()] = &t;
    shape_[t.name()] = {t.dims().begin(), t.dims().end()};
  }
  auto add = [&](const onnx::ValueInfoProto& v) {
    if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return;
    std::vector<int64_t> dims;
    for (const auto& d : v.type().tensor_type().shape().dim()) {
      if (d.has_dim_value()) {
        dims.push_back(d.dim_value());
      } else {
        dims.push_back(-1);
        if (d.has_dim_param()) symbolic_[v.name()] = d.dim_param();
      }
    }
    shape_[v.name()] = dims;
  };
  for (const auto& v : g.input()) add(v);
  for (const auto& v : g.value_info()) add(v);
  for (const auto& v : g.output()) add(v);
  for (const auto& v : g.output()) outputs_.insert(v.name());
  std::set<std::string> unbound;  // symbolic dims of the inputs --dim did not bind
  for (const auto& v : g.input()) {
    for (const auto& d : v.type().tensor_type().shape().dim()) {
      if (d.has_dim_param() && !d.dim_param().empty()) unbound.insert(d.dim_param());
    }
  }
  if (!unbound.empty()) {
    unknown_hint_ = absl::StrCat(" (unbound input dims: ", absl::StrJoin(unbound, ", "), "; bind them with --dim ",
                                 *unbound.begin(), "=N)");
  }
}
std::variant<std::vector<int64_t>, Reject> Graph::Shape(const std::string& t) const {
  auto it = shape_.find(t);
  if (it == shape_.end()) {
    return Reject{absl::StrCat("the shape of '", t, "' is unknown after shape inference", unknown_hint_)};
  }
  for (int64_t d : it->second) {
    if (d < 0) {
      auto s = symbolic_.find(t);
      return Reject{s != symbolic_.end()
                        ? absl::StrCat("'", t, "' has the symbolic dim '", s->second, "': bind it with --dim ",
                                       s->second, "=N")
                        : absl::StrCat("'", t, "' has a dim shape inference could not resolve",
                                       unknown_hint_.empty() ? " (bind the model's symbolic dims with --dim)"
                                                             : unknown_hint_)};
    }
  }
  return it->second;
}
// A scalar constant (an initializer or a Constant node's value).
std::variant<double, Reject> Graph::Scalar(const std::string& t) const {
  const onnx::TensorProto* p = nullptr;
  if (auto it = initializer_.find(t); it != initializer_.end()) p = it->second;
  if (const onnx::NodeProto* n = Producer(t); p == nullptr && n != nullptr && n->op_type() == "Constant") {
    for (const onnx::AttributeProto& a : n->attribute()) {
      if (a.name() == "value" && a.has_t()) p = &a.t();
      if (a.name() == "value_float") return static_cast<double>(a.f());
    }
  }
  if (p == nullptr) return Reject{absl::StrCat("'", t, "' is not a constant")};
  int64_t count = 1;
  for (int64_t d : p->dims()) count *= d;
  if (count != 1) return Reject{absl::StrCat("'", t, "' is not a scalar")};
  if (p->data_location() == onnx::TensorProto::EXTERNAL) {
    return Reject{absl::StrCat("the value of '", t, "' is in external data, which is not read")};
  }
  switch (p->data_type()) {
    case onnx::TensorProto::FLOAT:
      if (p->float_data_size() == 1) return static_cast<double>(p->float_data(0));
      if (p->raw_data().size() == 4) {
        float f;
        std::memcpy(&f, p->raw_data().data(), 4);
        return static_cast<double>(f);
      }
      break;
    case onnx::TensorProto::DOUBLE:
      if (p->double_data_size() == 1) return p->double_data(0);
      if (p->raw_data().size() == 8) {
        double d;
        std::memcpy(&d, p->raw_data().data(), 8);
        return d;
      }
      break;
    case onnx::TensorProto::FLOAT16:
    case onnx::TensorProto::BFLOAT16:
    case onnx::TensorProto::BOOL: {
      // 16-bit floats and bools are kept in int32_data, one per element,
      // or in raw_data, two bytes and one byte each.
      const size_t bytes = p->data_type() == onnx::TensorProto::BOOL ? 1 : 2;
      uint16_t bits = 0;
      if (p->int32_data_size() == 1) {
        bits = static_cast<uint16_t>(p->int32_data(0));
      } else if (p->raw_data().size() == bytes) {
        std::memcpy(&bits, p->raw_data().data(), bytes);  // little-endian, as ONNX stores it
      } else {
        break;
      }
      if (p->data_type() == onnx::TensorProto::BOOL) return bits != 0 ? 1.0 : 0.0;
      return static_cast<double>(p->data_type() == onnx::TensorProto::FLOAT16 ? codegen::rt::fusor_f16_to_f32(bits)
                                                                               : codegen::rt::fusor_bf16_to_f32(bits));
    }
    default:
      break;
  }
  return Reject{absl::StrCat("'", t, "' is not a float or bool scalar")};
}
bool Graph::IsScalar(const std::string& t, double value) const {
  auto v = Scalar(t);
  return std::holds_alternative<double>(v) && std::fabs(std::get<double>(v) - value) < 1e-3 * std::fabs(value);
}
bool Graph::IsConstant(const std::string& t, int depth) const {
  if (initializer_.count(t) > 0) return true;
  const onnx::NodeProto* n = Producer(t);
  if (n == nullptr || depth >= 8) return false;
  if (n->op_type() == "Constant") return true;
  for (const std::string& in : n->input()) {
    if (!in.empty() && !IsConstant(in, depth + 1)) return false;
  }
  return n->input_size() > 0;
}
absl::StatusOr<CausalMask> Graph::Causality(const std::string& mask, int64_t rows, int64_t keys, int kept_if) const {
  const std::string key = absl::StrCat(mask, " ", rows, " ", keys, " ", kept_if);
  auto it = causal_.find(key);
  if (it == causal_.end()) it = causal_.emplace(key, ReadCausalMask(g_, opset_, mask, rows, keys, kept_if)).first;
  return it->second;
}
std::string Label(const onnx::NodeProto& n) {
  return absl::StrCat("'", n.name().empty() ? n.output(0) : n.name(), "' (", n.op_type(), ")");
}

int64_t AttrInt(const onnx::NodeProto& n, const std::string& name, int64_t fallback) {
  for (const onnx::AttributeProto& a : n.attribute()) {
    if (a.name() == name) return a.i();
  }
  return fallback;
}

std::vector<int64_t> AttrInts(const onnx::NodeProto& n, const std::string& name) {
  for (const onnx::AttributeProto& a : n.attribute()) {
    if (a.name() == name) return {a.ints().begin(), a.ints().end()};
  }
  return {};
}

float AttrFloat(const onnx::NodeProto& n, const std::string& name, float fallback) {
  for (const onnx::AttributeProto& a : n.attribute()) {
    if (a.name() == name) return a.f();
  }
  return fallback;
}

std::string AttrString(const onnx::NodeProto& n, const std::string& name, const std::string& fallback) {
  for (const onnx::AttributeProto& a : n.attribute()) {
    if (a.name() == name) return a.s();
  }
  return fallback;
}

namespace {

// The permutation a node producing `value` applies to its input, and that
// input: a Transpose; a Concat of one tensor with empty ones (the
// identity); or Reshape(Transpose(Reshape(x))) where the inner
// Reshape merges x's leading axes into one, the Transpose keeps that axis
// first and the outer Reshape splits it back (the dynamo exporter's SDPA
// writes K' so) — a Transpose of x. Out axis j is input axis perm[j].
struct Permuted {
  std::string input;
  std::vector<int64_t> perm;
  std::vector<const onnx::NodeProto*> nodes;
};

std::optional<Permuted> PermutedFrom(const Graph& g, const std::string& value) {
  const onnx::NodeProto* n = g.Producer(value);
  if (n == nullptr) return std::nullopt;
  auto valid = [](std::vector<int64_t> perm, size_t rank) {
    if (perm.size() != rank) return false;
    std::sort(perm.begin(), perm.end());
    for (size_t i = 0; i < perm.size(); ++i) {
      if (perm[i] != static_cast<int64_t>(i)) return false;
    }
    return true;
  };
  if (n->op_type() == "Transpose") {
    std::vector<int64_t> perm = AttrInts(*n, "perm");
    const size_t rank = g.KnownShape(value).size();
    if (perm.empty()) {
      for (int64_t i = static_cast<int64_t>(rank) - 1; i >= 0; --i) perm.push_back(i);
    }
    if (!valid(perm, rank)) return std::nullopt;
    return Permuted{n->input(0), perm, {n}};
  }
  if (n->op_type() == "Concat") {  // of one tensor and empty ones (GPT-2's empty KV cache): the identity
    std::string only;
    for (const std::string& in : n->input()) {
      const std::vector<int64_t> sh = g.KnownShape(in);
      if (sh.empty()) return std::nullopt;
      if (std::find(sh.begin(), sh.end(), 0) != sh.end()) continue;
      if (!only.empty()) return std::nullopt;
      only = in;
    }
    const std::vector<int64_t> out = g.KnownShape(value);
    if (only.empty() || g.KnownShape(only) != out) return std::nullopt;
    std::vector<int64_t> identity(out.size());
    for (size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<int64_t>(i);
    return Permuted{only, identity, {n}};
  }
  if (n->op_type() != "Reshape") return std::nullopt;
  const onnx::NodeProto* t = g.Producer(n->input(0));
  if (t == nullptr || t->op_type() != "Transpose") return std::nullopt;
  const onnx::NodeProto* merge = g.Producer(t->input(0));
  if (merge == nullptr || merge->op_type() != "Reshape") return std::nullopt;
  const std::vector<int64_t> x = g.KnownShape(merge->input(0)), merged = g.KnownShape(merge->output(0)),
                             out = g.KnownShape(value);
  const std::vector<int64_t> p = AttrInts(*t, "perm");
  if (merged.size() < 2 || x.size() <= merged.size() || !valid(p, merged.size()) || p[0] != 0) return std::nullopt;
  const size_t lead = x.size() - merged.size() + 1;  // x's axes merged into merged's first
  int64_t product = 1;
  for (size_t i = 0; i < lead; ++i) product *= x[i];
  if (merged[0] != product || !std::equal(merged.begin() + 1, merged.end(), x.begin() + lead)) return std::nullopt;
  std::vector<int64_t> perm, want(x.begin(), x.begin() + lead);
  for (size_t i = 0; i < lead; ++i) perm.push_back(static_cast<int64_t>(i));
  for (size_t j = 1; j < p.size(); ++j) {
    perm.push_back(static_cast<int64_t>(lead) - 1 + p[j]);
    want.push_back(merged[p[j]]);
  }
  if (out != want) return std::nullopt;
  return Permuted{merge->input(0), perm, {n, t, merge}};
}

}  // namespace

// `value` viewed with dims `names` (one per axis of the view), looking
// through the Transposes (PermutedFrom) that produce it.
std::variant<Operand, Reject> View(const Graph& g, const std::string& value, const std::vector<std::string>& names,
                                   std::vector<const onnx::NodeProto*>* nodes) {
  Operand op;
  op.value = value;
  std::vector<std::string> axes = names;
  for (int hops = 0; hops < 4; ++hops) {
    std::optional<Permuted> p = PermutedFrom(g, op.value);
    if (!p || p->perm.size() != axes.size()) break;
    std::vector<std::string> in(axes.size());
    for (size_t j = 0; j < p->perm.size(); ++j) in[p->perm[j]] = axes[j];
    axes = in;
    op.value = p->input;
    nodes->insert(nodes->end(), p->nodes.begin(), p->nodes.end());
  }
  auto shape = g.Shape(op.value);
  std::string why;
  if (Failed(shape, &why)) return Reject{why};
  op.shape = std::get<std::vector<int64_t>>(shape);
  op.axes = axes;
  if (op.shape.size() != axes.size()) return Reject{absl::StrCat("'", op.value, "' has an unexpected rank")};
  return op;
}

std::string Decl(const std::string& name, const Operand& o) {
  std::vector<std::string> dims;
  for (size_t i = 0; i < o.axes.size(); ++i) dims.push_back(o.axes[i] == "0" ? absl::StrCat(o.shape[i]) : o.axes[i]);
  return absl::StrCat(name, "[", absl::StrJoin(dims, ","), "]");
}
std::string Use(const std::string& name, const Operand& o) { return absl::StrCat(name, "[", absl::StrJoin(o.axes, ","), "]"); }

// Declares constant the chain's inputs that read constant values of the
// graph (initializers: the model's weights), by (input, value) pairs.
void MarkConstants(const Graph& g, ir::Chain& chain, const std::vector<std::pair<std::string, std::string>>& inputs) {
  for (const auto& [name, value] : inputs) {
    const int t = chain.FindTensor(name);
    if (t >= 0 && !value.empty() && g.IsConstant(value)) chain.tensors[t].constant = true;
  }
}

// The element type of `value` (onnx::TensorProto::DataType), 0 if unknown.
int ElemType(const Graph& g, const std::string& value) {
  for (const auto* list : {&g.proto().input(), &g.proto().value_info(), &g.proto().output()}) {
    for (const onnx::ValueInfoProto& v : *list) {
      if (v.name() == value) return v.type().tensor_type().elem_type();
    }
  }
  for (const onnx::TensorProto& t : g.proto().initializer()) {
    if (t.name() == value) return t.data_type();
  }
  return 0;
}

std::string DTypeOf(const Graph& g, const std::string& value) {
  switch (ElemType(g, value)) {
    case onnx::TensorProto::FLOAT16: return "f16";
    case onnx::TensorProto::BFLOAT16: return "bf16";
    default: return "f32";
  }
}

// The result of a parsed chain text made from `nodes`, or why it does not
// parse.
std::variant<Match, Reject> ChainMatch(const std::string& text, std::vector<const onnx::NodeProto*> nodes,
                                       const std::vector<std::string>& notes) {
  auto chain = ir::ParseChainText(text);
  if (!chain.ok()) return Reject{std::string(chain.status().message())};
  return Match{std::move(*chain), std::move(nodes), absl::StrJoin(notes, "; ")};
}

// The axes of a mask of shape `mask` broadcast to scores of dims `dims`
// with extents `extents`, aligned at the last axis (the mask has no more
// axes than the scores): each axis is the dim whose extent it has, or "0"
// where it is 1. nullopt when an axis is neither; `*bad` says which.
std::optional<std::vector<std::string>> BroadcastAxes(const std::vector<int64_t>& mask,
                                                      const std::vector<std::string>& dims,
                                                      const std::vector<int64_t>& extents, size_t* bad) {
  std::vector<std::string> axes;
  for (size_t a = 0; a < mask.size(); ++a) {
    const size_t j = dims.size() - mask.size() + a;
    if (mask[a] == extents[j]) {
      axes.push_back(dims[j]);
    } else if (mask[a] == 1) {
      axes.push_back("0");
    } else {
      *bad = a;
      return std::nullopt;
    }
  }
  return axes;
}

}  // namespace fusor::zoo::importer
