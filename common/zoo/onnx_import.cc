#include "common/zoo/onnx_import.h"

#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/files.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"
#include "common/zoo/onnx_contrib.h"
#include "common/zoo/onnx_fold.h"
#include "common/zoo/onnx_patterns.h"

namespace fusor::zoo {
namespace {

using importer::Graph;
using importer::Label;
using importer::Match;
using importer::Reject;

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
  using Matcher = std::variant<Match, Reject> (*)(const Graph&, const onnx::NodeProto&, int);
  const std::tuple<const char*, Matcher, bool (*)(const onnx::NodeProto&)> patterns[] = {
      {"attention", importer::MatchAttention, [](const onnx::NodeProto& n) { return n.op_type() == "Softmax"; }},
      {"attention", importer::MatchAttentionOp,
       [](const onnx::NodeProto& n) { return n.op_type() == "Attention" || n.op_type() == "MultiHeadAttention"; }},
      {"gemm chain", importer::MatchGemmChain, [](const onnx::NodeProto& n) { return importer::IsGemm(&n); }},
      {"gemm chain", importer::MatchGatedFfn, [](const onnx::NodeProto& n) { return n.op_type() == "MatMul"; }},
      {"conv chain", importer::MatchConvChain, [](const onnx::NodeProto& n) { return n.op_type() == "Conv"; }}};
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

