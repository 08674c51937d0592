// ONNX import: models built here with the ONNX API in the shapes exporters
// produce (BERT-style attention with its head transposes and padding mask,
// a GELU MLP written out with Erf, convolution chains, a ResNet bottleneck), checked chain by chain against
// hand-written chains by canonical key; a model with nothing to fuse, one
// whose external weight data is missing, unbound symbolic dims, corrupt
// files, and onnxruntime's optimizer output twelve layers deep.
#include "common/zoo/onnx_import.h"

#include <onnx/onnx_pb.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/ir/canonical.h"
#include "common/ir/parse.h"
#include "common/util/process.h"

namespace fusor::zoo {
namespace {

using ::testing::HasSubstr;
using Dim = std::variant<int64_t, std::string>;

class Model {
 public:
  explicit Model(const std::string& name) {
    m_.set_ir_version(8);
    auto* op = m_.add_opset_import();
    op->set_domain("");
    op->set_version(13);
    m_.mutable_graph()->set_name(name);
  }
  void Opset(const std::string& domain, int version) {
    for (auto& op : *m_.mutable_opset_import()) {
      if (op.domain() == domain) {
        op.set_version(version);
        return;
      }
    }
    auto* op = m_.add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
  }
  void Input(const std::string& name, const std::vector<Dim>& dims, int type = onnx::TensorProto::FLOAT) {
    auto* v = m_.mutable_graph()->add_input();
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(type);
    for (const Dim& d : dims) {
      auto* dim = t->mutable_shape()->add_dim();
      if (std::holds_alternative<int64_t>(d)) {
        dim->set_dim_value(std::get<int64_t>(d));
      } else {
        dim->set_dim_param(std::get<std::string>(d));
      }
    }
  }
  // A weight whose data lives in a file that is not there.
  void ExternalWeight(const std::string& name, const std::vector<int64_t>& dims) {
    auto* t = m_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    auto* e = t->add_external_data();
    e->set_key("location");
    e->set_value("weights_that_are_not_here.bin");
  }
  void Scalar(const std::string& name, float value) {
    auto* t = m_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_float_data(value);
  }
  // A scalar of a 16-bit float type or bool, given its bits: in raw_data
  // (little-endian) or in int32_data, the two ways ONNX stores them.
  void Bits(const std::string& name, int type, uint16_t bits, bool raw) {
    auto* t = m_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(type);
    if (!raw) {
      t->add_int32_data(bits);
    } else if (type == onnx::TensorProto::BOOL) {
      t->set_raw_data(std::string(1, static_cast<char>(bits)));
    } else {
      t->set_raw_data(std::string{static_cast<char>(bits & 0xff), static_cast<char>(bits >> 8)});
    }
  }
  void Int64s(const std::string& name, const std::vector<int64_t>& values) {
    auto* t = m_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) t->add_int64_data(v);
  }
  onnx::NodeProto* Node(const std::string& op, const std::vector<std::string>& in, const std::string& out) {
    auto* n = m_.mutable_graph()->add_node();
    n->set_op_type(op);
    n->set_name(out + "_node");
    for (const std::string& i : in) n->add_input(i);
    n->add_output(out);
    return n;
  }
  void Perm(onnx::NodeProto* n, const std::vector<int64_t>& perm) {
    auto* a = n->add_attribute();
    a->set_name("perm");
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t p : perm) a->add_ints(p);
  }
  void Output(const std::string& name) { m_.mutable_graph()->add_output()->set_name(name); }
  // `name`: a [size, size] boolean lower triangle (Trilu of ConstantOfShape).
  void Tril(const std::string& name, int64_t size) {
    Int64s(name + "_shape", {size, size});
    auto* value = Node("ConstantOfShape", {name + "_shape"}, name + "_ones")->add_attribute();
    value->set_name("value");
    value->set_type(onnx::AttributeProto::TENSOR);
    value->mutable_t()->set_data_type(onnx::TensorProto::BOOL);
    value->mutable_t()->add_dims(1);
    value->mutable_t()->add_int32_data(1);
    auto* upper = Node("Trilu", {name + "_ones"}, name)->add_attribute();
    upper->set_name("upper");
    upper->set_type(onnx::AttributeProto::INT);
    upper->set_i(0);
  }
  void Floats(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& values) {
    auto* t = m_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    for (float v : values) t->add_float_data(v);
  }
  void Int64(const std::string& name, int64_t value) {
    auto* t = m_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_int64_data(value);
  }
  std::string Write(const std::string& dir) const {
    const std::string path = dir + "/" + m_.graph().name() + ".onnx";
    std::ofstream f(path, std::ios::binary);
    f << m_.SerializeAsString();
    return path;
  }

 private:
  onnx::ModelProto m_;
};

// One BERT-style attention layer as exporters write it: heads split by
// Transpose, K transposed for Q·Kᵀ, scaled by a Div, the padding mask
// (scaled by a Mul first, as BERT exports do) added, softmax, ·V.
void AttentionLayer(Model& m, const std::string& l) {
  for (const char* x : {"q", "k", "v"}) m.Input(l + x, {std::string("batch"), std::string("seq"), 4, 16});
  m.Perm(m.Node("Transpose", {l + "q"}, l + "Q"), {0, 2, 1, 3});
  m.Perm(m.Node("Transpose", {l + "k"}, l + "Kt"), {0, 2, 3, 1});
  m.Perm(m.Node("Transpose", {l + "v"}, l + "V"), {0, 2, 1, 3});
  m.Node("MatMul", {l + "Q", l + "Kt"}, l + "scores");
  m.Node("Div", {l + "scores", "sqrt_d"}, l + "scaled");
  m.Node("Add", {"mask_bias", l + "scaled"}, l + "masked");  // the mask first, made by a Mul
  m.Node("Softmax", {l + "masked"}, l + "probs");
  m.Node("MatMul", {l + "probs", l + "V"}, l + "context");
  m.Output(l + "context");
}

Model BertAttention(int layers) {
  Model m("bert_attention");
  m.Input("mask", {std::string("batch"), 1, 1, std::string("seq")});
  m.Scalar("sqrt_d", 4);
  m.Scalar("minus_big", -10000);
  m.Node("Mul", {"mask", "minus_big"}, "mask_bias");
  for (int i = 0; i < layers; ++i) AttentionLayer(m, "l" + std::to_string(i) + "_");
  return m;
}

// Older GPT-2 exports: the causal mask applied to the scaled scores by
// Where(causal, scores, -1e4) before the padding mask is added; and the
// same with a fill that is not a mask (-1).
Model CausalWhere() {
  Model m("causal_where");
  m.Input("q", {2, 4, 10, 8});
  m.Input("kt", {2, 4, 8, 10});  // K transposed
  m.Input("v", {2, 4, 10, 8});
  m.Input("causal", {1, 1, 10, 10}, onnx::TensorProto::BOOL);
  m.Input("pad", {2, 1, 1, 10});
  m.Scalar("sqrt_d", 2.8284271f);
  m.Scalar("masked_bias", -10000);
  m.Scalar("minus_one", -1);
  m.Node("MatMul", {"q", "kt"}, "s");
  m.Node("Div", {"s", "sqrt_d"}, "scaled");
  m.Node("Where", {"causal", "scaled", "masked_bias"}, "kept");
  m.Node("Add", {"kept", "pad"}, "masked");
  m.Node("Softmax", {"masked"}, "p");
  m.Node("MatMul", {"p", "v"}, "o");
  m.Output("o");
  m.Node("MatMul", {"q", "kt"}, "s2");
  m.Node("Where", {"causal", "s2", "minus_one"}, "kept2");
  m.Node("Softmax", {"kept2"}, "p2");
  m.Node("MatMul", {"p2", "v"}, "o2");
  m.Output("o2");
  return m;
}

// Grouped-query attention as transformers writes it for LLaMA: 8 query
// heads over 2 K/V heads, K and V repeated per query head (repeat_kv:
// Unsqueeze -> Expand -> Reshape), the causal mask (Trilu) by Where.
Model RepeatKv() {
  Model m("repeat_kv");
  m.Opset("", 14);
  m.Input("q", {1, 8, 24, 16});
  m.Input("k", {1, 2, 24, 16});
  m.Input("v", {1, 2, 24, 16});
  m.Tril("causal", 24);
  m.Int64s("axis2", {2});
  m.Int64s("wide", {1, 2, 4, 24, 16});
  m.Int64s("heads", {1, 8, 24, 16});
  m.Scalar("scale", 0.25f);
  m.Scalar("minus_inf", -std::numeric_limits<float>::infinity());
  for (const std::string x : {"k", "v"}) {
    m.Node("Unsqueeze", {x, "axis2"}, x + "1");
    m.Node("Expand", {x + "1", "wide"}, x + "2");
    m.Node("Reshape", {x + "2", "heads"}, x + "r");
  }
  m.Perm(m.Node("Transpose", {"kr"}, "kt"), {0, 1, 3, 2});
  m.Node("MatMul", {"q", "kt"}, "s");
  m.Node("Mul", {"s", "scale"}, "scaled");
  m.Node("Where", {"causal", "scaled", "minus_inf"}, "masked");
  m.Node("Softmax", {"masked"}, "p");
  m.Node("MatMul", {"p", "vr"}, "o");
  m.Output("o");
  return m;
}

// Three attentions over [2, 4, 10, 8] with masks the graph computes: a
// lower triangle alone (Trilu, then Where to 0 and -inf); the mask
// transformers builds, a position range compared with a range (offset 2
// here) and the attention_mask input, to 0 and -1e9; and a constant mask
// that keeps one key past the diagonal.
Model CausalMasks() {
  Model m("causal_masks");
  m.Opset("", 14);
  m.Input("q", {2, 4, 10, 8});
  m.Input("kt", {2, 4, 8, 10});
  m.Input("v", {2, 4, 10, 8});
  m.Input("attention_mask", {2, 10}, onnx::TensorProto::INT64);
  m.Scalar("zero", 0);
  m.Scalar("minus_inf", -std::numeric_limits<float>::infinity());
  m.Scalar("min", -1e9f);
  m.Tril("tril", 10);
  m.Node("Where", {"tril", "zero", "minus_inf"}, "mask_a");
  m.Int64("start", 0);
  m.Int64("stop", 10);
  m.Int64("step", 1);
  m.Int64("two", 2);
  m.Int64s("axis0", {0});
  m.Int64s("axis1", {1});
  m.Int64s("axes12", {1, 2});
  m.Node("Range", {"start", "stop", "step"}, "positions");
  m.Node("Unsqueeze", {"positions", "axis1"}, "rows");
  m.Node("Add", {"rows", "two"}, "rows2");
  m.Node("Unsqueeze", {"positions", "axis0"}, "cols");
  m.Node("LessOrEqual", {"cols", "rows2"}, "causal");
  auto* to = m.Node("Cast", {"attention_mask"}, "pad")->add_attribute();
  to->set_name("to");
  to->set_type(onnx::AttributeProto::INT);
  to->set_i(onnx::TensorProto::BOOL);
  m.Node("Unsqueeze", {"pad", "axes12"}, "pad4");
  m.Node("And", {"causal", "pad4"}, "keep");
  m.Node("Where", {"keep", "zero", "min"}, "mask_b");
  std::vector<float> leaky(100, 0);
  for (int i = 0; i < 10; ++i) {
    for (int j = i + 1; j < 10; ++j) leaky[i * 10 + j] = i == 3 && j == 9 ? 0.f : -1e4f;
  }
  m.Floats("mask_c", {10, 10}, leaky);
  for (const std::string x : {"a", "b", "c"}) {
    m.Node("MatMul", {"q", "kt"}, "s_" + x);
    m.Node("Add", {"s_" + x, "mask_" + x}, "masked_" + x);
    m.Node("Softmax", {"masked_" + x}, "p_" + x);
    m.Node("MatMul", {"p_" + x, "v"}, "o_" + x);
    m.Output("o_" + x);
  }
  return m;
}

// A GELU MLP as exporters write it, Erf form, its weights in external data
// that is not there.
Model GeluMlp() {
  Model m("mlp");
  m.Input("x", {std::string("batch"), 16, 32});
  m.ExternalWeight("w1", {32, 64});
  m.ExternalWeight("b1", {64});
  m.ExternalWeight("w2", {64, 32});
  m.ExternalWeight("b2", {32});
  m.Scalar("sqrt2", 1.4142135f);
  m.Scalar("one", 1);
  m.Scalar("half", 0.5f);
  m.Node("MatMul", {"x", "w1"}, "h");
  m.Node("Add", {"h", "b1"}, "hb");
  m.Node("Div", {"hb", "sqrt2"}, "hs");
  m.Node("Erf", {"hs"}, "he");
  m.Node("Add", {"he", "one"}, "h1");
  m.Node("Mul", {"hb", "half"}, "hh");
  m.Node("Mul", {"hh", "h1"}, "g");
  m.Node("MatMul", {"g", "w2"}, "y");
  m.Node("Add", {"y", "b2"}, "z");
  m.Output("z");
  return m;
}

void Ints(onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& values) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

// A 3x3 stride-2 Conv with bias, Relu, 1x1 Conv; and one padded by
// auto_pad, which the import does not work out.
Model Convs() {
  Model m("convs");
  m.Input("img", {std::string("n"), 8, 19, 23});
  m.ExternalWeight("w1", {16, 8, 3, 3});
  m.ExternalWeight("b1", {16});
  m.ExternalWeight("w2", {12, 16, 1, 1});
  auto* conv = m.Node("Conv", {"img", "w1", "b1"}, "t");
  auto* strides = conv->add_attribute();
  strides->set_name("strides");
  strides->set_type(onnx::AttributeProto::INTS);
  strides->add_ints(2);
  strides->add_ints(2);
  m.Node("Relu", {"t"}, "u");
  m.Node("Conv", {"u", "w2"}, "o");
  m.Output("o");
  m.Input("img2", {1, 8, 10, 10});
  auto* padded = m.Node("Conv", {"img2", "w1"}, "t2");
  auto* pads = padded->add_attribute();
  pads->set_name("auto_pad");
  pads->set_type(onnx::AttributeProto::STRING);
  pads->set_s("SAME_UPPER");
  m.Node("Relu", {"t2"}, "u2");
  m.Node("Conv", {"u2", "w2"}, "o2");
  m.Output("o2");
  return m;
}

// A ResNet-50 bottleneck (conv2_x, batch-norm folded into the biases, as
// inference exports have it): 1x1 reduce, Relu, 3x3 padded by 1, Relu, 1x1
// expand, the residual Add, Relu.
Model Bottleneck() {
  Model m("resnet_bottleneck");
  m.Input("x", {std::string("N"), 256, 56, 56});
  m.ExternalWeight("w1", {64, 256, 1, 1});
  m.ExternalWeight("b1", {64});
  m.ExternalWeight("w2", {64, 64, 3, 3});
  m.ExternalWeight("b2", {64});
  m.ExternalWeight("w3", {256, 64, 1, 1});
  m.ExternalWeight("b3", {256});
  m.Node("Conv", {"x", "w1", "b1"}, "c1");
  m.Node("Relu", {"c1"}, "r1");
  Ints(m.Node("Conv", {"r1", "w2", "b2"}, "c2"), "pads", {1, 1, 1, 1});
  m.Node("Relu", {"c2"}, "r2");
  m.Node("Conv", {"r2", "w3", "b3"}, "c3");
  m.Node("Add", {"c3", "x"}, "sum");
  m.Node("Relu", {"sum"}, "y");
  m.Output("y");
  return m;
}

// LLaMA-style grouped-query attention as one ONNX Attention node (opset
// 23): 8 query heads over 2 K/V heads, causal, f16.
Model GqaAttentionOp() {
  Model m("gqa");
  m.Opset("", 23);
  m.Input("q", {1, 8, std::string("seq"), 16}, onnx::TensorProto::FLOAT16);
  m.Input("k", {1, 2, std::string("seq"), 16}, onnx::TensorProto::FLOAT16);
  m.Input("v", {1, 2, std::string("seq"), 16}, onnx::TensorProto::FLOAT16);
  auto* n = m.Node("Attention", {"q", "k", "v"}, "o");
  auto* causal = n->add_attribute();
  causal->set_name("is_causal");
  causal->set_type(onnx::AttributeProto::INT);
  causal->set_i(1);
  m.Output("o");
  return m;
}

// onnxruntime's MultiHeadAttention over 3-D [batch, seq, hidden] with a key
// padding mask and a per-head bias; and one with a boolean attn_mask that
// the import does not read.
Model MhaOps() {
  Model m("mha");
  m.Opset("com.microsoft", 1);
  m.Opset("", 23);
  m.Input("q", {2, 10, 32});
  m.Input("kv", {2, 12, 32});
  m.Input("pad", {2, 12}, onnx::TensorProto::INT32);
  m.Input("bias", {1, 4, 10, 12});
  auto* n = m.Node("MultiHeadAttention", {"q", "kv", "kv", "", "pad", "bias"}, "o");
  n->set_domain("com.microsoft");
  auto* heads = n->add_attribute();
  heads->set_name("num_heads");
  heads->set_type(onnx::AttributeProto::INT);
  heads->set_i(4);
  m.Output("o");
  m.Input("q4", {2, 4, 10, 8});
  m.Input("keep", {2, 1, 10, 12}, onnx::TensorProto::BOOL);
  m.Node("Attention", {"q4", "q4", "q4", "keep"}, "o2");
  m.Output("o2");
  return m;
}

void Attr(onnx::NodeProto* n, const std::string& name, int64_t value) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

// onnxruntime's contrib ops, whose shapes ONNX's inference does not know:
// a packed-projection Attention (a [batch, queries, keys] mask, causal), an
// FFN through FastGelu (which adds the first bias) into a
// SkipLayerNormalization (which adds the second), and an FFN with ONNX's
// tanh Gelu and a Gemm whose C is the bias.
Model ContribOps() {
  Model m("contrib");
  m.Opset("com.microsoft", 1);
  m.Opset("", 20);
  m.Input("x", {2, 10, 32});
  m.Input("mask", {2, 10, 10}, onnx::TensorProto::INT32);
  for (const auto& [name, dims] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"qkv_w", {32, 96}}, {"qkv_b", {96}}, {"w1", {32, 64}}, {"b1", {64}}, {"w2", {64, 32}},
           {"b2", {32}}, {"gamma", {32}}, {"beta", {32}}, {"w3", {48, 32}}, {"b3", {1, 48}},
           {"w4", {32, 48}}, {"b4", {1, 32}}}) {
    m.ExternalWeight(name, dims);
  }
  auto* att = m.Node("Attention", {"x", "qkv_w", "qkv_b", "mask"}, "att");
  att->set_domain("com.microsoft");
  Attr(att, "num_heads", 4);
  Attr(att, "unidirectional", 1);
  m.Node("MatMul", {"att", "w1"}, "h");
  m.Node("FastGelu", {"h", "b1"}, "g")->set_domain("com.microsoft");
  m.Node("MatMul", {"g", "w2"}, "y");
  m.Node("SkipLayerNormalization", {"y", "att", "gamma", "beta", "b2"}, "n")->set_domain("com.microsoft");
  Attr(m.Node("Gemm", {"x2", "w3", "b3"}, "h2"), "transB", 1);
  m.Input("x2", {20, 32});
  auto* gelu = m.Node("Gelu", {"h2"}, "g2");
  auto* approximate = gelu->add_attribute();
  approximate->set_name("approximate");
  approximate->set_type(onnx::AttributeProto::STRING);
  approximate->set_s("tanh");
  Attr(m.Node("Gemm", {"g2", "w4", "b4"}, "y2"), "transB", 1);
  m.Output("n");
  m.Output("y2");
  return m;
}

std::string Key(const std::string& text) {
  auto chain = ir::ParseChainText(text);
  EXPECT_TRUE(chain.ok()) << chain.status();
  return chain.ok() ? ir::Canonicalize(*chain).key : "";
}

class OnnxImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::Create("/tmp", "fusor-onnx-test-");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(*dir));
  }
  std::optional<TempDir> dir_;
};

TEST_F(OnnxImportTest, BertStyleAttentionWithMaskAndHeadTransposes) {
  auto out = ExtractOnnx(BertAttention(2).Write(dir_->path()), {{"batch", 2}, {"seq", 24}});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->chains.size(), 1u) << (out->rejected.empty() ? "" : out->rejected[0]);
  const ModelChain& m = out->chains[0];
  EXPECT_EQ(m.instances, 2);  // both layers, one chain
  EXPECT_THAT(m.layers, HasSubstr("l0_probs_node"));
  EXPECT_THAT(m.layers, HasSubstr("l1_probs_node"));
  // Q, K and V read through the head transposes, the mask broadcast.
  EXPECT_EQ(ir::Canonicalize(m.chain).key, Key(R"(
dim b=2 s=24 h=4 t=24 d=16 e=16
in Q[b,s,h,d] K[b,t,h,d] V[b,t,h,e] M[b,1,1,t]
S[b,h,s,t] = sum(d) Q[b,s,h,d] * K[b,t,h,d] * 0.25
P[b,h,s,t] = softmax(t) S[b,h,s,t] + M[b,0,0,t]
O[b,h,s,e] = sum(t) P[b,h,s,t] * V[b,t,h,e]
out O
)")) << ir::ChainToText(m.chain);
}

TEST_F(OnnxImportTest, GeluMlpWithErfAndMissingExternalWeights) {
  Model m = GeluMlp();
  auto out = ExtractOnnx(m.Write(dir_->path()), {{"batch", 3}});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->chains.size(), 1u) << (out->rejected.empty() ? "" : out->rejected[0]);
  EXPECT_EQ(out->chains[0].role, "gemm chain");
  EXPECT_EQ(ir::Canonicalize(out->chains[0].chain).key, Key(R"(
dim a=3 s=16 c=32 f=64 o=32
in X[a,s,c] W1[c,f] B1[f] W2[f,o] B2[o]
const W1 B1 W2 B2
H[a,s,f] = sum(c) X[a,s,c] * W1[c,f]
G[a,s,f] = gelu(H[a,s,f] + B1[f])
Y[a,s,o] = sum(f) G[a,s,f] * W2[f,o]
Z[a,s,o] = Y[a,s,o] + B2[o]
out Z
)")) << ir::ChainToText(out->chains[0].chain);
}

// A bottleneck-style convolution chain: 3x3 stride-2 Conv with bias,
// Relu, 1x1 Conv; and a padded one, which the chain cannot express.
TEST_F(OnnxImportTest, ConvReluConv1x1) {
  Model m = Convs();
  auto out = ExtractOnnx(m.Write(dir_->path()), {{"n", 2}});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->chains.size(), 1u);
  EXPECT_EQ(ir::Canonicalize(out->chains[0].chain).key, Key(R"(
dim n=2 c=8 y=19 x=23 k=16 r=3 s=3 p=9 q=11 j=12
in I[n,c,y,x] W1[k,c,r,s] B1[k] W2[j,k,1,1]
const W1 B1 W2
T[n,k,p,q] = sum(c,r,s) I[n,c,p*2+r,q*2+s] * W1[k,c,r,s]
U[n,k,p,q] = relu(T[n,k,p,q] + B1[k])
O[n,j,p,q] = sum(k) U[n,k,p,q] * W2[j,k,0,0]
out O
)")) << ir::ChainToText(out->chains[0].chain);
  ASSERT_EQ(out->rejected.size(), 1u);
  EXPECT_THAT(out->rejected[0], HasSubstr("'t2_node' (Conv) pads with auto_pad SAME_UPPER"));
}

// The bottleneck's 3x3 -> Relu -> 1x1 expand is a chain over the padded
// input; the 1x1 reduce cannot start one (a 3x3 follows it), and the
// expand's residual Add ends the pattern.
TEST_F(OnnxImportTest, ResnetBottleneckFusesThePadded3x3WithTheExpand) {
  Model m = Bottleneck();
  auto out = ExtractOnnx(m.Write(dir_->path()), {{"N", 1}});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->chains.size(), 1u);
  EXPECT_EQ(ir::Canonicalize(out->chains[0].chain).key, Key(R"(
dim n=1 c=64 y=58 x=58 k=64 r=3 s=3 p=56 q=56 j=256
in R[n,c,y,x] W2[k,c,r,s] B2[k] W3[j,k,1,1] B3[j]
const W2 B2 W3 B3
T[n,k,p,q] = sum(c,r,s) R[n,c,p+r,q+s] * W2[k,c,r,s]
U[n,k,p,q] = relu(T[n,k,p,q] + B2[k])
O[n,j,p,q] = sum(k) U[n,k,p,q] * W3[j,k,0,0]
Z[n,j,p,q] = O[n,j,p,q] + B3[j]
out Z
)")) << ir::ChainToText(out->chains[0].chain);
  EXPECT_THAT(out->chains[0].layers,
              HasSubstr("nodes c2_node, r2_node, c3_node (X is 'r1' zero-padded ahead of the kernel to 58x58 "
                        "(pads 1,1,1,1))"));
  ASSERT_EQ(out->rejected.size(), 1u);
  EXPECT_THAT(out->rejected[0],
              HasSubstr("conv chain at 'c1_node' (Conv): 'c2_node' (Conv) is not an unpadded 1x1 convolution"));
}

TEST_F(OnnxImportTest, SingleNodeGroupedQueryAttention) {
  Model m = GqaAttentionOp();
  auto out = ExtractOnnx(m.Write(dir_->path()), {{"seq", 24}});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->chains.size(), 1u) << (out->rejected.empty() ? "" : out->rejected[0]);
  EXPECT_EQ(ir::Canonicalize(out->chains[0].chain).key, Key(R"(
dtype f16
dim b=1 g=2 r=4 m=24 n=24 d=16 e=16
in Q[b,g,r,m,d] K[b,g,n,d] V[b,g,n,e]
S[b,g,r,m,n] = sum(d) Q[b,g,r,m,d] * K[b,g,n,d] * 0.25
P[b,g,r,m,n] = softmax(n <= m) S[b,g,r,m,n]
O[b,g,r,m,e] = sum(n) P[b,g,r,m,n] * V[b,g,n,e]
out O
)")) << ir::ChainToText(out->chains[0].chain);
  // The same chain as a LLaMA-style description's self-attention: a sweep
  // tunes the two once.
  auto config = ParseTransformerConfig(R"({"model": "tiny-llama", "architecture": "decoder", "hidden": 128,
    "heads": 8, "kv_heads": 2, "ffn": 256, "layers": 1, "activation": "swiglu", "mask": "causal", "bias": false,
    "seq": 24, "batch": 1, "dtype": "f16"})");
  ASSERT_TRUE(config.ok()) << config.status();
  auto described = ExpandTransformer(*config);
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_EQ((*described)[0].key, ir::Canonicalize(out->chains[0].chain).key);
}

TEST_F(OnnxImportTest, RepeatedKvIsGroupedQueryAttention) {
  auto out = ExtractOnnx(RepeatKv().Write(dir_->path()), {});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->chains.size(), 1u) << (out->rejected.empty() ? "" : out->rejected[0]);
  EXPECT_THAT(out->chains[0].layers, HasSubstr("kr_node, k2_node, k1_node"));
  // Key for key the LLaMA-style description's self-attention.
  auto config = ParseTransformerConfig(R"({"model": "tiny-llama", "architecture": "decoder", "hidden": 128,
    "heads": 8, "kv_heads": 2, "ffn": 256, "layers": 1, "activation": "swiglu", "mask": "causal", "bias": false,
    "seq": 24, "batch": 1, "dtype": "f32"})");
  ASSERT_TRUE(config.ok()) << config.status();
  auto described = ExpandTransformer(*config);
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_EQ((*described)[0].key, ir::Canonicalize(out->chains[0].chain).key)
      << ir::ChainToText(out->chains[0].chain) << "\n" << ir::ChainToText((*described)[0].chain);
}

TEST_F(OnnxImportTest, MultiHeadAttentionWithPaddingMaskAndBias) {
  Model m = MhaOps();
  auto out = ExtractOnnx(m.Write(dir_->path()), {});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->chains.size(), 1u) << (out->rejected.empty() ? "" : out->rejected[0]);
  // [2, 10, 32] is [batch, seq, 4 heads x 8]; so is the output.
  EXPECT_EQ(ir::Canonicalize(out->chains[0].chain).key, Key(R"(
dim b=2 h=4 m=10 n=12 d=8 e=8
in Q[b,m,h,d] K[b,n,h,d] V[b,n,h,e] M[b,n] A[1,h,m,n]
S[b,h,m,n] = sum(d) Q[b,m,h,d] * K[b,n,h,d] * 0.353553
P[b,h,m,n] = softmax(n) S[b,h,m,n] + M[b,n] + A[0,h,m,n]
O[b,m,h,e] = sum(n) P[b,h,m,n] * V[b,n,h,e]
out O
)")) << ir::ChainToText(out->chains[0].chain);
  ASSERT_EQ(out->rejected.size(), 1u);
  EXPECT_THAT(out->rejected[0], HasSubstr("'keep' is a boolean mask"));
}

TEST_F(OnnxImportTest, OnnxruntimeContribOps) {
  auto out = ExtractOnnx(ContribOps().Write(dir_->path()), {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->rejected.empty()) << out->rejected[0];
  ASSERT_EQ(out->chains.size(), 3u);
  EXPECT_EQ(ir::Canonicalize(out->chains[0].chain).key, Key(R"(
dim b=2 h=4 m=10 n=10 d=8 e=8
in Q[b,m,h,d] K[b,n,h,d] V[b,n,h,e] M[b,m,n]
S[b,h,m,n] = sum(d) Q[b,m,h,d] * K[b,n,h,d] * 0.353553
P[b,h,m,n] = softmax(n <= m) S[b,h,m,n] + M[b,m,n]
O[b,m,h,e] = sum(n) P[b,h,m,n] * V[b,n,h,e]
out O
)")) << ir::ChainToText(out->chains[0].chain);
  EXPECT_THAT(out->chains[0].layers, HasSubstr("Q, K and V are the parts of 'x' projected by 'qkv_w' plus 'qkv_b'"));
  EXPECT_EQ(ir::Canonicalize(out->chains[1].chain).key, Key(R"(
dim a=2 s=10 c=32 f=64 o=32
in X[a,s,c] W1[c,f] B1[f] W2[f,o]
const W1 B1 W2
H[a,s,f] = sum(c) X[a,s,c] * W1[c,f]
G[a,s,f] = gelu_tanh(H[a,s,f] + B1[f])
Y[a,s,o] = sum(f) G[a,s,f] * W2[f,o]
out Y
)")) << ir::ChainToText(out->chains[1].chain);
  EXPECT_THAT(out->chains[1].layers, HasSubstr("the second bias, 'b2', is added by 'n_node' (SkipLayerNormalization)"));
  // Gemm's transB: W is [out, in]; its C [1, out] is the bias.
  EXPECT_EQ(ir::Canonicalize(out->chains[2].chain).key, Key(R"(
dim a=20 c=32 f=48 o=32
in X[a,c] W1[f,c] B1[f] W2[o,f] B2[o]
const W1 B1 W2 B2
H[a,f] = sum(c) X[a,c] * W1[f,c]
G[a,f] = gelu_tanh(H[a,f] + B1[f])
Y[a,o] = sum(f) G[a,f] * W2[o,f]
Z[a,o] = Y[a,o] + B2[o]
out Z
)")) << ir::ChainToText(out->chains[2].chain);
}

// onnxruntime's optimizer output at depth: layer after layer of the packed
// Attention, an FFN through FastGelu and a SkipLayerNormalization, each
// layer's input the last one's output. Every contrib op's shape comes from
// the one before it through ONNX's inference of the MatMuls between them,
// three turns of inference and folding a layer: twelve layers take 36.
TEST_F(OnnxImportTest, DeepOptimizedGraphIsReadToTheLastLayer) {
  constexpr int kLayers = 12;
  Model m("deep");
  m.Opset("com.microsoft", 1);
  m.Opset("", 20);
  m.Input("x0", {2, 10, 32});
  std::string x = "x0";
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = absl::StrCat("l", l, "_");
    for (const auto& [name, dims] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"qkv_w", {32, 96}}, {"qkv_b", {96}}, {"w1", {32, 64}}, {"b1", {64}}, {"w2", {64, 32}},
             {"b2", {32}}, {"gamma", {32}}, {"beta", {32}}}) {
      m.ExternalWeight(p + name, dims);
    }
    auto* att = m.Node("Attention", {x, p + "qkv_w", p + "qkv_b"}, p + "att");
    att->set_domain("com.microsoft");
    Attr(att, "num_heads", 4);
    m.Node("MatMul", {p + "att", p + "w1"}, p + "h");
    m.Node("FastGelu", {p + "h", p + "b1"}, p + "g")->set_domain("com.microsoft");
    m.Node("MatMul", {p + "g", p + "w2"}, p + "y");
    x = p + "n";
    m.Node("SkipLayerNormalization", {p + "y", p + "att", p + "gamma", p + "beta", p + "b2"}, x)
        ->set_domain("com.microsoft");
  }
  m.Output(x);
  auto out = ExtractOnnx(m.Write(dir_->path()), {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->rejected.empty()) << out->rejected[0];
  ASSERT_EQ(out->chains.size(), 2u);
  for (const ModelChain& c : out->chains) {
    EXPECT_EQ(c.instances, kLayers) << c.role << ": " << c.layers;
    EXPECT_THAT(c.layers, HasSubstr(absl::StrCat("l", kLayers - 1, "_")));
  }
}

TEST_F(OnnxImportTest, CausalMaskByWhere) {
  auto out = ExtractOnnx(CausalWhere().Write(dir_->path()), {});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->chains.size(), 1u) << (out->rejected.empty() ? "" : out->rejected[0]);
  EXPECT_EQ(ir::Canonicalize(out->chains[0].chain).key, Key(R"(
dim b=2 h=4 m=10 n=10 d=8 e=8
in Q[b,h,m,d] K[b,h,d,n] V[b,h,n,e] M[b,1,1,n] C[1,1,m,n]
S[b,h,m,n] = sum(d) Q[b,h,m,d] * K[b,h,d,n] * 0.353553
P[b,h,m,n] = softmax(n) S[b,h,m,n] + M[b,0,0,n] + C[0,0,m,n]
O[b,h,m,e] = sum(n) P[b,h,m,n] * V[b,h,n,e]
out O
)")) << ir::ChainToText(out->chains[0].chain);
  EXPECT_THAT(out->chains[0].layers, HasSubstr("C is 'causal' as an additive mask: 0 where it is true, -10000 where "
                                               "it is false"));
  ASSERT_EQ(out->rejected.size(), 1u);
  EXPECT_THAT(out->rejected[0], HasSubstr("'kept2_node' (Where) sets masked scores to 'minus_one', which is not a "
                                          "scalar of -1e4 or below"));
}

// Attention exported in f16 and in bf16: the scale and the causal fill are
// 16-bit scalars (in raw_data for f16, in int32_data for bf16); a Dropout in
// inference mode is looked through, one in training mode is named as why
// its attention is not fused.
TEST_F(OnnxImportTest, CausalMasksAreReadFromWhatTheyCompute) {
  auto out = ExtractOnnx(CausalMasks().Write(dir_->path()), {});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->chains.size(), 3u) << (out->rejected.empty() ? "" : out->rejected[0]);
  const std::string head = "dim b=2 h=4 m=10 n=10 d=8 e=8\nin Q[b,h,m,d] K[b,h,d,n] V[b,h,n,e]";
  const std::string body = "S[b,h,m,n] = sum(d) Q[b,h,m,d] * K[b,h,d,n]\n";
  const std::string end = "O[b,h,m,e] = sum(n) P[b,h,m,n] * V[b,h,n,e]\nout O\n";
  // The triangle alone: no mask input.
  EXPECT_EQ(out->chains[0].key, Key(head + "\n" + body + "P[b,h,m,n] = softmax(n <= m) S[b,h,m,n]\n" + end))
      << ir::ChainToText(out->chains[0].chain);
  EXPECT_THAT(out->chains[0].layers, HasSubstr("'mask_a' is a causal mask and nothing else"));
  // transformers' mask: causal (offset 2) whatever attention_mask holds; the
  // mask still read for the padding.
  EXPECT_EQ(out->chains[1].key,
            Key(head + " M[b,1,m,n]\n" + body + "P[b,h,m,n] = softmax(n <= m + 2) S[b,h,m,n] + M[b,0,m,n]\n" + end))
      << ir::ChainToText(out->chains[1].chain);
  EXPECT_THAT(out->chains[1].layers, HasSubstr("'mask_b' masks every key past the query"));
  // One key kept past the diagonal: an ordinary mask.
  EXPECT_EQ(out->chains[2].key, Key(head + " M[m,n]\n" + body + "P[b,h,m,n] = softmax(n) S[b,h,m,n] + M[m,n]\n" + end))
      << ir::ChainToText(out->chains[2].chain);
}

// A mask of more elements than the evaluation takes (2 x 4096 x 4096):
// not checked, and the chain's source says so.
TEST_F(OnnxImportTest, AMaskTooLargeToEvaluateIsNamed) {
  Model m("big_mask");
  m.Input("q", {2, 1, 4096, 8});
  m.Input("kt", {2, 1, 8, 4096});
  m.Input("v", {2, 1, 4096, 8});
  m.Scalar("zero", 0);
  m.Int64s("shape", {2, 1, 4096, 4096});
  m.Node("Expand", {"zero", "shape"}, "mask");
  m.Node("MatMul", {"q", "kt"}, "s");
  m.Node("Add", {"s", "mask"}, "masked");
  m.Node("Softmax", {"masked"}, "p");
  m.Node("MatMul", {"p", "v"}, "o");
  m.Output("o");
  auto out = ExtractOnnx(m.Write(dir_->path()), {});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->chains.size(), 1u) << (out->rejected.empty() ? "" : out->rejected[0]);
  EXPECT_THAT(ir::ChainToText(out->chains[0].chain), HasSubstr("softmax(n) S["));
  EXPECT_THAT(out->chains[0].layers,
              HasSubstr("'mask' was not checked for causality: it has 33554432 elements, over the 2^24 evaluated"));
}

TEST_F(OnnxImportTest, HalfPrecisionScalarsAndDropout) {
  struct Case {
    int type;
    uint16_t sqrt_d, fill;  // 2.828 and the fill, in the type's bits
    bool raw;
    const char* fill_text;
  };
  for (const Case& c : {Case{onnx::TensorProto::FLOAT16, 0x41a8, 0xfbff, true, "-65504"},
                        Case{onnx::TensorProto::BFLOAT16, 0x4035, 0xf149, false, "-9.9"}}) {
    SCOPED_TRACE(c.type);
    Model m("half");
    m.Opset("", 13);
    m.Input("q", {2, 4, 10, 8}, c.type);
    m.Input("kt", {2, 4, 8, 10}, c.type);
    m.Input("v", {2, 4, 10, 8}, c.type);
    m.Input("causal", {1, 1, 10, 10}, onnx::TensorProto::BOOL);
    m.Bits("sqrt_d", c.type, c.sqrt_d, c.raw);
    m.Bits("fill", c.type, c.fill, c.raw);
    m.Bits("eval", onnx::TensorProto::BOOL, 0, c.raw);
    m.Bits("train", onnx::TensorProto::BOOL, 1, c.raw);
    for (const std::string mode : {"eval", "train"}) {
      m.Node("MatMul", {"q", "kt"}, mode + "_s");
      m.Node("Div", {mode + "_s", "sqrt_d"}, mode + "_scaled");
      m.Node("Where", {"causal", mode + "_scaled", "fill"}, mode + "_kept");
      m.Node("Softmax", {mode + "_kept"}, mode + "_p");
      m.Node("Dropout", {mode + "_p", "", mode}, mode + "_d");
      m.Node("MatMul", {mode + "_d", "v"}, mode + "_o");
      m.Output(mode + "_o");
    }
    auto out = ExtractOnnx(m.Write(dir_->path()), {});
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->chains.size(), 1u) << (out->rejected.empty() ? "" : out->rejected[0]);
    EXPECT_THAT(out->chains[0].layers, HasSubstr("eval_d_node"));
    EXPECT_THAT(out->chains[0].layers, HasSubstr(absl::StrCat(c.fill_text)));
    EXPECT_THAT(ir::ChainToText(out->chains[0].chain), HasSubstr("0.35"));
    ASSERT_EQ(out->rejected.size(), 1u);
    EXPECT_THAT(out->rejected[0], HasSubstr("the probabilities go through a dropout: 'train_d_node' (Dropout) runs "
                                            "in training mode"));
  }
}

TEST_F(OnnxImportTest, NothingToFuseAndUnboundDims) {
  Model plain("plain");
  plain.Input("x", {8, 8});
  plain.Node("Relu", {"x"}, "y");
  plain.Output("y");
  auto none = ExtractOnnx(plain.Write(dir_->path()), {});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->chains.empty());
  EXPECT_TRUE(none->rejected.empty());

  // Without --dim the attention's shapes are unknown: rejected, saying how.
  auto unbound = ExtractOnnx(BertAttention(1).Write(dir_->path()), {});
  ASSERT_TRUE(unbound.ok()) << unbound.status();
  EXPECT_TRUE(unbound->chains.empty());
  ASSERT_EQ(unbound->rejected.size(), 1u);
  EXPECT_THAT(unbound->rejected[0], HasSubstr("l0_probs_node"));
  EXPECT_THAT(unbound->rejected[0], HasSubstr("--dim"));
}

TEST_F(OnnxImportTest, RejectedPatternsNameTheirNode) {
  Model m("softmax_mid");
  m.Input("q", {2, 8, 16});
  m.Input("k", {2, 16, 8});
  m.Input("v", {2, 8, 16});
  m.Node("MatMul", {"q", "k"}, "s");
  auto* sm = m.Node("Softmax", {"s"}, "p");
  auto* axis = sm->add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(1);
  m.Node("MatMul", {"p", "v"}, "o");
  m.Output("o");
  auto out = ExtractOnnx(m.Write(dir_->path()), {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->chains.empty());
  ASSERT_FALSE(out->rejected.empty());
  EXPECT_THAT(out->rejected[0], HasSubstr("'p_node' (Softmax)"));
  EXPECT_THAT(out->rejected[0], HasSubstr("last axis"));
}

TEST_F(OnnxImportTest, CorruptAndMissingFilesAreClearErrors) {
  const std::string path = dir_->path() + "/corrupt.onnx";
  std::ofstream(path) << "this is not a protobuf \xff\xfe\x01";
  auto corrupt = ExtractOnnx(path, {});
  EXPECT_TRUE(absl::IsInvalidArgument(corrupt.status())) << corrupt.status();
  EXPECT_THAT(std::string(corrupt.status().message()), HasSubstr("not an ONNX model"));
  // A truncated model.
  const std::string whole = BertAttention(1).Write(dir_->path());
  std::ifstream in(whole, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir_->path() + "/truncated.onnx", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  EXPECT_FALSE(ExtractOnnx(dir_->path() + "/truncated.onnx", {}).ok());
  EXPECT_TRUE(absl::IsNotFound(ExtractOnnx(dir_->path() + "/absent.onnx", {}).status()));
}

// Damaged models: a node without its operands is an error naming it; and
// no corruption of a real model's bytes crashes the import (each either
// fails to parse, fails cleanly, or imports).
// Rows merged by a Reshape and never split back: the FFN on the 2-D rows.
TEST_F(OnnxImportTest, FfnOnFlattenedRows) {
  Model m("flat_ffn");
  m.Input("x", {2, 8, 32});
  m.Int64s("rows", {16, 32});
  m.ExternalWeight("w1", {32, 64});
  m.ExternalWeight("w2", {64, 32});
  m.Node("Reshape", {"x", "rows"}, "flat");
  m.Node("MatMul", {"flat", "w1"}, "h");
  m.Node("Relu", {"h"}, "a");
  m.Node("MatMul", {"a", "w2"}, "y");
  m.Output("y");
  auto out = ExtractOnnx(m.Write(dir_->path()), {});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->chains.size(), 1u) << (out->rejected.empty() ? "" : out->rejected[0]);
  EXPECT_EQ(ir::Canonicalize(out->chains[0].chain).key, Key(R"(
dim a=16 c=32 f=64 o=32
in X[a,c] W1[c,f] W2[f,o]
const W1 W2
H[a,f] = sum(c) X[a,c] * W1[c,f]
A[a,f] = relu(H[a,f])
Y[a,o] = sum(f) A[a,f] * W2[f,o]
out Y
)")) << ir::ChainToText(out->chains[0].chain);
}

TEST_F(OnnxImportTest, DamagedModelsNeverCrash) {
  Model m("one_input_matmul");
  m.Input("x", {4, 4});
  m.Node("MatMul", {"x"}, "y");
  m.Output("y");
  auto bad = ExtractOnnx(m.Write(dir_->path()), {});
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'y_node' (MatMul) has 1 inputs, needs 2"));
  // Nodes the patterns walk through, short of inputs: a Pow after a GEMM
  // (read by the GELU matcher) and a Reshape of a domain without a schema
  // (shape inference lets both through).
  Model pow("short_pow");
  pow.Input("x", {4, 4});
  pow.Input("w", {4, 4});
  pow.Node("MatMul", {"x", "w"}, "h");
  pow.Node("Pow", {"h"}, "p");
  pow.Output("p");
  bad = ExtractOnnx(pow.Write(dir_->path()), {});
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'p_node' (Pow) has 1 inputs, needs 2"));
  Model reshape("short_reshape");
  reshape.Opset("custom", 1);
  reshape.Input("q", {1, 2, 4, 8});
  reshape.Node("Reshape", {}, "kt")->set_domain("custom");
  reshape.Node("MatMul", {"q", "kt"}, "s");
  reshape.Node("Softmax", {"s"}, "p");
  reshape.Node("MatMul", {"p", "q"}, "o");
  reshape.Output("o");
  bad = ExtractOnnx(reshape.Write(dir_->path()), {});
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'kt_node' (Reshape) has 0 inputs, needs 1"));

  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  for (const Model& model : {BertAttention(1), GeluMlp(), Convs(), Bottleneck(), GqaAttentionOp(), MhaOps(),
                             ContribOps(), CausalWhere(), RepeatKv()}) {
    const std::string whole = model.Write(dir_->path());
    std::ifstream in(whole, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    int imported = 0;
    for (int i = 0; i < 300; ++i) {
      std::string damaged = bytes;
      for (int flips = 1 + static_cast<int>(next() % 4); flips > 0; --flips) {
        damaged[next() % damaged.size()] = static_cast<char>(next() & 0xff);
      }
      const std::string path = dir_->path() + "/damaged.onnx";
      std::ofstream(path, std::ios::binary | std::ios::trunc) << damaged;
      imported += ExtractOnnx(path, {{"batch", 2}, {"seq", 8}, {"n", 1}, {"N", 1}}).ok();
    }
    EXPECT_GT(imported, 0) << whole;  // some damage leaves a model that still parses
  }
}

}  // namespace
}  // namespace fusor::zoo
