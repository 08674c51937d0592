#include "common/zoo/onnx_causal.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/util/process.h"
#include "common/util/status_macros.h"
#include "common/zoo/onnx_fold.h"

namespace fusor::zoo {
namespace {

// Bounds on what is evaluated: a mask's subgraph is a few dozen small
// nodes; the largest tensor is the mask itself.
constexpr int kMaxNodes = 512;
constexpr int64_t kMaxElements = int64_t{1} << 24;
constexpr rlim_t kMaxNewBytes = rlim_t{6} << 30;  // beyond what the child inherits
constexpr int kTrials = 3;

// Caps the process's address space at what it maps now plus `more`.
void CapAddressSpace(rlim_t more) {
  unsigned long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  const rlim_t cap = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + more;
  const rlimit limit{cap, cap};
  setrlimit(RLIMIT_AS, &limit);  // best effort: without it the 60 s bound still holds
}

// The nodes `value` is computed from, in graph order, and the graph
// inputs (not initializers) they read; false past kMaxNodes.
bool Ancestors(const onnx::GraphProto& g, const std::string& value, std::vector<int>* nodes,
               std::set<std::string>* inputs) {
  std::map<std::string, int> producer;
  for (int i = 0; i < g.node_size(); ++i) {
    for (const std::string& out : g.node(i).output()) producer[out] = i;
  }
  std::set<std::string> initializers, graph_inputs;
  for (const onnx::TensorProto& t : g.initializer()) initializers.insert(t.name());
  for (const onnx::ValueInfoProto& v : g.input()) {
    if (initializers.count(v.name()) == 0) graph_inputs.insert(v.name());
  }
  std::set<int> seen;
  std::vector<std::string> todo = {value};
  while (!todo.empty()) {
    const std::string t = todo.back();
    todo.pop_back();
    if (graph_inputs.count(t) > 0) inputs->insert(t);
    auto it = producer.find(t);
    if (it == producer.end() || !seen.insert(it->second).second) continue;
    if (seen.size() > kMaxNodes) return false;
    for (const std::string& in : g.node(it->second).input()) todo.push_back(in);
  }
  nodes->assign(seen.begin(), seen.end());
  return true;
}

// A Constant node giving graph input `v` (its shape known) trial values:
// ones in trial 0, random 0/1 after.
std::optional<onnx::NodeProto> TrialInput(const onnx::ValueInfoProto& v, int trial, std::mt19937_64& rng) {
  if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return std::nullopt;
  onnx::TensorProto t;
  const int type = v.type().tensor_type().elem_type();
  t.set_data_type(type);
  int64_t count = 1;
  for (const auto& d : v.type().tensor_type().shape().dim()) {
    if (!d.has_dim_value() || d.dim_value() < 0) return std::nullopt;
    t.add_dims(d.dim_value());
    count *= d.dim_value();
    if (count > kMaxElements) return std::nullopt;
  }
  std::bernoulli_distribution bit(0.5);
  for (int64_t i = 0; i < count; ++i) {
    const int x = trial == 0 ? 1 : static_cast<int>(bit(rng));
    switch (type) {
      case onnx::TensorProto::INT64: t.add_int64_data(x); break;
      case onnx::TensorProto::INT32:
      case onnx::TensorProto::BOOL: t.add_int32_data(x); break;
      case onnx::TensorProto::FLOAT: t.add_float_data(static_cast<float>(x)); break;
      case onnx::TensorProto::DOUBLE: t.add_double_data(x); break;
      default: return std::nullopt;
    }
  }
  onnx::NodeProto n;
  n.set_op_type("Constant");
  n.add_output(v.name());
  onnx::AttributeProto* a = n.add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  *a->mutable_t() = std::move(t);
  return n;
}

// The evaluation, in the child: "causal OFFSET WHOLE", "no WHY" (a
// difference found) or "unread WHY" (it could not be evaluated).
std::string Evaluate(const onnx::GraphProto& g, int64_t opset, const std::string& mask, int64_t rows, int64_t keys,
                     int kept_if) {
  std::vector<int> nodes;
  std::set<std::string> inputs;
  for (const onnx::ValueInfoProto& v : g.value_info()) {
    if (v.name() != mask || !v.type().tensor_type().has_shape()) continue;
    double elements = 1;
    for (const auto& d : v.type().tensor_type().shape().dim()) elements *= static_cast<double>(d.dim_value());
    if (elements > static_cast<double>(kMaxElements)) {
      return absl::StrCat("unread it has ", static_cast<int64_t>(elements), " elements, over the 2^24 evaluated");
    }
  }
  if (!Ancestors(g, mask, &nodes, &inputs)) {
    return absl::StrCat("unread its subgraph has more than ", kMaxNodes, " nodes");
  }
  onnx::GraphProto base;
  *base.mutable_value_info() = g.value_info();
  std::set<std::string> read;
  for (int i : nodes) read.insert(g.node(i).input().begin(), g.node(i).input().end());
  for (const onnx::TensorProto& t : g.initializer()) {
    if (read.count(t.name()) > 0) *base.add_initializer() = t;
  }
  std::mt19937_64 rng(20261205);
  auto masked = [&](double x) { return kept_if < 0 ? x <= -1e4 : (x != 0) != (kept_if == 1); };
  CausalMask found;
  found.whole = true;
  for (int trial = 0; trial < kTrials; ++trial) {
    onnx::GraphProto run = base;
    for (const onnx::ValueInfoProto& v : g.input()) {
      if (inputs.count(v.name()) == 0) continue;
      std::optional<onnx::NodeProto> c = TrialInput(v, trial, rng);
      if (!c) return absl::StrCat("no graph input '", v.name(), "' has no known shape or a type not tried");
      *run.add_node() = *std::move(c);
      *run.add_input() = v;
    }
    for (int i : nodes) *run.add_node() = g.node(i);
    std::optional<FoldedTensor> v = EvaluateConstant(std::move(run), opset, mask, kMaxElements);
    if (!v) return "no it does not evaluate from the graph's inputs (an op the folder lacks, or a tensor over 2^24)";
    const size_t rank = v->dims.size();
    if (rank < 2 || v->dims[rank - 2] != rows || v->dims[rank - 1] != keys) {
      return "no it is not [..., queries, keys]";
    }
    const int64_t outer = static_cast<int64_t>(v->values.size()) / (rows * keys);
    if (trial == 0) {
      int64_t kept = 0;
      while (kept < keys && !masked(v->values[kept])) ++kept;
      if (kept == 0 || kept == keys) return "no its first row is not masked from a key on";
      found.offset = kept - 1;
    }
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < keys; ++j) {
          const double x = v->values[(o * rows + i) * keys + j];
          const bool past = j > i + found.offset;
          if (past && !masked(x)) return absl::StrCat("no key ", j, " of row ", i, " is kept");
          if (!past && trial == 0 && masked(x)) return absl::StrCat("no key ", j, " of row ", i, " is masked");
          if (!past && (masked(x) || (kept_if < 0 && x != 0))) found.whole = false;
        }
      }
    }
  }
  return absl::StrCat("causal ", found.offset, " ", found.whole ? 1 : 0);
}

}  // namespace

absl::StatusOr<CausalMask> ReadCausalMask(const onnx::GraphProto& graph, int64_t opset, const std::string& mask,
                                          int64_t rows, int64_t keys, int kept_if) {
  CausalMask out;
  if (rows * keys > kMaxElements) {
    out.evaluated = false;
    out.why = "it is too large to evaluate";
    return out;
  }
  ASSIGN_OR_RETURN(ForkedResult run, RunForked(
                                         [&](std::string* result) {
                                           CapAddressSpace(kMaxNewBytes);
                                           try {
                                             *result = Evaluate(graph, opset, mask, rows, keys, kept_if);
                                           } catch (const std::exception& e) {
                                             *result = absl::StrCat("no ", e.what());
                                           }
                                           return 0;
                                         },
                                         60));
  if (run.process.timed_out || run.process.signaled || run.process.exit_code != 0) {
    out.evaluated = false;
    out.why = "its evaluation did not finish (too large, or the graph is malformed)";
    return out;
  }
  const std::vector<std::string> words = absl::StrSplit(run.output, absl::MaxSplits(' ', 2));
  if (words.size() == 3 && words[0] == "causal" && absl::SimpleAtoi(words[1], &out.offset)) {
    out.causal = true;
    out.whole = words[2] == "1";
  } else {
    out.evaluated = words[0] != "unread";
    out.why = words.size() > 1 ? run.output.substr(words[0].size() + 1) : run.output;
  }
  return out;
}

}  // namespace fusor::zoo
