// The attention patterns of the ONNX importer: attention written out (from
// its Softmax) and the single-node attention ops.
#include "common/zoo/onnx_patterns.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/zoo/onnx_causal.h"

namespace fusor::zoo::importer {
namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace fusor::zoo::importer
