// The GEMM chain patterns of the ONNX importer: GEMM -> activation -> GEMM
// (with biases and the row merges around a 2-D Gemm) and gated FFNs.
#include "common/zoo/onnx_patterns.h"

#include <onnx/onnx_pb.h>

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ir/parse.h"

namespace fusor::zoo::importer {

bool IsGemm(const onnx::NodeProto* n) { return n != nullptr && (n->op_type() == "MatMul" || n->op_type() == "Gemm"); }


namespace {

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

// Whether an activation follows the GEMM `first` (past a bias Add and a
// row split): only such a GEMM is a candidate.
bool ActivationFollows(const Graph& g, const onnx::NodeProto& first) {
  std::string t = first.output(0);
  for (int step = 0; step < 3; ++step) {
    if (FindActivation(g, t).has_value()) return true;
    const onnx::NodeProto* n = g.SoleConsumer(t);
    if (n == nullptr || (n->op_type() != "Add" && n->op_type() != "Reshape")) break;
    t = n->output(0);
  }
  return false;
}

// B of GEMM `n` viewed as [k, col] (Gemm's transB read as the transpose).
std::variant<Operand, Reject> GemmWeight(const Graph& g, const onnx::NodeProto& n, const std::string& k,
                                         const std::string& col) {
  std::vector<std::string> bn = {k, col};
  if (n.op_type() == "Gemm") {
    if (AttrInt(n, "transA", 0) != 0) return Reject{absl::StrCat(Label(n), " transposes A")};
    if (AttrFloat(n, "alpha", 1) != 1) return Reject{absl::StrCat(Label(n), " scales A*B (alpha)")};
    if (AttrInt(n, "transB", 0) != 0) bn = {col, k};
  }
  auto shape = g.Shape(n.input(1));
  std::string why;
  if (Failed(shape, &why)) return Reject{why};
  if (std::get<std::vector<int64_t>>(shape).size() != 2) return Reject{absl::StrCat(Label(n), ": B is not a matrix")};
  return Operand{n.input(1), std::get<std::vector<int64_t>>(shape), bn};
}

// A Gemm's C input as a bias of `width` into `*bias`; why not when its C
// is something else.
std::optional<Reject> GemmCBias(const Graph& g, const onnx::NodeProto& n, int64_t width, std::string* bias) {
  if (n.op_type() != "Gemm" || n.input_size() < 3 || n.input(2).empty()) return std::nullopt;
  auto shape = g.Shape(n.input(2));
  std::string why;
  if (Failed(shape, &why)) return Reject{why};
  const auto& sh = std::get<std::vector<int64_t>>(shape);
  if (AttrFloat(n, "beta", 1) != 1 || (sh != std::vector<int64_t>{width} && sh != std::vector<int64_t>{1, width})) {
    return Reject{absl::StrCat(Label(n), " adds a C that is not a bias of its columns")};
  }
  *bias = n.input(2);
  return std::nullopt;
}

// What a matched GEMM chain reads: X over `rows` and c, the weights, the
// activation and the biases (either may be "").
struct GemmChainParts {
  std::string dtype;
  Operand x, w1, w2;
  std::vector<std::string> rows;
  int64_t f = 0, o = 0;
  std::string func, bias1, bias2;
};

// The chain of `p`, its weights and biases constant where the graph's are.
std::variant<Match, Reject> GemmChainOf(const Graph& g, const GemmChainParts& p, int index,
                                        std::vector<const onnx::NodeProto*> nodes, std::string note) {
  std::map<std::string, int64_t> extent;
  for (size_t i = 0; i < p.x.axes.size(); ++i) extent[p.x.axes[i]] = p.x.shape[i];
  extent["f"] = p.f;
  extent["o"] = p.o;
  std::string dims;
  for (const auto& [name, e] : extent) absl::StrAppend(&dims, " ", name, "=", e);
  const std::string r = absl::StrJoin(p.rows, ",");
  std::string inputs = absl::StrCat(Decl("X", p.x), " ", Decl("W1", p.w1), " ", Decl("W2", p.w2));
  if (!p.bias1.empty()) inputs += " B1[f]";
  if (!p.bias2.empty()) inputs += " B2[o]";
  std::string text = absl::StrCat("chain gemm_chain_", index, "\ndtype ", p.dtype, "\ndim", dims, "\nin ", inputs,
                                  "\n", "H[", r, ",f] = sum(c) ", Use("X", p.x), " * ", Use("W1", p.w1), "\n", "A[",
                                  r, ",f] = ", p.func, "(H[", r, ",f]", p.bias1.empty() ? "" : " + B1[f]", ")\n",
                                  "Y[", r, ",o] = sum(f) A[", r, ",f] * ", Use("W2", p.w2), "\n");
  text += p.bias2.empty() ? "out Y\n" : absl::StrCat("Z[", r, ",o] = Y[", r, ",o] + B2[o]\nout Z\n");
  auto chain = ir::ParseChainText(text);
  if (!chain.ok()) return Reject{std::string(chain.status().message())};
  MarkConstants(g, *chain, {{"W1", p.w1.value}, {"W2", p.w2.value}, {"B1", p.bias1}, {"B2", p.bias2}});
  return Match{std::move(*chain), std::move(nodes), std::move(note)};
}

// MatchGemmChain; `split_rows`: look through a Reshape merging the rows
// before the first GEMM; without a Reshape splitting them back, the chain
// is read on the merged 2-D rows instead.
std::variant<Match, Reject> MatchGemmChainRows(const Graph& g, const onnx::NodeProto& first, int index,
                                               bool split_rows) {
  if (!ActivationFollows(g, first)) return Reject{};
  std::vector<const onnx::NodeProto*> nodes;
  std::string why;
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
  GemmChainParts p;
  p.dtype = DTypeOf(g, first.input(0));
  for (size_t i = 0; i + 1 < x_shape.size(); ++i) p.rows.push_back(absl::StrCat("a", i));
  std::vector<std::string> x_names = p.rows;
  x_names.push_back("c");
  auto X = merge != nullptr ? std::variant<Operand, Reject>(Operand{x, x_shape, x_names}) : View(g, x, x_names, &nodes);
  if (Failed(X, &why)) return Reject{why};
  auto W1 = GemmWeight(g, first, "c", "f");
  if (Failed(W1, &why)) return Reject{why};
  p.w1 = std::get<Operand>(W1);
  p.f = p.w1.shape[p.w1.axes[0] == "f" ? 0 : 1];
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
  if (auto r = GemmCBias(g, first, p.f, &p.bias1)) return *r;
  std::string cur = past_gemm(first.output(0), p.f, &p.bias1);
  if (merge != nullptr && g.KnownShape(cur).size() != x_shape.size()) return MatchGemmChainRows(g, first, index, false);
  auto act = FindActivation(g, cur);
  if (!act) return Reject{"the activation does not follow the GEMM's bias"};
  if (!act->bias.empty()) {
    if (!p.bias1.empty()) return Reject{absl::StrCat(Label(*act->nodes[0]), " adds a second bias")};
    if (g.KnownShape(act->bias) != std::vector<int64_t>{p.f}) {
      return Reject{absl::StrCat(Label(*act->nodes[0]), "'s bias is not a vector of ", p.f)};
    }
    p.bias1 = act->bias;
  }
  p.func = act->func;
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
  auto W2 = GemmWeight(g, *second, "f", "o");
  if (Failed(W2, &why)) return Reject{why};
  p.w2 = std::get<Operand>(W2);
  p.o = p.w2.shape[p.w2.axes[0] == "o" ? 0 : 1];
  if (auto r = GemmCBias(g, *second, p.o, &p.bias2)) return *r;
  const std::string out = past_gemm(second->output(0), p.o, &p.bias2);
  std::string note;
  if (const onnx::NodeProto* skip = g.SoleConsumer(out); p.bias2.empty() && skip != nullptr &&
      skip->op_type() == "SkipLayerNormalization" && skip->input_size() > 4 && !skip->input(4).empty()) {
    note = absl::StrCat("the second bias, '", skip->input(4), "', is added by ", Label(*skip), " after the chain");
  }
  p.x = std::get<Operand>(X);
  return GemmChainOf(g, p, index, std::move(nodes), std::move(note));
}

}  // namespace

// GEMM -> [bias] -> activation -> GEMM -> [bias] starting at `first`. A
// Gemm's bias may be its C input; rows merged by a Reshape around each GEMM
// (GPT-2's Conv1D) are read as the activation's rows.
std::variant<Match, Reject> MatchGemmChain(const Graph& g, const onnx::NodeProto& first, int index) {
  return MatchGemmChainRows(g, first, index, true);
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

}  // namespace fusor::zoo::importer
