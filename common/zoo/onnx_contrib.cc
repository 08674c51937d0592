#include "common/zoo/onnx_contrib.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fusor::zoo {
namespace {

struct Known {
  int type = 0;  // onnx::TensorProto::DataType
  std::vector<int64_t> dims;
};

class ContribShapes {
 public:
  explicit ContribShapes(onnx::GraphProto& g) : g_(g) {
    auto add = [&](onnx::ValueInfoProto& v) {
      declared_[v.name()] = &v;
      if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return;
      Known k{v.type().tensor_type().elem_type(), {}};
      for (const auto& d : v.type().tensor_type().shape().dim()) {
        if (!d.has_dim_value()) return;
        k.dims.push_back(d.dim_value());
      }
      known_[v.name()] = k;
    };
    for (auto& v : *g.mutable_input()) add(v);
    for (auto& v : *g.mutable_value_info()) add(v);
    for (auto& v : *g.mutable_output()) add(v);
    for (const onnx::TensorProto& t : g.initializer()) known_[t.name()] = Known{t.data_type(), {t.dims().begin(), t.dims().end()}};
  }

  int Run() {
    int added = 0;
    for (const onnx::NodeProto& n : g_.node()) {
      if (n.domain() != "com.microsoft") continue;
      const std::string& op = n.op_type();
      const Known* x = In(n, 0);
      if (x == nullptr) continue;
      if (op == "SkipLayerNormalization" || op == "SkipSimplifiedLayerNormalization") {
        // Outputs: the normalized sum, then mean and inverse std (not
        // needed here), then the sum itself.
        added += Set(n, 0, *x);
        added += Set(n, 3, *x);
      } else if (op == "BiasGelu" || op == "FastGelu" || op == "Gelu" || op == "QuickGelu" || op == "BiasAdd") {
        added += Set(n, 0, *x);
      } else if (op == "Attention") {
        // [batch, seq, hidden] times the packed [hidden, 3 * hidden]
        // weights (or qkv_hidden_sizes): [batch, seq, V's hidden].
        const Known* w = In(n, 1);
        if (x->dims.size() != 3 || w == nullptr || w->dims.size() != 2) continue;
        int64_t v_hidden = w->dims[1] % 3 == 0 ? w->dims[1] / 3 : 0;
        for (const onnx::AttributeProto& a : n.attribute()) {
          if (a.name() == "qkv_hidden_sizes" && a.ints_size() == 3) v_hidden = a.ints(2);
        }
        if (v_hidden <= 0) continue;
        added += Set(n, 0, Known{x->type, {x->dims[0], x->dims[1], v_hidden}});
      } else if (op == "MultiHeadAttention") {
        // Query [batch, seq, hidden]; value [batch, keys, V's hidden] or
        // [batch, heads, keys, V's head dim].
        const Known* v = In(n, 2);
        if (x->dims.size() != 3 || v == nullptr) continue;
        int64_t v_hidden = 0;
        if (v->dims.size() == 3) v_hidden = v->dims[2];
        if (v->dims.size() == 4) v_hidden = v->dims[1] * v->dims[3];
        if (v_hidden > 0) added += Set(n, 0, Known{x->type, {x->dims[0], x->dims[1], v_hidden}});
      } else if (op == "EmbedLayerNormalization") {
        // input_ids [batch, seq] and the word embedding [vocab, hidden]:
        // [batch, seq, hidden], and the mask index, one int32 per batch row.
        const Known* words = In(n, 2);
        if (x->dims.size() != 2 || words == nullptr || words->dims.size() != 2) continue;
        added += Set(n, 0, Known{words->type, {x->dims[0], x->dims[1], words->dims[1]}});
        added += Set(n, 1, Known{onnx::TensorProto::INT32, {x->dims[0]}});
      }
    }
    return added;
  }

 private:
  const Known* In(const onnx::NodeProto& n, int i) const {
    if (i >= n.input_size() || n.input(i).empty()) return nullptr;
    auto it = known_.find(n.input(i));
    return it == known_.end() ? nullptr : &it->second;
  }

  // Declares output `i` of `n` as `k` unless the graph knows its shape in
  // full (a partial declaration is replaced): 1 if declared.
  int Set(const onnx::NodeProto& n, int i, const Known& k) {
    if (i >= n.output_size() || n.output(i).empty() || known_.count(n.output(i)) > 0) return 0;
    known_[n.output(i)] = k;
    onnx::ValueInfoProto*& v = declared_[n.output(i)];
    if (v == nullptr) {
      v = g_.add_value_info();
      v->set_name(n.output(i));
    }
    onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(k.type);
    t->mutable_shape()->clear_dim();
    for (int64_t d : k.dims) t->mutable_shape()->add_dim()->set_dim_value(d);
    return 1;
  }

  onnx::GraphProto& g_;
  std::map<std::string, Known> known_;
  std::map<std::string, onnx::ValueInfoProto*> declared_;  // inputs, value_info and outputs
};

}  // namespace

int InferContribShapes(onnx::GraphProto& graph) { return ContribShapes(graph).Run(); }

}  // namespace fusor::zoo
