// The ONNX importer's pieces (private to common/zoo): the graph as the
// pattern matchers read it, the helpers they share, and the matchers, one
// file per pattern family: onnx_attention.cc (attention written out and the
// single-node attention ops), onnx_gemm_chain.cc (GEMM chains and gated
// FFNs), onnx_conv_chain.cc (convolution chains). onnx_import.cc binds the
// dims, runs shape inference and tries each matcher on the graph's nodes.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "common/ir/chain.h"
#include "common/zoo/onnx_causal.h"

namespace fusor::zoo::importer {

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

// The graph after shape inference: who produces and reads each value, the
// known shapes, the constants.
class Graph {
 public:
  Graph(const onnx::GraphProto& g, int64_t opset);

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
  std::variant<std::vector<int64_t>, Reject> Shape(const std::string& t) const;
  // A scalar constant (an initializer or a Constant node's value).
  std::variant<double, Reject> Scalar(const std::string& t) const;
  bool IsScalar(const std::string& t, double value) const;

  // Whether `t` is the same on every run: an initializer, a Constant
  // node's output, or what nodes compute from those alone (a weight
  // transposed or cast by the exporter), up to a few nodes deep.
  bool IsConstant(const std::string& t, int depth = 0) const;

  const onnx::GraphProto& proto() const { return g_; }
  // ReadCausalMask of `mask`, evaluated once per mask (layers share theirs).
  absl::StatusOr<CausalMask> Causality(const std::string& mask, int64_t rows, int64_t keys, int kept_if) const;

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

// "'name' (OpType)", for messages.
std::string Label(const onnx::NodeProto& n);

template <typename T>
bool Failed(const std::variant<T, Reject>& v, std::string* why) {
  if (const Reject* r = std::get_if<Reject>(&v)) {
    *why = r->why;
    return true;
  }
  return false;
}

// A node's attribute, or `fallback` when it has none of that name.
int64_t AttrInt(const onnx::NodeProto& n, const std::string& name, int64_t fallback);
std::vector<int64_t> AttrInts(const onnx::NodeProto& n, const std::string& name);
float AttrFloat(const onnx::NodeProto& n, const std::string& name, float fallback);
std::string AttrString(const onnx::NodeProto& n, const std::string& name, const std::string& fallback);

// An operand of the chain: the graph value read, and the dim names of the
// chain's view in the value's axis order (a Transpose before it folded in).
struct Operand {
  std::string value;
  std::vector<int64_t> shape;
  std::vector<std::string> axes;  // per axis of `value`: a dim name or a constant index ("0")
};

// `value` viewed with dims `names` (one per axis of the view), looking
// through the Transposes that produce it.
std::variant<Operand, Reject> View(const Graph& g, const std::string& value, const std::vector<std::string>& names,
                                   std::vector<const onnx::NodeProto*>* nodes);
// The operand's declaration ("X[a,b,4]") and use ("X[a,b,0]") in a chain.
std::string Decl(const std::string& name, const Operand& o);
std::string Use(const std::string& name, const Operand& o);

// Declares constant the chain's inputs that read constant values of the
// graph (initializers: the model's weights), by (input, value) pairs.
void MarkConstants(const Graph& g, ir::Chain& chain, const std::vector<std::pair<std::string, std::string>>& inputs);

// The element type of `value` (onnx::TensorProto::DataType), 0 if unknown.
int ElemType(const Graph& g, const std::string& value);
// The chain's dtype for `value`: f16, bf16, else f32.
std::string DTypeOf(const Graph& g, const std::string& value);

// The result of a parsed chain text made from `nodes`, or why it does not
// parse.
std::variant<Match, Reject> ChainMatch(const std::string& text, std::vector<const onnx::NodeProto*> nodes,
                                       const std::vector<std::string>& notes);

// The axes of a mask of shape `mask` broadcast to scores of dims `dims`
// with extents `extents`, aligned at the last axis (the mask has no more
// axes than the scores): each axis is the dim whose extent it has, or "0"
// where it is 1. nullopt when an axis is neither; `*bad` says which.
std::optional<std::vector<std::string>> BroadcastAxes(const std::vector<int64_t>& mask,
                                                      const std::vector<std::string>& dims,
                                                      const std::vector<int64_t>& extents, size_t* bad);

// The matchers (see onnx_import.h for what each recognizes).
std::variant<Match, Reject> MatchAttention(const Graph& g, const onnx::NodeProto& s, int index);
std::variant<Match, Reject> MatchAttentionOp(const Graph& g, const onnx::NodeProto& a, int index);
bool IsGemm(const onnx::NodeProto* n);
std::variant<Match, Reject> MatchGemmChain(const Graph& g, const onnx::NodeProto& first, int index);
std::variant<Match, Reject> MatchGatedFfn(const Graph& g, const onnx::NodeProto& gate, int index);
std::variant<Match, Reject> MatchConvChain(const Graph& g, const onnx::NodeProto& first, int index);

}  // namespace fusor::zoo::importer
