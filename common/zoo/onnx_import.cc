#include "common/zoo/onnx_import.h"

#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>


#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codegen/cpu/prelude.h"
#include "common/ir/parse.h"
#include "common/util/files.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"
#include "common/zoo/onnx_contrib.h"
#include "common/zoo/onnx_causal.h"
#include "common/zoo/onnx_fold.h"

namespace fusor::zoo {
namespace {

// Why a candidate pattern does not make a chain ("" when it is no
// candidate at all).
struct Reject {
  std::string why;
};

// A chain a pattern made, from these nodes; `note` says what the chain
// assumes of its inputs beyond the graph's.
struct Match {
  ir::Chain chain;
  std::vector<const onnx::NodeProto*> nodes;
  std::string note;
};

class Graph {
 public:
  Graph(const onnx::GraphProto& g, int64_t opset) : g_(g), opset_(opset) {
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

  const onnx::NodeProto* Producer(const std::string& t) const {
    auto it = producer_.find(t);
    return it == producer_.end() ? nullptr : it->second;
  }
  // The one node reading `t`, unless more read it or it is a graph output.
  const onnx::NodeProto* SoleConsumer(const std::string& t) const {
    auto it = consumers_.find(t);
    if (it == consumers_.end() || it->second.size() != 1 || outputs_.count(t) > 0) return nullptr;
    return it->second[0];
  }
  // The nodes reading `t`, each once, in graph order.
  std::vector<const onnx::NodeProto*> Consumers(const std::string& t) const {
    auto it = consumers_.find(t);
    return it == consumers_.end() ? std::vector<const onnx::NodeProto*>() : it->second;
  }
  // The shape of `t` when every dim is known, else empty.
  std::vector<int64_t> KnownShape(const std::string& t) const {
    auto s = Shape(t);
    return std::holds_alternative<std::vector<int64_t>>(s) ? std::get<std::vector<int64_t>>(s) : std::vector<int64_t>{};
  }
  // The known shape of `t`, or why not.
  std::variant<std::vector<int64_t>, Reject> Shape(const std::string& t) const {
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
  std::variant<double, Reject> Scalar(const std::string& t) const {
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
  bool IsScalar(const std::string& t, double value) const {
    auto v = Scalar(t);
    return std::holds_alternative<double>(v) && std::fabs(std::get<double>(v) - value) < 1e-3 * std::fabs(value);
  }

  // Whether `t` is the same on every run: an initializer, a Constant
  // node's output, or what nodes compute from those alone (a weight
  // transposed or cast by the exporter), up to a few nodes deep.
  bool IsConstant(const std::string& t, int depth = 0) const {
    if (initializer_.count(t) > 0) return true;
    const onnx::NodeProto* n = Producer(t);
    if (n == nullptr || depth >= 8) return false;
    if (n->op_type() == "Constant") return true;
    for (const std::string& in : n->input()) {
      if (!in.empty() && !IsConstant(in, depth + 1)) return false;
    }
    return n->input_size() > 0;
  }

  const onnx::GraphProto& proto() const { return g_; }
  // ReadCausalMask of `mask`, evaluated once per mask (layers share theirs).
  absl::StatusOr<CausalMask> Causality(const std::string& mask, int64_t rows, int64_t keys, int kept_if) const {
    const std::string key = absl::StrCat(mask, " ", rows, " ", keys, " ", kept_if);
    auto it = causal_.find(key);
    if (it == causal_.end()) it = causal_.emplace(key, ReadCausalMask(g_, opset_, mask, rows, keys, kept_if)).first;
    return it->second;
  }

 private:
  const onnx::GraphProto& g_;
  const int64_t opset_;
  std::map<std::string, const onnx::NodeProto*> producer_;
  std::map<std::string, std::vector<const onnx::NodeProto*>> consumers_;
  std::map<std::string, const onnx::TensorProto*> initializer_;
  std::map<std::string, std::vector<int64_t>> shape_;
  std::map<std::string, std::string> symbolic_;
  std::set<std::string> outputs_;
  std::string unknown_hint_;  // why a shape may be unknown: the inputs' unbound dims
  mutable std::map<std::string, absl::StatusOr<CausalMask>> causal_;
};

std::string Label(const onnx::NodeProto& n) {
  return absl::StrCat("'", n.name().empty() ? n.output(0) : n.name(), "' (", n.op_type(), ")");
}

template <typename T>
bool Failed(const std::variant<T, Reject>& v, std::string* why) {
  if (const Reject* r = std::get_if<Reject>(&v)) {
    *why = r->why;
    return true;
  }
  return false;
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

// An operand of the chain: the graph value read, and the dim names of the
// chain's view in the value's axis order (a Transpose before it folded in).
struct Operand {
  std::string value;
  std::vector<int64_t> shape;
  std::vector<std::string> axes;  // per axis of `value`: a dim name or a constant index ("0")
};

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

// K or V repeated for each query head of its group, as transformers'
// repeat_kv writes it: Reshape(Expand(Unsqueeze(x, 2))) from x [B, G, N, D]
// through [B, G, R, N, D] to [B, G * R, N, D].
struct Repeat {
  std::string source;  // x
  std::vector<int64_t> shape;
  int64_t groups = 0, reps = 0;
  std::vector<const onnx::NodeProto*> nodes;
};

std::optional<Repeat> RepeatedKv(const Graph& g, const std::string& value) {
  const onnx::NodeProto* reshape = g.Producer(value);
  if (reshape == nullptr || reshape->op_type() != "Reshape") return std::nullopt;
  const onnx::NodeProto* expand = g.Producer(reshape->input(0));
  if (expand == nullptr || expand->op_type() != "Expand") return std::nullopt;
  const onnx::NodeProto* unsqueeze = g.Producer(expand->input(0));
  if (unsqueeze == nullptr || unsqueeze->op_type() != "Unsqueeze") return std::nullopt;
  const std::vector<int64_t> x = g.KnownShape(unsqueeze->input(0)), one = g.KnownShape(unsqueeze->output(0)),
                             wide = g.KnownShape(reshape->input(0)), out = g.KnownShape(value);
  if (x.size() != 4 || one != std::vector<int64_t>{x[0], x[1], 1, x[2], x[3]} || wide.size() != 5 ||
      wide != std::vector<int64_t>{x[0], x[1], wide[2], x[2], x[3]} ||
      out != std::vector<int64_t>{x[0], x[1] * wide[2], x[2], x[3]}) {
    return std::nullopt;
  }
  return Repeat{unsqueeze->input(0), x, x[1], wide[2], {reshape, expand, unsqueeze}};
}

// Whether `t` is the scalar constant 0.
bool IsZero(const Graph& g, const std::string& t) {
  auto v = g.Scalar(t);
  return std::holds_alternative<double>(v) && std::get<double>(v) == 0;
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

// An additive term of written-out attention's scores: the graph value
// and its name in the chain.
struct Term {
  std::string value, name;
  int kept_if = -1;  // a Where's condition: the scores are kept where it is this (0 or 1); -1: additive
};

// Written-out attention from its Softmax back to the Q K' MatMul: the
// additive terms met on the way, the scale, and the MatMul's operands
// past the scales on them.
struct ScorePath {
  std::vector<Term> masks;
  double scale = 1;
  const onnx::NodeProto* qk = nullptr;
  std::string q_value, k_value;
};

// Whether `t` is the scores: the MatMul's output, directly, through the
// scale or through up to `depth` more Adds or Wheres.
bool IsScores(const Graph& g, const std::string& t, int depth) {
  const onnx::NodeProto* p = g.Producer(t);
  if (p != nullptr && p->op_type() == "Add" && depth > 0) {
    return IsScores(g, p->input(0), depth - 1) || IsScores(g, p->input(1), depth - 1);
  }
  if (p != nullptr && p->op_type() == "Where" && p->input_size() == 3 && depth > 0) {
    return IsScores(g, p->input(1), depth - 1) || IsScores(g, p->input(2), depth - 1);
  }
  if (p != nullptr && (p->op_type() == "Div" || p->op_type() == "Mul")) p = g.Producer(p->input(0));
  return p != nullptr && p->op_type() == "MatMul";
}

// Walks back from the scores `*cur` over the additive terms into `path`:
// a mask, T5's position bias, and a boolean mask applied by Where(cond,
// scores, fill) (older GPT-2 exports' causal mask): with a fill of -1e4 or
// below it is the additive mask of 0 and fill, the same after the softmax
// in every row that keeps a key, while the scores are far smaller than the
// fill's magnitude (exp underflows either way); a row that keeps none
// differs, and the source says so. The scores come from the MatMul,
// directly, through the scale or through another Add or Where; the other
// operand is a mask (which may itself be computed by a Mul).
std::optional<Reject> ReadAdditiveTerms(const Graph& g, std::string* cur, ScorePath* path,
                                        std::vector<std::string>* notes,
                                        std::vector<const onnx::NodeProto*>* nodes) {
  std::vector<Term>& masks = path->masks;
  const onnx::NodeProto* n = g.Producer(*cur);
  while (n != nullptr && (n->op_type() == "Add" || (n->op_type() == "Where" && n->input_size() == 3)) &&
         g.SoleConsumer(*cur) == nodes->back() && masks.size() < 3) {
    if (n->op_type() == "Add") {
      const bool first = IsScores(g, n->input(0), 2);
      const int adds = static_cast<int>(std::count_if(masks.begin(), masks.end(), [](const Term& t) { return t.name[0] != 'C'; }));
      masks.push_back({n->input(first ? 1 : 0), adds == 0 ? "M" : adds == 1 ? "B" : "B2", -1});
      *cur = n->input(first ? 0 : 1);
    } else {
      const bool kept_if_true = IsScores(g, n->input(1), 2);
      const std::string fill = n->input(kept_if_true ? 2 : 1);
      auto f = g.Scalar(fill);
      if (!std::holds_alternative<double>(f) || std::get<double>(f) > -1e4) {
        return Reject{absl::StrCat(Label(*n), " sets masked scores to '", fill,
                                   "', which is not a scalar of -1e4 or below (not an additive mask)")};
      }
      const bool second = std::any_of(masks.begin(), masks.end(), [](const Term& t) { return t.name[0] == 'C'; });
      masks.push_back({n->input(0), second ? "C2" : "C", kept_if_true ? 1 : 0});
      notes->push_back(absl::StrCat("C is '", n->input(0), "' as an additive mask: 0 where it is ",
                                    kept_if_true ? "true" : "false", ", ", std::get<double>(f), " where it is ",
                                    kept_if_true ? "false" : "true",
                                    " (the same after the softmax unless a row keeps no key)"));
      *cur = n->input(kept_if_true ? 1 : 2);
    }
    nodes->push_back(n);
    n = g.Producer(*cur);
  }
  return std::nullopt;
}

// The scale (a Div or Mul by a constant) producing `*cur`, if one does,
// into `path`; `*cur` moves to its input.
std::optional<Reject> ReadScoreScale(const Graph& g, std::string* cur, ScorePath* path,
                                     std::vector<const onnx::NodeProto*>* nodes) {
  const onnx::NodeProto* n = g.Producer(*cur);
  if (n == nullptr || (n->op_type() != "Div" && n->op_type() != "Mul")) return std::nullopt;
  auto c = g.Scalar(n->input(1));
  std::string why;
  if (Failed(c, &why)) return Reject{absl::StrCat("the scale ", Label(*n), ": ", why)};
  const double v = std::get<double>(c);
  if (n->op_type() == "Div" && v == 0) return Reject{"the scale divides by zero"};
  path->scale = n->op_type() == "Div" ? 1 / v : v;
  nodes->push_back(n);
  *cur = n->input(0);
  return std::nullopt;
}

// Written-out attention's path from Softmax `s` back to the Q K' MatMul:
// optional additive terms, an optional scale, the MatMul.
std::variant<ScorePath, Reject> FindScorePath(const Graph& g, const onnx::NodeProto& s,
                                              std::vector<std::string>* notes,
                                              std::vector<const onnx::NodeProto*>* nodes) {
  ScorePath path;
  std::string cur = s.input(0);
  if (auto r = ReadAdditiveTerms(g, &cur, &path, notes, nodes)) return *r;
  if (auto r = ReadScoreScale(g, &cur, &path, nodes)) return *r;
  const onnx::NodeProto* n = g.Producer(cur);
  if (n == nullptr || n->op_type() != "MatMul") return Reject{"no MatMul produces the scores"};
  path.qk = n;
  nodes->push_back(n);
  // SDPA as exporters decompose it scales Q and K by sqrt(scale) each.
  path.q_value = n->input(0);
  path.k_value = n->input(1);
  for (std::string* operand : {&path.q_value, &path.k_value}) {
    const onnx::NodeProto* m = g.Producer(*operand);
    if (m == nullptr || (m->op_type() != "Mul" && m->op_type() != "Div") || g.SoleConsumer(*operand) != n) continue;
    const bool left = m->op_type() == "Mul" && std::holds_alternative<double>(g.Scalar(m->input(0)));
    auto c = g.Scalar(m->input(left ? 0 : 1));
    if (!std::holds_alternative<double>(c) || std::get<double>(c) == 0) continue;
    path.scale *= m->op_type() == "Div" ? 1 / std::get<double>(c) : std::get<double>(c);
    nodes->push_back(m);
    *operand = m->input(left ? 1 : 0);
  }
  return path;
}

// Why a Dropout node is not the identity it is at inference: it runs in
// training mode (opset 12's third input, a constant true, or a graph input
// that may be), or its mask output is read. Empty when it is the identity.
std::string DropoutInTraining(const Graph& g, const onnx::NodeProto& d) {
  if (d.output_size() > 1 && !d.output(1).empty() && !g.Consumers(d.output(1)).empty()) {
    return absl::StrCat(Label(d), "'s dropout mask is read");
  }
  if (d.input_size() < 3 || d.input(2).empty()) return "";
  auto mode = g.Scalar(d.input(2));
  if (!std::holds_alternative<double>(mode)) {
    return absl::StrCat(Label(d), " may run in training mode (its training_mode '", d.input(2),
                        "' is not a constant): dropout is random");
  }
  if (std::get<double>(mode) == 0) return "";
  return absl::StrCat(Label(d), " runs in training mode (training_mode = true): dropout is random; export the "
                      "model in eval mode");
}

// Whether every value of float type `from` is exactly one of type `to`.
bool Widens(int from, int to) {
  using T = onnx::TensorProto;
  const bool half = from == T::FLOAT16 || from == T::BFLOAT16;
  return (half && (to == T::FLOAT || to == T::DOUBLE)) || (from == T::FLOAT && to == T::DOUBLE);
}

// The MatMul the probabilities (Softmax `s`'s output) feed as its left
// operand, possibly through the exporters' NaN guard Where(IsNaN(P), 0, P)
// (a row whose keys are all masked), Casts to the type they have or to a
// wider one and back (eager attention's softmax(x, dtype=f32).to(dtype), in
// an f16 export: f16 -> f32 -> f16) and a Dropout in inference mode (the
// identity).
std::variant<const onnx::NodeProto*, Reject> FindProbabilityMatMul(const Graph& g, const onnx::NodeProto& s,
                                                                   std::vector<std::string>* notes,
                                                                   std::vector<const onnx::NodeProto*>* nodes) {
  std::string probs = s.output(0);
  const onnx::NodeProto* pv = g.SoleConsumer(probs);
  std::string training;
  auto skip_identities = [&] {
    while (pv != nullptr && training.empty()) {
      const int type = ElemType(g, probs);
      if (pv->op_type() == "Dropout") {
        training = DropoutInTraining(g, *pv);
        if (!training.empty()) return;
      } else if (pv->op_type() != "Cast") {
        return;
      } else if (const int to = AttrInt(*pv, "to", -1); to != type) {
        const onnx::NodeProto* back = g.SoleConsumer(pv->output(0));
        if (!Widens(type, to) || back == nullptr || back->op_type() != "Cast" || AttrInt(*back, "to", -1) != type) {
          return;
        }
        nodes->push_back(pv);
        pv = back;
      }
      nodes->push_back(pv);
      probs = pv->output(0);
      pv = g.SoleConsumer(probs);
    }
  };
  skip_identities();
  if (const std::vector<const onnx::NodeProto*> readers = g.Consumers(probs); pv == nullptr && readers.size() == 2) {
    const onnx::NodeProto* is_nan = readers[0]->op_type() == "IsNaN" ? readers[0] : readers[1];
    const onnx::NodeProto* where = readers[0] == is_nan ? readers[1] : readers[0];
    if (is_nan->op_type() == "IsNaN" && where->op_type() == "Where" && where->input_size() == 3 &&
        where->input(0) == is_nan->output(0) && where->input(2) == probs && IsZero(g, where->input(1)) &&
        g.SoleConsumer(is_nan->output(0)) == where) {
      nodes->push_back(is_nan);
      nodes->push_back(where);
      probs = where->output(0);
      pv = g.SoleConsumer(probs);
      notes->push_back("the exporter's zeroing of NaN probabilities (rows with every key masked) is not kept");
      skip_identities();
    }
  }
  if (!training.empty()) return Reject{absl::StrCat("the probabilities go through a dropout: ", training)};
  if (pv == nullptr || pv->op_type() != "MatMul" || pv->input(0) != probs) {
    return Reject{"the probabilities do not feed one MatMul as its left operand"};
  }
  nodes->push_back(pv);
  return pv;
}

// `batch` followed by `tail`.
std::vector<std::string> WithBatch(const std::vector<std::string>& batch, const std::vector<std::string>& tail) {
  std::vector<std::string> v = batch;
  v.insert(v.end(), tail.begin(), tail.end());
  return v;
}

// Written-out attention's Q, K and V viewed with the chain's dims, and
// each dim's extent.
struct QkvViews {
  Operand q, k, v;
  std::map<std::string, int64_t> extent;
};

// Dims: batch axes `batch`, then m, n; head dims d (Q K') and e (V).
std::variant<QkvViews, Reject> ViewQkv(const Graph& g, const ScorePath& path, const onnx::NodeProto& pv,
                                       const std::vector<std::string>& batch,
                                       std::vector<const onnx::NodeProto*>* nodes) {
  std::string why;
  auto q = View(g, path.q_value, WithBatch(batch, {"m", "d"}), nodes);
  if (Failed(q, &why)) return Reject{why};
  auto k = View(g, path.k_value, WithBatch(batch, {"d", "n"}), nodes);
  if (Failed(k, &why)) return Reject{why};
  auto v = View(g, pv.input(1), WithBatch(batch, {"n", "e"}), nodes);
  if (Failed(v, &why)) return Reject{why};
  QkvViews qkv{std::get<Operand>(q), std::get<Operand>(k), std::get<Operand>(v), {}};
  for (const Operand* o : {&qkv.q, &qkv.k, &qkv.v}) {
    for (size_t i = 0; i < o->axes.size(); ++i) {
      auto [it, fresh] = qkv.extent.emplace(o->axes[i], o->shape[i]);
      if (!fresh && it->second != o->shape[i]) {
        return Reject{absl::StrCat("Q, K and V disagree on dim ", o->axes[i], " (broadcasting is not folded)")};
      }
    }
  }
  return qkv;
}

// Grouped-query attention written out: K and V repeated for each query
// head (repeat_kv). Read as grouped-query attention, as the LLaMA
// description's chain is: the head axis b1 splits into g (K/V head) and r
// (query head within its group), and K and V are read unrepeated, by g.
void ReadRepeatedKv(const Graph& g, int rank, QkvViews* qkv, std::vector<std::string>* batch,
                    std::vector<const onnx::NodeProto*>* nodes) {
  const std::optional<Repeat> rk = rank == 4 ? RepeatedKv(g, qkv->k.value) : std::nullopt;
  const std::optional<Repeat> rv = rank == 4 ? RepeatedKv(g, qkv->v.value) : std::nullopt;
  if (!rk || !rv || rk->groups != rv->groups || rk->reps != rv->reps || qkv->k.axes[1] != "b1" ||
      qkv->v.axes[1] != "b1") {
    return;
  }
  for (auto [o, r] : {std::pair{&qkv->k, &*rk}, std::pair{&qkv->v, &*rv}}) {
    o->value = r->source;
    o->shape = r->shape;
    o->axes[1] = "g";
    nodes->insert(nodes->end(), r->nodes.begin(), r->nodes.end());
  }
  std::replace(qkv->q.axes.begin(), qkv->q.axes.end(), std::string("b1"), std::string("g,r"));
  (*batch)[1] = "g,r";
  qkv->extent.erase("b1");
  qkv->extent["g"] = rk->groups;
  qkv->extent["r"] = rk->reps;
}

// Declares each additive term, broadcast to the scores (dims `score_axes`
// of extents `score_extents`), as an input and adds it to the scores.
std::optional<Reject> AddScoreTerms(const Graph& g, const std::vector<Term>& masks,
                                    const std::vector<std::string>& score_axes,
                                    const std::vector<int64_t>& score_extents, std::string* inputs,
                                    std::string* add) {
  std::string why;
  for (const auto& [value, name, kept_if] : masks) {
    auto mshape = g.Shape(value);
    if (Failed(mshape, &why)) return Reject{absl::StrCat("the mask: ", why)};
    const std::vector<int64_t> ms = std::get<std::vector<int64_t>>(mshape);
    if (ms.size() > score_axes.size()) return Reject{"the mask has more axes than the scores"};
    size_t bad = 0;
    std::optional<std::vector<std::string>> axes = BroadcastAxes(ms, score_axes, score_extents, &bad);
    if (!axes) {
      return Reject{absl::StrCat("the mask's axis ", bad, " (", ms[bad], ") does not broadcast to the scores")};
    }
    const Operand m{value, ms, *axes};
    *inputs += " " + Decl(name, m);
    *add += " + " + Use(name, m);
  }
  return std::nullopt;
}

// The softmax's axis, "n" or causal "n <= m [+ offset]": the first of the
// additive terms that masks every key past the query (ReadCausalMask) makes
// the softmax causal, and goes when it masks nothing else; `notes` say so.
std::string ReadCausality(const Graph& g, int64_t rows, int64_t keys, std::vector<Term>* masks,
                          std::vector<std::string>* notes) {
  for (auto it = masks->begin(); it != masks->end(); ++it) {
    absl::StatusOr<CausalMask> c = g.Causality(it->value, rows, keys, it->kept_if);
    if (c.ok() && !c->evaluated) {
      notes->push_back(absl::StrCat("'", it->value, "' was not checked for causality: ", c->why));
    }
    if (!c.ok() || !c->causal) continue;
    const std::string axis = c->offset == 0 ? "n <= m" : absl::StrCat("n <= m + ", c->offset);
    if (c->whole) {
      // Its note as an additive input, if it had one, goes with it.
      const std::string declared = absl::StrCat(it->name, " is '", it->value, "'");
      notes->erase(std::remove_if(notes->begin(), notes->end(),
                                  [&](const std::string& n) { return n.rfind(declared, 0) == 0; }),
                   notes->end());
      notes->push_back(absl::StrCat("'", it->value, "' is a causal mask and nothing else (evaluated): softmax(", axis,
                                    "), no mask read"));
      masks->erase(it);
    } else {
      notes->push_back(absl::StrCat("'", it->value, "' masks every key past the query (evaluated with the inputs it ",
                                    "reads all ones, and random): softmax(", axis, ") skips those keys; ", it->name,
                                    " is still read for the rest"));
    }
    return axis;
  }
  return "n";
}

// Attention written out, ending in Softmax `s`: Q K' (scaled), plus
// additive terms, softmax over the last axis, times V.
std::variant<Match, Reject> MatchAttention(
    const Graph& g, const onnx::NodeProto& s, int index) {
  std::vector<const onnx::NodeProto*> nodes = {&s};
  std::string why;
  auto scores_shape = g.Shape(s.input(0));
  if (Failed(scores_shape, &why)) return Reject{why};
  const int rank = static_cast<int>(std::get<std::vector<int64_t>>(scores_shape).size());
  if (rank < 2) return Reject{"the scores have fewer than 2 axes"};
  const int64_t axis = AttrInt(s, "axis", -1);
  if (axis != -1 && axis != rank - 1) return Reject{"the softmax is not over the last axis"};
  std::vector<std::string> notes;
  auto found = FindScorePath(g, s, &notes, &nodes);
  if (Failed(found, &why)) return Reject{why};
  ScorePath path = std::get<ScorePath>(found);
  auto pv = FindProbabilityMatMul(g, s, &notes, &nodes);
  if (Failed(pv, &why)) return Reject{why};
  std::vector<std::string> batch;
  for (int i = 0; i + 2 < rank; ++i) batch.push_back(absl::StrCat("b", i));
  auto views = ViewQkv(g, path, *std::get<const onnx::NodeProto*>(pv), batch, &nodes);
  if (Failed(views, &why)) return Reject{why};
  QkvViews qkv = std::get<QkvViews>(views);
  const int64_t heads = qkv.extent.count("b1") > 0 ? qkv.extent["b1"] : 0;
  ReadRepeatedKv(g, rank, &qkv, &batch, &nodes);
  std::string inputs = absl::StrCat(Decl("Q", qkv.q), " ", Decl("K", qkv.k), " ", Decl("V", qkv.v));
  std::string add;
  const std::vector<std::string> score_axes = WithBatch(batch, {"m", "n"});
  std::vector<int64_t> score_extents;
  for (const std::string& dim : score_axes) score_extents.push_back(dim == "g,r" ? heads : qkv.extent.at(dim));
  const std::string softmax_axis = ReadCausality(g, qkv.extent.at("m"), qkv.extent.at("n"), &path.masks, &notes);
  if (auto r = AddScoreTerms(g, path.masks, score_axes, score_extents, &inputs, &add)) return *r;
  std::string dims;
  for (const auto& [name, e] : qkv.extent) absl::StrAppend(&dims, " ", name, "=", e);
  const std::string p = absl::StrJoin(WithBatch(batch, {"m"}), ",");
  const std::string text = absl::StrCat(
      "chain attention_", index, "\ndtype ", DTypeOf(g, path.qk->input(0)), "\ndim", dims, "\nin ", inputs, "\n",
      "S[", p, ",n] = sum(d) ", Use("Q", qkv.q), " * ", Use("K", qkv.k),
      path.scale == 1 ? "" : absl::StrCat(" * ", path.scale), "\n",
      "P[", p, ",n] = softmax(", softmax_axis, ") S[", p, ",n]", add, "\n",
      "O[", p, ",e] = sum(n) P[", p, ",n] * ", Use("V", qkv.v), "\nout O\n");
  return ChainMatch(text, nodes, notes);
}

float AttrFloat(const onnx::NodeProto& n, const std::string& name, float fallback) {
  for (const onnx::AttributeProto& a : n.attribute()) {
    if (a.name() == name) return a.f();
  }
  return fallback;
}

// A single-node attention op as MatchAttentionOp reads it.
struct AttentionOp {
  const onnx::NodeProto* node;
  bool mha;     // com.microsoft's MultiHeadAttention
  bool packed;  // com.microsoft's Attention: Q, K and V projected from one input

  // Input `i`, or "" when the node has fewer.
  std::string Input(int i) const { return node->input_size() > i ? node->input(i) : std::string(); }
};

// Why the chain cannot express what `op` asks for, if it cannot.
std::optional<Reject> UnsupportedAttentionOp(const AttentionOp& op) {
  const onnx::NodeProto& a = *op.node;
  if (op.mha && a.domain() != "com.microsoft") return Reject{absl::StrCat(Label(a), " is not com.microsoft's")};
  if (!op.mha && !op.packed && !a.domain().empty() && a.domain() != "ai.onnx") {
    return Reject{absl::StrCat(Label(a), " is from domain '", a.domain(), "'")};
  }
  if (!op.packed && (op.Input(1).empty() || op.Input(2).empty())) {
    return Reject{"packed Q/K/V (no separate key and value) is not read"};
  }
  for (int i = 1; i < a.output_size(); ++i) {
    if (!a.output(i).empty()) return Reject{"its present key/value or scores outputs are used"};
  }
  const std::vector<int> past =
      op.packed ? std::vector<int>{4, 6} : std::vector<int>{op.mha ? 6 : 4, op.mha ? 7 : 5};
  for (int i : past) {
    if (!op.Input(i).empty()) return Reject{"past key/value (a KV cache) is not read"};
  }
  if (op.mha && !op.Input(3).empty()) return Reject{"its packed projection bias is not folded"};
  if (!op.mha && !op.packed && AttrFloat(a, "softcap", 0) != 0) return Reject{"softcap is not supported"};
  if (op.packed && AttrInt(a, "do_rotary", 0) != 0) return Reject{"its rotary embedding is not read"};
  return std::nullopt;
}

// The shapes of Q, K and V: the inputs', or the parts of the packed
// projection of onnxruntime's Attention ([batch, seq, in] times [in, q +
// k + v]), which `notes` then mentions.
std::variant<std::vector<std::vector<int64_t>>, Reject> QkvShapes(const Graph& g, const AttentionOp& op,
                                                                  std::vector<std::string>* notes) {
  const onnx::NodeProto& a = *op.node;
  std::string why;
  std::vector<std::vector<int64_t>> shapes;
  if (!op.packed) {
    for (int i = 0; i < 3; ++i) {
      auto sh = g.Shape(a.input(i));
      if (Failed(sh, &why)) return Reject{why};
      shapes.push_back(std::get<std::vector<int64_t>>(sh));
      if (shapes.back().size() != 3 && shapes.back().size() != 4) {
        return Reject{absl::StrCat("'", a.input(i), "' is neither 3-D nor 4-D")};
      }
    }
    return shapes;
  }
  auto xs = g.Shape(a.input(0));
  if (Failed(xs, &why)) return Reject{why};
  auto ws = g.Shape(op.Input(1));
  if (Failed(ws, &why)) return Reject{why};
  const std::vector<int64_t> x = std::get<std::vector<int64_t>>(xs), w = std::get<std::vector<int64_t>>(ws);
  if (x.size() != 3 || w.size() != 2 || w[0] != x[2]) return Reject{"the input and the packed weights do not agree"};
  std::vector<int64_t> sizes = AttrInts(a, "qkv_hidden_sizes");
  if (sizes.empty()) sizes.assign(3, w[1] / 3);
  if (sizes.size() != 3 || sizes[0] + sizes[1] + sizes[2] != w[1] || sizes[0] != sizes[1]) {
    return Reject{"the packed weights do not split into Q, K and V of one width"};
  }
  for (int64_t width : sizes) shapes.push_back({x[0], x[1], width});
  notes->push_back(absl::StrCat("Q, K and V are the parts of '", a.input(0), "' projected by '", op.Input(1), "'",
                                op.Input(2).empty() ? "" : absl::StrCat(" plus '", op.Input(2), "'"),
                                ", each [batch, seq, heads * head dim]"));
  return shapes;
}

// The extents of single-node attention: batch B, query heads and K/V
// heads, queries S, keys L, the head dim D of Q and K and Dv of V.
struct AttentionExtents {
  int64_t B = 0, q_heads = 0, kv_heads = 0, S = 0, L = 0, D = 0, Dv = 0;
};

// The head counts (attributes, or the head axis of 4-D inputs) and the
// extents Q, K and V of shapes `shapes` split into with them.
std::variant<AttentionExtents, Reject> ReadHeads(const AttentionOp& op,
                                                 const std::vector<std::vector<int64_t>>& shapes) {
  const onnx::NodeProto& a = *op.node;
  AttentionExtents x;
  x.q_heads = op.mha || op.packed ? AttrInt(a, "num_heads", 0) : AttrInt(a, "q_num_heads", 0);
  x.kv_heads = op.mha || op.packed ? x.q_heads : AttrInt(a, "kv_num_heads", 0);
  if (shapes[0].size() == 4) x.q_heads = shapes[0][1];
  if (shapes[1].size() == 4) x.kv_heads = shapes[1][1];
  if (x.q_heads <= 0 || x.kv_heads <= 0) {
    return Reject{"3-D inputs need the head counts (num_heads, q_num_heads, kv_num_heads)"};
  }
  if (x.q_heads % x.kv_heads != 0) {
    return Reject{absl::StrCat(x.q_heads, " query heads are not a multiple of ", x.kv_heads, " K/V heads")};
  }
  auto split = [&](const std::vector<int64_t>& sh, int64_t heads, int64_t* seq, int64_t* dim) -> bool {
    *seq = sh.size() == 4 ? sh[2] : sh[1];
    if (sh.size() == 4) {
      *dim = sh[3];
      return sh[1] == heads;
    }
    *dim = sh[2] / heads;
    return sh[2] % heads == 0;
  };
  int64_t Dk = 0, Lv = 0;
  if (!split(shapes[0], x.q_heads, &x.S, &x.D) || !split(shapes[1], x.kv_heads, &x.L, &Dk) ||
      !split(shapes[2], x.kv_heads, &Lv, &x.Dv)) {
    return Reject{"Q, K and V do not split into their heads"};
  }
  x.B = shapes[0][0];
  if (shapes[1][0] != x.B || shapes[2][0] != x.B || x.L != Lv || x.D != Dk) {
    return Reject{"Q, K and V disagree on batch, keys or head dim"};
  }
  return x;
}

// Tensor `name` over dims b, `heads`, `pos` and `d`: [b, heads, pos, d]
// when it is 4-D (`shape`), else [b, pos, heads, d] (the bytes of [batch,
// seq, heads * head dim]).
std::string HeadView(const char* name, const std::vector<int64_t>& shape, const std::string& heads, const char* pos,
                     const char* d) {
  return shape.size() == 4 ? absl::StrCat(name, "[b,", heads, ",", pos, ",", d, "]")
                           : absl::StrCat(name, "[b,", pos, ",", heads, ",", d, "]");
}

// The pieces of single-node attention's chain text: the inputs'
// declarations, the terms added to the scores, and notes on what the
// chain assumes of its inputs.
struct ChainPieces {
  std::string inputs, add;
  std::string axis = "n";  // the softmax's, causal or not
  std::vector<std::string> notes;
};

// Declares `value`, an additive mask broadcast to [b, query head `qh`, m,
// n], as input `name` and adds it to the scores.
std::optional<Reject> AddBroadcastMask(const Graph& g, const std::string& value, const char* name,
                                       const AttentionExtents& x, const std::string& qh, ChainPieces* pieces) {
  std::string why;
  auto sh = g.Shape(value);
  if (Failed(sh, &why)) return Reject{absl::StrCat("the mask: ", why)};
  const std::vector<int64_t> ms = std::get<std::vector<int64_t>>(sh);
  if (ElemType(g, value) == onnx::TensorProto::BOOL) {
    return Reject{absl::StrCat("'", value, "' is a boolean mask; only additive ones are read")};
  }
  if (ms.size() > 4) return Reject{absl::StrCat("'", value, "' has more than 4 axes")};
  size_t bad = 0;
  std::optional<std::vector<std::string>> axes =
      BroadcastAxes(ms, {"b", qh, "m", "n"}, {x.B, x.q_heads, x.S, x.L}, &bad);
  if (!axes) {
    return Reject{absl::StrCat("'", value, "' axis ", bad, " (", ms[bad], ") does not broadcast to the scores")};
  }
  const Operand m{value, ms, *axes};
  absl::StrAppend(&pieces->inputs, " ", Decl(name, m));
  absl::StrAppend(&pieces->add, " + ", Use(name, m));
  return std::nullopt;
}

// Declares onnxruntime Attention's mask_index `value` (key lengths, or a
// 0/1 mask over keys or over queries and keys) as the additive mask M it
// becomes and adds it to the scores.
std::optional<Reject> AddMaskIndex(const Graph& g, const std::string& value, const AttentionExtents& x,
                                   ChainPieces* pieces) {
  std::string why;
  auto sh = g.Shape(value);
  if (Failed(sh, &why)) return Reject{absl::StrCat("the mask index: ", why)};
  const std::vector<int64_t> ms = std::get<std::vector<int64_t>>(sh);
  if (ms == std::vector<int64_t>{x.B} || ms == std::vector<int64_t>{x.B, x.L}) {
    absl::StrAppend(&pieces->inputs, " M[b,n]");
    absl::StrAppend(&pieces->add, " + M[b,n]");
    pieces->notes.push_back(absl::StrCat("M is '", value, "' as an additive mask over keys (0 or mask_filter_value)",
                                         ms.size() == 1 ? ", from each row's key length" : ""));
  } else if (ms == std::vector<int64_t>{x.B, x.S, x.L}) {
    absl::StrAppend(&pieces->inputs, " M[b,m,n]");
    absl::StrAppend(&pieces->add, " + M[b,m,n]");
    pieces->notes.push_back(absl::StrCat("M is '", value, "' as an additive mask (0 or mask_filter_value)"));
  } else {
    return Reject{"only a mask index of key lengths [batch] or a mask [batch, keys] or [batch, queries, keys] is read"};
  }
  return std::nullopt;
}

// Declares MultiHeadAttention's key_padding_mask `value` as the additive
// mask M over [batch, keys] it becomes and adds it to the scores.
std::optional<Reject> AddKeyPaddingMask(const Graph& g, const std::string& value, const AttentionExtents& x,
                                        ChainPieces* pieces) {
  std::string why;
  auto sh = g.Shape(value);
  if (Failed(sh, &why)) return Reject{absl::StrCat("the key padding mask: ", why)};
  if (std::get<std::vector<int64_t>>(sh) != std::vector<int64_t>{x.B, x.L}) {
    return Reject{"only a 2-D [batch, keys] key_padding_mask is read"};
  }
  absl::StrAppend(&pieces->inputs, " M[b,n]");
  absl::StrAppend(&pieces->add, " + M[b,n]");
  pieces->notes.push_back(absl::StrCat("M is '", value, "' as an additive mask (0 or mask_filter_value)"));
  return std::nullopt;
}

// Every mask `op` applies, as additive inputs of the chain (query heads
// `qh`), and causal attention as the additive input C[m, n].
std::optional<Reject> AddAttentionOpMasks(const Graph& g, const AttentionOp& op, const AttentionExtents& x,
                                          const std::string& qh, ChainPieces* pieces) {
  if (op.packed && !op.Input(3).empty()) {
    if (auto r = AddMaskIndex(g, op.Input(3), x, pieces)) return *r;
  }
  if (op.packed && !op.Input(5).empty()) {
    if (auto r = AddBroadcastMask(g, op.Input(5), "A", x, qh, pieces)) return *r;
  }
  if (op.mha) {
    if (!op.Input(4).empty()) {
      if (auto r = AddKeyPaddingMask(g, op.Input(4), x, pieces)) return *r;
    }
    if (!op.Input(5).empty()) {
      if (auto r = AddBroadcastMask(g, op.Input(5), "A", x, qh, pieces)) return *r;
    }
  } else if (!op.packed && !op.Input(3).empty()) {
    if (auto r = AddBroadcastMask(g, op.Input(3), "M", x, qh, pieces)) return *r;
  }
  if (AttrInt(*op.node, op.mha || op.packed ? "unidirectional" : "is_causal", 0) != 0) {
    // As many queries as keys: ONNX's (upper left) and onnxruntime's (lower
    // right) causal masks are both n <= m.
    if (x.S == x.L) {
      pieces->axis = "n <= m";
    } else {
      absl::StrAppend(&pieces->inputs, " C[m,n]");
      absl::StrAppend(&pieces->add, " + C[m,n]");
      pieces->notes.push_back("C is the causal mask, additive (0 or -inf): the queries are not as many as the keys");
    }
  }
  return std::nullopt;
}

// The single-node attention ops: ONNX's Attention (opset 23; grouped-query
// when kv_num_heads < q_num_heads), onnxruntime's MultiHeadAttention and
// its Attention (com.microsoft). Q, K and V are 4-D [batch, heads, seq,
// head dim] or 3-D [batch, seq, heads * head dim]; a grouped query head
// g * r_count + r reads K/V head g. onnxruntime's Attention projects its
// input by one packed weight into Q, K and V: the chain is the attention
// after that projection, its Q, K and V the projection's parts (the source
// line says so). Masks: an additive float attn_mask or attention_bias
// broadcast to [batch, heads, queries, keys], MultiHeadAttention's 2-D
// key_padding_mask and Attention's mask_index (key lengths, or a 0/1 mask
// over keys or over queries and keys), each as the additive mask it
// becomes, and causal attention (is_causal, unidirectional) as an additive
// [queries, keys] input.
std::variant<Match, Reject> MatchAttentionOp(const Graph& g, const onnx::NodeProto& a, int index) {
  const AttentionOp op{&a, a.op_type() == "MultiHeadAttention",
                       a.op_type() == "Attention" && a.domain() == "com.microsoft"};
  if (auto r = UnsupportedAttentionOp(op)) return *r;
  std::string why;
  ChainPieces pieces;
  auto qkv = QkvShapes(g, op, &pieces.notes);
  if (Failed(qkv, &why)) return Reject{why};
  const std::vector<std::vector<int64_t>> shapes = std::get<std::vector<std::vector<int64_t>>>(qkv);
  auto extents = ReadHeads(op, shapes);
  if (Failed(extents, &why)) return Reject{why};
  const AttentionExtents x = std::get<AttentionExtents>(extents);
  const bool grouped = x.kv_heads != x.q_heads;
  // Heads split as g (K/V head) and r (query head within its group) when
  // grouped: [batch, seq, heads * dim] is viewed as [b, m, g, r, d], the
  // same bytes.
  const std::string qh = grouped ? "g,r" : "h", kvh = grouped ? "g" : "h";
  const std::string point = absl::StrCat("b,", qh, ",m");
  pieces.inputs = absl::StrCat(HeadView("Q", shapes[0], qh, "m", "d"), " ", HeadView("K", shapes[1], kvh, "n", "d"),
                               " ", HeadView("V", shapes[2], kvh, "n", "e"));
  if (auto r = AddAttentionOpMasks(g, op, x, qh, &pieces)) return *r;
  const double scale =
      AttrFloat(a, "scale", 0) != 0 ? AttrFloat(a, "scale", 0) : 1 / std::sqrt(static_cast<double>(x.D));
  // The output: [b, heads, m, e] when Q is 4-D, else [b, m, heads, e] (the
  // bytes of [batch, seq, heads * head dim]).
  const std::string out = shapes[0].size() == 4 ? absl::StrCat(point, ",e") : absl::StrCat("b,m,", qh, ",e");
  const std::string text = absl::StrCat(
      "chain attention_", index, "\ndtype ", DTypeOf(g, a.input(0)), "\ndim b=", x.B,
      grouped ? absl::StrCat(" g=", x.kv_heads, " r=", x.q_heads / x.kv_heads) : absl::StrCat(" h=", x.q_heads),
      " m=", x.S, " n=", x.L, " d=", x.D, " e=", x.Dv, "\nin ", pieces.inputs, "\n",
      "S[", point, ",n] = sum(d) ", HeadView("Q", shapes[0], qh, "m", "d"), " * ",
      HeadView("K", shapes[1], kvh, "n", "d"), " * ", scale, "\n",
      "P[", point, ",n] = softmax(", pieces.axis, ") S[", point, ",n]", pieces.add, "\n",
      "O[", out, "] = sum(n) P[", point, ",n] * ", HeadView("V", shapes[2], kvh, "n", "e"), "\nout O\n");
  return ChainMatch(text, {&a}, pieces.notes);
}

bool IsGemm(const onnx::NodeProto* n) { return n != nullptr && (n->op_type() == "MatMul" || n->op_type() == "Gemm"); }

// A bias Add after `t` (the other operand a vector of `width`), or null.
const onnx::NodeProto* BiasAdd(const Graph& g, const std::string& t, int64_t width, std::string* bias) {
  const onnx::NodeProto* a = g.SoleConsumer(t);
  if (a == nullptr || a->op_type() != "Add") return nullptr;
  const std::string other = a->input(0) == t ? a->input(1) : a->input(0);
  auto shape = g.Shape(other);
  if (!std::holds_alternative<std::vector<int64_t>>(shape) ||
      std::get<std::vector<int64_t>>(shape) != std::vector<int64_t>{width}) {
    return nullptr;
  }
  *bias = other;
  return a;
}

// The end of GELU written out from `x` once `one` (the Add of 1 to erf or
// tanh) is found: times x and times 0.5, in the orders exporters emit; the
// output, or "".
std::string HalfXTimes(const Graph& g, const std::string& x, const onnx::NodeProto& one,
                       std::vector<const onnx::NodeProto*>* found) {
  const onnx::NodeProto* m = g.SoleConsumer(one.output(0));
  if (m == nullptr || m->op_type() != "Mul") return "";
  found->push_back(m);
  const std::string other = m->input(0) == one.output(0) ? m->input(1) : m->input(0);
  if (other == x) {  // x * (1 + f) then * 0.5
    const onnx::NodeProto* half = g.SoleConsumer(m->output(0));
    if (half == nullptr || half->op_type() != "Mul" || !g.IsScalar(half->input(1), 0.5)) return "";
    found->push_back(half);
    return half->output(0);
  }
  if (const onnx::NodeProto* h = g.Producer(other);
      h != nullptr && h->op_type() == "Mul" && h->input(0) == x && g.IsScalar(h->input(1), 0.5)) {
    found->push_back(h);  // (x * 0.5) * (1 + f)
    return m->output(0);
  }
  if (const onnx::NodeProto* outer = g.SoleConsumer(m->output(0));
      g.IsScalar(other, 0.5) && outer != nullptr && outer->op_type() == "Mul" &&
      (outer->input(0) == x || outer->input(1) == x)) {
    found->push_back(outer);  // x * (0.5 * (1 + f)), as the dynamo exporter writes it
    return outer->output(0);
  }
  return "";
}

// The Add of 1 reading `t`, or null.
const onnx::NodeProto* PlusOne(const Graph& g, const std::string& t) {
  const onnx::NodeProto* one = g.SoleConsumer(t);
  if (one == nullptr || one->op_type() != "Add" || !g.IsScalar(one->input(0) == t ? one->input(1) : one->input(0), 1)) {
    return nullptr;
  }
  return one;
}

// GELU written out from `x`: with Erf, x * 0.5 * (1 + erf(x / sqrt 2)), or
// with Tanh (GPT-2's approximation), x * 0.5 * (1 + tanh(sqrt(2 / pi) *
// (x + 0.044715 * x^3))). Its function in the chain language ("gelu" or
// "gelu_tanh") and its output; the nodes go to `nodes`. {"", ""} if none.
std::pair<std::string, std::string> WrittenOutGelu(const Graph& g, const std::string& x,
                                                   std::vector<const onnx::NodeProto*>* nodes) {
  auto is = [&](const onnx::NodeProto* n, const char* op) { return n != nullptr && n->op_type() == op; };
  for (const onnx::NodeProto* first : g.Consumers(x)) {
    std::vector<const onnx::NodeProto*> found = {first};
    const onnx::NodeProto* one = nullptr;
    std::string func;
    if ((is(first, "Div") && g.IsScalar(first->input(1), std::sqrt(2.0))) ||
        (is(first, "Mul") && g.IsScalar(first->input(1), 1 / std::sqrt(2.0)))) {
      const onnx::NodeProto* erf = g.SoleConsumer(first->output(0));
      if (!is(erf, "Erf") || (one = PlusOne(g, erf->output(0))) == nullptr) continue;
      found.insert(found.end(), {erf, one});
      func = "gelu";
    } else if (is(first, "Pow") && g.IsScalar(first->input(1), 3)) {
      const onnx::NodeProto* cube = g.SoleConsumer(first->output(0));
      if (!is(cube, "Mul") || !g.IsScalar(cube->input(0) == first->output(0) ? cube->input(1) : cube->input(0), 0.044715)) {
        continue;
      }
      const onnx::NodeProto* sum = g.SoleConsumer(cube->output(0));
      if (!is(sum, "Add") || (sum->input(0) != x && sum->input(1) != x)) continue;
      const onnx::NodeProto* scaled = g.SoleConsumer(sum->output(0));
      if (!is(scaled, "Mul") ||
          !g.IsScalar(scaled->input(0) == sum->output(0) ? scaled->input(1) : scaled->input(0), 0.7978845608028654)) {
        continue;
      }
      const onnx::NodeProto* tanh = g.SoleConsumer(scaled->output(0));
      if (!is(tanh, "Tanh") || (one = PlusOne(g, tanh->output(0))) == nullptr) continue;
      found.insert(found.end(), {cube, sum, scaled, tanh, one});
      func = "gelu_tanh";
    } else {
      continue;
    }
    if (std::string out = HalfXTimes(g, x, *one, &found); !out.empty()) {
      nodes->insert(nodes->end(), found.begin(), found.end());
      return {func, out};
    }
  }
  return {"", ""};
}

std::string AttrString(const onnx::NodeProto& n, const std::string& name, const std::string& fallback) {
  for (const onnx::AttributeProto& a : n.attribute()) {
    if (a.name() == name) return a.s();
  }
  return fallback;
}

// The activation applied to `t`: Relu; Gelu (ONNX's, approximate "none" or
// "tanh", or onnxruntime's); onnxruntime's BiasGelu (erf) and FastGelu
// (tanh), which may add a bias first; GELU written out.
struct Activation {
  std::string func;  // in the chain language
  std::string out;
  std::string bias;  // the bias BiasGelu or FastGelu adds, if any
  std::vector<const onnx::NodeProto*> nodes;
};

std::optional<Activation> FindActivation(const Graph& g, const std::string& t) {
  Activation a;
  if (const onnx::NodeProto* n = g.SoleConsumer(t); n != nullptr && n->input(0) == t) {
    const std::string& op = n->op_type();
    const bool ms = n->domain() == "com.microsoft";
    if (op == "Relu") a.func = "relu";
    if (op == "Gelu") a.func = AttrString(*n, "approximate", "none") == "tanh" ? "gelu_tanh" : "gelu";
    if (ms && op == "BiasGelu") a.func = "gelu";
    if (ms && op == "FastGelu") a.func = "gelu_tanh";
    if (!a.func.empty()) {
      if ((op == "BiasGelu" || op == "FastGelu") && n->input_size() > 1) a.bias = n->input(1);
      a.out = n->output(0);
      a.nodes = {n};
      return a;
    }
  }
  std::tie(a.func, a.out) = WrittenOutGelu(g, t, &a.nodes);
  if (a.func.empty()) return std::nullopt;
  return a;
}

// A Reshape producing `t` [p, k] from [r0, .., k] (rows merged, as
// GPT-2's Conv1D does around its Gemm): that node, or null.
const onnx::NodeProto* MergingRows(const Graph& g, const std::string& t) {
  const onnx::NodeProto* r = g.Producer(t);
  if (r == nullptr || r->op_type() != "Reshape") return nullptr;
  const std::vector<int64_t> from = g.KnownShape(r->input(0)), to = g.KnownShape(t);
  if (from.size() < 3 || to.size() != 2 || from.back() != to.back()) return nullptr;
  return r;
}

// The Reshape reading `t` [p, k] that splits its rows back to `rows` (p
// their product): that node, or null.
const onnx::NodeProto* SplittingRows(const Graph& g, const std::string& t, const std::vector<int64_t>& rows) {
  const onnx::NodeProto* r = g.SoleConsumer(t);
  if (r == nullptr || r->op_type() != "Reshape" || r->input(0) != t) return nullptr;
  const std::vector<int64_t> in = g.KnownShape(t);
  if (in.empty()) return nullptr;
  std::vector<int64_t> want = rows;
  want.push_back(in.back());
  return g.KnownShape(r->output(0)) == want ? r : nullptr;
}

// GEMM -> [bias] -> activation -> GEMM -> [bias] starting at `first`. A
// Gemm's bias may be its C input; rows merged by a Reshape around each GEMM
// (GPT-2's Conv1D) are read as the activation's rows.
// `split_rows`: look through a Reshape merging the rows before the first
// GEMM; without a Reshape splitting them back, the chain is read on the
// merged 2-D rows instead.
std::variant<Match, Reject> MatchGemmChain(const Graph& g, const onnx::NodeProto& first, int index,
                                           bool split_rows = true) {
  {  // Only a GEMM an activation follows (past a bias Add and a row split) is a candidate.
    bool any = false;
    std::string t = first.output(0);
    for (int step = 0; step < 3 && !any; ++step) {
      any = FindActivation(g, t).has_value();
      const onnx::NodeProto* n = g.SoleConsumer(t);
      if (n == nullptr || (n->op_type() != "Add" && n->op_type() != "Reshape")) break;
      t = n->output(0);
    }
    if (!any) return Reject{};
  }
  std::vector<const onnx::NodeProto*> nodes;
  std::string why;
  // B of `n` viewed as [k, col] (Gemm's transB read as the transpose);
  // c_bias: its C input as a bias of `width` into `*bias`.
  auto weight = [&](const onnx::NodeProto& n, const std::string& k,
                    const std::string& col) -> std::variant<Operand, Reject> {
    std::vector<std::string> bn = {k, col};
    if (n.op_type() == "Gemm") {
      if (AttrInt(n, "transA", 0) != 0) return Reject{absl::StrCat(Label(n), " transposes A")};
      if (AttrFloat(n, "alpha", 1) != 1) return Reject{absl::StrCat(Label(n), " scales A*B (alpha)")};
      if (AttrInt(n, "transB", 0) != 0) bn = {col, k};
    }
    auto shape = g.Shape(n.input(1));
    if (Failed(shape, &why)) return Reject{why};
    if (std::get<std::vector<int64_t>>(shape).size() != 2) return Reject{absl::StrCat(Label(n), ": B is not a matrix")};
    return Operand{n.input(1), std::get<std::vector<int64_t>>(shape), bn};
  };
  auto c_bias = [&](const onnx::NodeProto& n, int64_t width, std::string* bias) -> std::optional<Reject> {
    if (n.op_type() != "Gemm" || n.input_size() < 3 || n.input(2).empty()) return std::nullopt;
    auto shape = g.Shape(n.input(2));
    if (Failed(shape, &why)) return Reject{why};
    const auto& sh = std::get<std::vector<int64_t>>(shape);
    if (AttrFloat(n, "beta", 1) != 1 || (sh != std::vector<int64_t>{width} && sh != std::vector<int64_t>{1, width})) {
      return Reject{absl::StrCat(Label(n), " adds a C that is not a bias of its columns")};
    }
    *bias = n.input(2);
    return std::nullopt;
  };
  // X: the first GEMM's A, or what a Reshape merged into its rows.
  nodes.push_back(&first);
  std::string x = first.input(0);
  const onnx::NodeProto* merge = split_rows ? MergingRows(g, x) : nullptr;
  if (merge != nullptr) {
    nodes.push_back(merge);
    x = merge->input(0);
  }
  auto in_shape = g.Shape(x);
  if (Failed(in_shape, &why)) return Reject{why};
  const std::vector<int64_t> x_shape = std::get<std::vector<int64_t>>(in_shape);
  if (x_shape.size() < 2) return Reject{"the input is not a matrix"};
  const std::vector<int64_t> row_shape(x_shape.begin(), x_shape.end() - 1);
  std::vector<std::string> rows;
  for (size_t i = 0; i + 1 < x_shape.size(); ++i) rows.push_back(absl::StrCat("a", i));
  std::vector<std::string> x_names = rows;
  x_names.push_back("c");
  auto X = merge != nullptr ? std::variant<Operand, Reject>(Operand{x, x_shape, x_names}) : View(g, x, x_names, &nodes);
  if (Failed(X, &why)) return Reject{why};
  auto W1 = weight(first, "c", "f");
  if (Failed(W1, &why)) return Reject{why};
  const Operand& w1 = std::get<Operand>(W1);
  const int64_t f = w1.shape[w1.axes[0] == "f" ? 0 : 1];
  // Past a GEMM's output `t`: its bias Add (unless `*bias` is set) and the
  // rows split back, in either order.
  auto past_gemm = [&](std::string t, int64_t width, std::string* bias) {
    for (int step = 0; step < 2; ++step) {
      if (const onnx::NodeProto* a = bias->empty() ? BiasAdd(g, t, width, bias) : nullptr) {
        nodes.push_back(a);
        t = a->output(0);
      }
      if (const onnx::NodeProto* r = merge != nullptr ? SplittingRows(g, t, row_shape) : nullptr) {
        nodes.push_back(r);
        t = r->output(0);
      }
    }
    return t;
  };
  std::string bias1, bias2;
  if (auto r = c_bias(first, f, &bias1)) return *r;
  std::string cur = past_gemm(first.output(0), f, &bias1);
  if (merge != nullptr && g.KnownShape(cur).size() != x_shape.size()) return MatchGemmChain(g, first, index, false);
  auto act = FindActivation(g, cur);
  if (!act) return Reject{"the activation does not follow the GEMM's bias"};
  if (!act->bias.empty()) {
    if (!bias1.empty()) return Reject{absl::StrCat(Label(*act->nodes[0]), " adds a second bias")};
    if (g.KnownShape(act->bias) != std::vector<int64_t>{f}) {
      return Reject{absl::StrCat(Label(*act->nodes[0]), "'s bias is not a vector of ", f)};
    }
    bias1 = act->bias;
  }
  nodes.insert(nodes.end(), act->nodes.begin(), act->nodes.end());
  cur = act->out;
  const onnx::NodeProto* second = g.SoleConsumer(cur);
  if (merge != nullptr && second != nullptr && second->op_type() == "Reshape" && MergingRows(g, second->output(0))) {
    nodes.push_back(second);
    cur = second->output(0);
    second = g.SoleConsumer(cur);
  }
  if (!IsGemm(second) || second->input(0) != cur) return Reject{"the activation does not feed one MatMul or Gemm"};
  nodes.push_back(second);
  auto W2 = weight(*second, "f", "o");
  if (Failed(W2, &why)) return Reject{why};
  const Operand& w2 = std::get<Operand>(W2);
  const int64_t o = w2.shape[w2.axes[0] == "o" ? 0 : 1];
  if (auto r = c_bias(*second, o, &bias2)) return *r;
  const std::string out = past_gemm(second->output(0), o, &bias2);
  std::string note;
  if (const onnx::NodeProto* skip = g.SoleConsumer(out); bias2.empty() && skip != nullptr &&
      skip->op_type() == "SkipLayerNormalization" && skip->input_size() > 4 && !skip->input(4).empty()) {
    note = absl::StrCat("the second bias, '", skip->input(4), "', is added by ", Label(*skip), " after the chain");
  }
  const Operand& x_op = std::get<Operand>(X);
  std::map<std::string, int64_t> extent;
  for (size_t i = 0; i < x_op.axes.size(); ++i) extent[x_op.axes[i]] = x_op.shape[i];
  extent["f"] = f;
  extent["o"] = o;
  std::string dims;
  for (const auto& [name, e] : extent) absl::StrAppend(&dims, " ", name, "=", e);
  const std::string r = absl::StrJoin(rows, ",");
  std::string inputs = absl::StrCat(Decl("X", x_op), " ", Decl("W1", w1), " ", Decl("W2", w2));
  if (!bias1.empty()) inputs += " B1[f]";
  if (!bias2.empty()) inputs += " B2[o]";
  std::string text = absl::StrCat("chain gemm_chain_", index, "\ndtype ", DTypeOf(g, first.input(0)), "\ndim", dims,
                                  "\nin ", inputs, "\n", "H[", r, ",f] = sum(c) ", Use("X", x_op), " * ", Use("W1", w1),
                                  "\n", "A[", r, ",f] = ", act->func, "(H[", r, ",f]", bias1.empty() ? "" : " + B1[f]",
                                  ")\n", "Y[", r, ",o] = sum(f) A[", r, ",f] * ", Use("W2", w2), "\n");
  text += bias2.empty() ? "out Y\n" : absl::StrCat("Z[", r, ",o] = Y[", r, ",o] + B2[o]\nout Z\n");
  auto chain = ir::ParseChainText(text);
  if (!chain.ok()) return Reject{std::string(chain.status().message())};
  MarkConstants(g, *chain, {{"W1", w1.value}, {"W2", w2.value}, {"B1", bias1}, {"B2", bias2}});
  return Match{std::move(*chain), nodes, note};
}

// A gated FFN (SwiGLU, as LLaMA's MLP): MatMul(X, WG) -> SiLU written as
// G * Sigmoid(G) -> times MatMul(X, WU) -> MatMul(., WD), from the gate's
// MatMul `gate`.
std::variant<Match, Reject> MatchGatedFfn(const Graph& g, const onnx::NodeProto& gate, int index) {
  const std::string gated = gate.output(0);
  const std::vector<const onnx::NodeProto*> readers = g.Consumers(gated);
  if (gate.op_type() != "MatMul" || readers.size() != 2) return Reject{};
  const onnx::NodeProto* sigmoid = readers[0]->op_type() == "Sigmoid" ? readers[0] : readers[1];
  const onnx::NodeProto* silu = readers[0] == sigmoid ? readers[1] : readers[0];
  if (sigmoid->op_type() != "Sigmoid" || silu->op_type() != "Mul" ||
      !((silu->input(0) == gated && silu->input(1) == sigmoid->output(0)) ||
        (silu->input(1) == gated && silu->input(0) == sigmoid->output(0)))) {
    return Reject{};
  }
  const onnx::NodeProto* times = g.SoleConsumer(silu->output(0));
  if (times == nullptr || times->op_type() != "Mul") return Reject{"the SiLU is not multiplied by an up projection"};
  const std::string up_value = times->input(0) == silu->output(0) ? times->input(1) : times->input(0);
  const onnx::NodeProto* up = g.Producer(up_value);
  if (up == nullptr || up->op_type() != "MatMul" || up->input(0) != gate.input(0) || g.SoleConsumer(up_value) != times) {
    return Reject{"the SiLU is not multiplied by a MatMul of the gate's input"};
  }
  const onnx::NodeProto* down = g.SoleConsumer(times->output(0));
  if (down == nullptr || down->op_type() != "MatMul" || down->input(0) != times->output(0)) {
    return Reject{"the gated product does not feed one MatMul"};
  }
  std::string why;
  std::vector<const onnx::NodeProto*> nodes = {&gate, sigmoid, silu, up, times, down};
  auto xs = g.Shape(gate.input(0));
  if (Failed(xs, &why)) return Reject{why};
  const std::vector<int64_t> x = std::get<std::vector<int64_t>>(xs);
  if (x.size() < 2) return Reject{"the input is not a matrix"};
  std::vector<int64_t> w[3];
  const onnx::NodeProto* gemms[3] = {&gate, up, down};
  for (int i = 0; i < 3; ++i) {
    auto ws = g.Shape(gemms[i]->input(1));
    if (Failed(ws, &why)) return Reject{why};
    w[i] = std::get<std::vector<int64_t>>(ws);
    if (w[i].size() != 2) return Reject{absl::StrCat(Label(*gemms[i]), ": B is not a matrix")};
  }
  if (w[0][0] != x.back() || w[1] != w[0] || w[2][0] != w[0][1]) return Reject{"the projections' shapes disagree"};
  std::vector<std::string> rows;
  std::string dims;
  for (size_t i = 0; i + 1 < x.size(); ++i) {
    rows.push_back(absl::StrCat("a", i));
    absl::StrAppend(&dims, " a", i, "=", x[i]);
  }
  const std::string r = absl::StrJoin(rows, ",");
  const std::string text = absl::StrCat(
      "chain gemm_chain_", index, "\ndtype ", DTypeOf(g, gate.input(0)), "\ndim", dims, " c=", x.back(), " f=", w[0][1],
      " o=", w[2][1], "\nin X[", r, ",c] WG[c,f] WU[c,f] WD[f,o]\n",
      "G[", r, ",f] = sum(c) X[", r, ",c] * WG[c,f]\n",
      "U[", r, ",f] = sum(c) X[", r, ",c] * WU[c,f]\n",
      "A[", r, ",f] = G[", r, ",f] * sigmoid(G[", r, ",f]) * U[", r, ",f]\n",
      "Y[", r, ",o] = sum(f) A[", r, ",f] * WD[f,o]\nout Y\n");
  auto chain = ir::ParseChainText(text);
  if (!chain.ok()) return Reject{std::string(chain.status().message())};
  MarkConstants(g, *chain, {{"WG", gate.input(1)}, {"WU", up->input(1)}, {"WD", down->input(1)}});
  return Match{std::move(*chain), nodes, ""};
}

// Conv -> [Relu] -> 1x1 Conv starting at `first` (2-D convolutions, one
// group). The chain's indices cannot express a padded border, so a padded
// first convolution reads its input zero-padded ahead of the kernel (the
// chain's X is the padded tensor; the source says so); the 1x1 must not pad.
std::variant<Match, Reject> MatchConvChain(const Graph& g, const onnx::NodeProto& first, int index) {
  std::vector<const onnx::NodeProto*> nodes = {&first};
  std::string cur = first.output(0);
  const onnx::NodeProto* relu = g.SoleConsumer(cur);
  if (relu != nullptr && relu->op_type() == "Relu") {
    nodes.push_back(relu);
    cur = relu->output(0);
  } else {
    relu = nullptr;
  }
  const onnx::NodeProto* second = g.SoleConsumer(cur);
  if (second == nullptr || second->op_type() != "Conv" || second->input(0) != cur) return Reject{};  // no candidate
  nodes.push_back(second);
  std::string why;
  struct ConvAttrs {
    int64_t stride = 1, dilation = 1;
    std::vector<int64_t> pads = {0, 0, 0, 0};  // ONNX order: y begin, x begin, y end, x end
  };
  auto attrs = [&](const onnx::NodeProto& n) -> std::variant<ConvAttrs, Reject> {
    if (AttrInt(n, "group", 1) != 1) return Reject{absl::StrCat(Label(n), " is a grouped convolution")};
    ConvAttrs a;
    const std::vector<int64_t> pads = AttrInts(n, "pads");
    if (!pads.empty()) {
      if (pads.size() != 4) return Reject{absl::StrCat(Label(n), " has ", pads.size(), " pads, not 4 (2-D)")};
      for (int64_t p : pads) {
        if (p < 0) return Reject{absl::StrCat(Label(n), " has a negative pad")};
      }
      a.pads = pads;
    }
    for (const onnx::AttributeProto& at : n.attribute()) {
      if (at.name() == "auto_pad" && at.s() != "NOTSET" && at.s() != "VALID") {
        return Reject{absl::StrCat(Label(n), " pads with auto_pad ", at.s(), "; export with explicit pads")};
      }
    }
    const std::vector<int64_t> strides = AttrInts(n, "strides"), dilations = AttrInts(n, "dilations");
    a.stride = strides.empty() ? 1 : strides[0];
    a.dilation = dilations.empty() ? 1 : dilations[0];
    if ((strides.size() == 2 && strides[1] != a.stride) || (dilations.size() == 2 && dilations[1] != a.dilation)) {
      return Reject{absl::StrCat(Label(n), " has different strides or dilations per axis")};
    }
    if (a.stride < 1 || a.dilation < 1) return Reject{absl::StrCat(Label(n), " has a stride or dilation below 1")};
    return a;
  };
  auto a1 = attrs(first);
  if (Failed(a1, &why)) return Reject{why};
  auto a2 = attrs(*second);
  if (Failed(a2, &why)) return Reject{why};
  const ConvAttrs& c1 = std::get<ConvAttrs>(a1);
  const ConvAttrs& c2 = std::get<ConvAttrs>(a2);
  const int64_t stride = c1.stride, dilation = c1.dilation;
  if (c2.stride != 1 || c2.dilation != 1 || c2.pads != std::vector<int64_t>{0, 0, 0, 0}) {
    return Reject{absl::StrCat(Label(*second), " is not an unpadded 1x1 convolution of stride 1")};
  }
  auto shape = [&](const std::string& t) -> std::variant<std::vector<int64_t>, Reject> {
    auto s = g.Shape(t);
    if (Failed(s, &why)) return Reject{why};
    if (std::get<std::vector<int64_t>>(s).size() != 4) return Reject{absl::StrCat("'", t, "' is not 4-D (NCHW)")};
    return s;
  };
  auto xs = shape(first.input(0));
  auto w1s = shape(first.input(1));
  auto ts = shape(first.output(0));
  auto w2s = shape(second->input(1));
  for (const auto* v : {&xs, &w1s, &ts, &w2s}) {
    if (Failed(*v, &why)) return Reject{why};
  }
  const std::vector<int64_t>& X = std::get<std::vector<int64_t>>(xs);
  const std::vector<int64_t>& W1 = std::get<std::vector<int64_t>>(w1s);
  const std::vector<int64_t>& T = std::get<std::vector<int64_t>>(ts);
  const std::vector<int64_t>& W2 = std::get<std::vector<int64_t>>(w2s);
  if (W2[2] != 1 || W2[3] != 1) return Reject{absl::StrCat(Label(*second), " is not a 1x1 convolution")};
  const bool bias1 = first.input_size() > 2 && !first.input(2).empty();
  const bool bias2 = second->input_size() > 2 && !second->input(2).empty();
  auto at = [&](const char* out, const char* k) {
    return absl::StrCat(out, stride == 1 ? "" : absl::StrCat("*", stride), "+", k,
                        dilation == 1 ? "" : absl::StrCat("*", dilation));
  };
  const std::vector<int64_t>& pad = c1.pads;
  const bool padded = pad != std::vector<int64_t>{0, 0, 0, 0};
  std::string text = absl::StrCat(
      "chain conv_chain_", index, padded ? "_padded" : "", "\ndtype ", DTypeOf(g, first.input(0)), "\ndim n=", X[0],
      " c=", X[1], " y=", X[2] + pad[0] + pad[2], " x=", X[3] + pad[1] + pad[3], " k=", W1[0], " r=", W1[2], " s=", W1[3], " p=", T[2], " q=", T[3], " j=", W2[0],
      "\nin X[n,c,y,x] W1[k,c,r,s] W2[j,k,1,1]", bias1 ? " B1[k]" : "", bias2 ? " B2[j]" : "", "\n",
      "T[n,k,p,q] = sum(c,r,s) X[n,c,", at("p", "r"), ",", at("q", "s"), "] * W1[k,c,r,s]\n");
  std::string u = "T";
  if (relu != nullptr || bias1) {
    const std::string in = bias1 ? "T[n,k,p,q] + B1[k]" : "T[n,k,p,q]";
    absl::StrAppend(&text, "U[n,k,p,q] = ", relu != nullptr ? absl::StrCat("relu(", in, ")") : in, "\n");
    u = "U";
  }
  absl::StrAppend(&text, "O[n,j,p,q] = sum(k) ", u, "[n,k,p,q] * W2[j,k,0,0]\n");
  absl::StrAppend(&text, bias2 ? "Z[n,j,p,q] = O[n,j,p,q] + B2[j]\nout Z\n" : "out O\n");
  auto chain = ir::ParseChainText(text);
  if (!chain.ok()) return Reject{std::string(chain.status().message())};
  MarkConstants(g, *chain, {{"W1", first.input(1)}, {"W2", second->input(1)},
                            {"B1", bias1 ? first.input(2) : ""}, {"B2", bias2 ? second->input(2) : ""}});
  std::string note;
  if (padded) {
    note = absl::StrCat("X is '", first.input(0), "' zero-padded ahead of the kernel to ", X[2] + pad[0] + pad[2],
                        "x", X[3] + pad[1] + pad[3], " (pads ", absl::StrJoin(pad, ","), ")");
  }
  return Match{std::move(*chain), nodes, note};
}

// Binds the symbolic dims named in `dims` wherever the graph declares
// shapes: its inputs, outputs and value_info. Dims the exporter named itself
// in outputs and value_info ('unk__21', 's0*2') are cleared, for shape
// inference to work out from the bound inputs.
void BindDims(onnx::GraphProto& g, const std::map<std::string, int64_t>& dims) {
  auto bind = [&](onnx::ValueInfoProto& v, bool clear_others) {
    if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return;
    for (auto& d : *v.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim()) {
      if (!d.has_dim_param()) continue;
      auto it = dims.find(d.dim_param());
      if (it != dims.end()) {
        d.set_dim_value(it->second);
      } else if (clear_others) {
        d.clear_dim_param();
      }
    }
  };
  for (onnx::ValueInfoProto& v : *g.mutable_input()) bind(v, false);
  for (onnx::ValueInfoProto& v : *g.mutable_output()) bind(v, true);
  for (onnx::ValueInfoProto& v : *g.mutable_value_info()) bind(v, true);
}

// ONNX's shape inference taking turns with folding, in a child process:
// libonnx 1.12 reads some malformed graphs out of bounds (a convolution
// whose weight has the wrong rank crashes it), and a damaged file must never
// take the caller down. A folded shape computation gives inference a
// Reshape's target, whose output shape lets the next Shape fold; onnxruntime's
// contrib operators get their shapes between inferences, and each turn may
// reach only one more of them (a layer of an optimized transformer takes
// three). So the turns go on until nothing changes, at most once per node.
absl::Status InferAndFoldIsolated(onnx::ModelProto& model, int64_t opset) {
  // The operator schemas are registered on first use: once here, not again
  // in every child.
  static const bool schemas_registered = onnx::OpSchemaRegistry::Schema("Add", 1) != nullptr;
  (void)schemas_registered;
  constexpr int kFailed = 2, kUnserializable = 3;
  ASSIGN_OR_RETURN(ForkedResult run, RunForked(
                                         [&](std::string* bytes) {
                                           try {
                                             const int turns = model.graph().node_size() + 1;
                                             for (int turn = 0;; ++turn) {
                                               onnx::shape_inference::InferShapes(
                                                   model, onnx::OpSchemaRegistry::Instance(),
                                                   onnx::ShapeInferenceOptions(false, 0, /*data_prop=*/true));
                                               if (turn == turns) break;
                                               onnx::GraphProto& g = *model.mutable_graph();
                                               if (FoldShapeComputations(g, opset) + InferContribShapes(g) == 0) break;
                                             }
                                             return model.SerializeToString(bytes) ? 0 : kUnserializable;
                                           } catch (const std::exception& e) {
                                             *bytes = e.what();
                                             return kFailed;
                                           }
                                         },
                                         120));
  if (run.process.timed_out) return absl::DeadlineExceededError("ONNX shape inference did not finish in 120 s");
  if (run.process.signaled) {
    return absl::InvalidArgumentError(absl::StrCat("ONNX shape inference crashed (signal ", run.process.signal,
                                                   "): the model is malformed"));
  }
  const int code = run.process.exit_code;
  if (code == kFailed) return absl::InvalidArgumentError(absl::StrCat("shape inference failed: ", run.output));
  if (code != 0 || !model.ParseFromString(run.output)) {
    return absl::InternalError(absl::StrCat("shape inference ended with code ", code));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OnnxExtraction> ExtractOnnx(const std::string& path, const std::map<std::string, int64_t>& dims) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  onnx::ModelProto model;
  if (!model.ParseFromString(bytes) || !model.has_graph()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an ONNX model (the protobuf does not parse)"));
  }
  BindDims(*model.mutable_graph(), dims);
  int64_t opset = 0;
  for (const onnx::OperatorSetIdProto& o : model.opset_import()) {
    if (o.domain().empty() || o.domain() == "ai.onnx") opset = o.version();
  }
  if (absl::Status st = InferAndFoldIsolated(model, opset); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat(path, ": ", st.message()));
  }
  // Nodes the patterns read must have their operands: a malformed graph is
  // an error naming the node, never an out-of-range read.
  static const std::map<std::string, int> kInputs = {{"MatMul", 2}, {"Gemm", 2}, {"Conv", 2},    {"Add", 2},
                                                     {"Mul", 2},    {"Div", 2},  {"Softmax", 1}, {"Transpose", 1},
                                                     {"Erf", 1},    {"Relu", 1}, {"Gelu", 1},
                                                     {"Pow", 2},    {"Reshape", 1}, {"Expand", 1},
                                                     {"Unsqueeze", 1}, {"Concat", 1}, {"Tanh", 1},
                                                     {"Sigmoid", 1}, {"Attention", 3}, {"MultiHeadAttention", 1}};
  for (const onnx::NodeProto& n : model.graph().node()) {
    auto need = kInputs.find(n.op_type());
    // onnxruntime's Attention has an optional bias: input, weights.
    const int needed = need == kInputs.end() ? 0
                       : n.op_type() == "Attention" && n.domain() == "com.microsoft" ? 2
                                                                                       : need->second;
    if (n.output_size() < 1 || n.output(0).empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": node '", n.name(), "' (", n.op_type(), ") has no output"));
    }
    if (n.input_size() < needed) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": node ", Label(n), " has ", n.input_size(),
                                                     " inputs, needs ", needed));
    }
  }
  const Graph g(model.graph(), opset);
  OnnxExtraction out;
  out.model = model.graph().name();
  std::set<const onnx::NodeProto*> used;
  int index = 0;
  auto keep = [&](Match m, const std::string& role) {
    used.insert(m.nodes.begin(), m.nodes.end());
    std::vector<std::string> names;
    for (const onnx::NodeProto* n : m.nodes) names.push_back(n->name().empty() ? n->output(0) : n->name());
    std::string source = absl::StrCat("nodes ", absl::StrJoin(names, ", "));
    if (!m.note.empty()) absl::StrAppend(&source, " (", m.note, ")");
    const size_t before = out.chains.size();
    AddDistinct(out.chains, {std::move(m.chain), role, source, 1, ""});
    index += out.chains.size() > before;
  };
  // Each pattern from the nodes it starts at (attention: its Softmax),
  // skipping nodes an earlier chain took.
  using Matcher = std::variant<Match, Reject> (*)(
      const Graph&, const onnx::NodeProto&, int);
  const std::tuple<const char*, Matcher, bool (*)(const onnx::NodeProto&)> patterns[] = {
      {"attention", MatchAttention, [](const onnx::NodeProto& n) { return n.op_type() == "Softmax"; }},
      {"attention", MatchAttentionOp,
       [](const onnx::NodeProto& n) { return n.op_type() == "Attention" || n.op_type() == "MultiHeadAttention"; }},
      {"gemm chain", [](const Graph& g, const onnx::NodeProto& n, int index) { return MatchGemmChain(g, n, index); },
       [](const onnx::NodeProto& n) { return IsGemm(&n); }},
      {"gemm chain", MatchGatedFfn, [](const onnx::NodeProto& n) { return n.op_type() == "MatMul"; }},
      {"conv chain", MatchConvChain, [](const onnx::NodeProto& n) { return n.op_type() == "Conv"; }}};
  for (const auto& [role, match, starts] : patterns) {
    for (const onnx::NodeProto& n : model.graph().node()) {
      if (!starts(n) || used.count(&n) > 0) continue;
      auto m = match(g, n, index + 1);
      if (const Reject* r = std::get_if<Reject>(&m)) {
        if (!r->why.empty()) out.rejected.push_back(absl::StrCat(role, " at ", Label(n), ": ", r->why));
      } else {
        keep(std::move(std::get<Match>(m)), role);
      }
    }
  }
  return out;
}

}  // namespace fusor::zoo
