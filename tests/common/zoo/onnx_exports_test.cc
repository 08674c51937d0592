// The ONNX importer on models as PyTorch's exporters write them: 2-layer
// BERT, GPT-2, T5 (encoder), ViT and LLaMA (hidden 64, 4 heads, LLaMA's
// over 2 K/V heads, FFN 256) exported
// by the TorchScript exporter (opset 17) and the dynamo exporter (opset 18),
// each with eager and SDPA attention, GPT-2 and LLaMA in float16 too, and
// onnxruntime's optimizer output for BERT. The fixtures are graphs only, made by
// tests/common/zoo/exports/make_exports.py.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/ir/canonical.h"
#include "common/ir/parse.h"
#include "common/ir/chain.h"
#include "common/zoo/onnx_import.h"

namespace fusor::zoo {
namespace {

using ::testing::HasSubstr;

std::string Key(const std::string& text) {
  auto chain = ir::ParseChainText("chain c\ndtype f32\n" + text);
  EXPECT_TRUE(chain.ok()) << chain.status();
  return chain.ok() ? ir::Canonicalize(*chain).key : "";
}

absl::StatusOr<OnnxExtraction> Extract(const std::string& name) {
  return ExtractOnnx(std::string(FUSOR_SOURCE_DIR) + "/tests/common/zoo/exports/" + name + ".onnx",
                     {{"batch", 8}, {"seq", 128}});
}

// Each BERT layer's attention with the mask the model builds from
// attention_mask (expanded to [batch, 1, queries, keys]) and the scale
// 1/sqrt(16) folded, heads split by the exporter's Reshape/Transpose.
std::string BertAttention() {
  return absl::StrCat("dim b=8 h=4 d=16 e=16 m=128 n=128\nin Q[b,m,h,d] K[b,n,h,d] V[b,n,h,e] M[b,1,m,n]\n",
                      "S[b,h,m,n] = sum(d) Q[b,m,h,d] * K[b,n,h,d] * 0.25\n",
                      "P[b,h,m,n] = softmax(n) S[b,h,m,n] + M[b,0,m,n]\n",
                      "O[b,h,m,e] = sum(n) P[b,h,m,n] * V[b,n,h,e]\nout O\n");
}

// Each layer's FFN over `tokens` positions: bias, GELU (erf), bias.
std::string GeluFfn(int tokens) {
  return absl::StrCat("dim a=8 s=", tokens, R"( c=64 f=256 o=64
in X[a,s,c] W1[c,f] W2[f,o] B1[f] B2[o]
const W1 W2 B1 B2
H[a,s,f] = sum(c) X[a,s,c] * W1[c,f]
A[a,s,f] = gelu(H[a,s,f] + B1[f])
Y[a,s,o] = sum(f) A[a,s,f] * W2[f,o]
Z[a,s,o] = Y[a,s,o] + B2[o]
out Z
)");
}

// The chains of `name`: one attention, then one FFN, each run by both
// layers; the attention's key is `attention`.
void ExpectBertChains(const std::string& name, const std::string& attention) {
  SCOPED_TRACE(name);
  auto out = Extract(name);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->chains.size(), 2u) << (out->rejected.empty() ? "" : out->rejected[0]);
  EXPECT_TRUE(out->rejected.empty()) << out->rejected[0];
  const ModelChain& a = out->chains[0];
  EXPECT_EQ(a.role, "attention");
  EXPECT_EQ(a.instances, 2);
  EXPECT_EQ(a.key, attention) << ir::ChainToText(a.chain);
  const ModelChain& f = out->chains[1];
  EXPECT_EQ(f.role, "gemm chain");
  EXPECT_EQ(f.instances, 2);
  EXPECT_EQ(f.key, Key(GeluFfn(128))) << ir::ChainToText(f.chain);
}

TEST(OnnxExportsTest, TorchScriptEager) {
  // The head splits' Reshape targets come from Shape -> Gather ->
  // Unsqueeze -> Concat subgraphs: folded once batch and seq are bound.
  ExpectBertChains("bert_torchscript_eager", Key(BertAttention()));
}

TEST(OnnxExportsTest, TorchScriptSdpa) {
  // sqrt(scale) on Q and on K, and the NaN guard after the softmax.
  ExpectBertChains("bert_torchscript_sdpa", Key(BertAttention()));
  auto out = Extract("bert_torchscript_sdpa");
  ASSERT_TRUE(out.ok());
  EXPECT_THAT(out->chains[0].layers, HasSubstr("zeroing of NaN probabilities"));
}

TEST(OnnxExportsTest, DynamoEager) {
  // The exporter's own symbolic dims in value_info, and GELU written
  // x * (0.5 * (1 + erf(x / sqrt 2))).
  ExpectBertChains("bert_dynamo_eager", Key(BertAttention()));
}

TEST(OnnxExportsTest, DynamoSdpa) {
  // K' is made by Reshape -> Transpose -> Reshape (heads merged around the
  // transpose): read as the transpose it is, so the key is the others'.
  ExpectBertChains("bert_dynamo_sdpa", Key(BertAttention()));
}

// GPT-2, T5's encoder, ViT and LLaMA, each exported four ways (T5's dynamo SDPA
// export fails in PyTorch itself). Every layer's attention is found, with
// the operands each exporter materializes, and every FFN.
struct OtherModel {
  const char* fixture;
  const char* inputs;  // the attention chain's `in` line
  const char* probs;   // and its softmax line
  std::string ffn;     // the FFN chain's text
};

// T5: ReLU FFN without biases; ViT: the GELU FFN over 17 tokens (16
// patches and the class token).
const char kT5Ffn[] = R"(
dim a=8 s=128 c=64 f=256 o=64
in X[a,s,c] W1[c,f] W2[f,o]
const W1 W2
H[a,s,f] = sum(c) X[a,s,c] * W1[c,f]
A[a,s,f] = relu(H[a,s,f])
Y[a,s,o] = sum(f) A[a,s,f] * W2[f,o]
out Y
)";
// GPT-2: Conv1D's Gemm on rows merged by a Reshape, its bias as Gemm's C,
// and GELU's tanh approximation written out. The dynamo exporter drops the
// (zero-initialized) biases of the random model.
std::string Gpt2Ffn(bool biases) {
  return absl::StrCat("dim a=8 s=128 c=64 f=256 o=64\nin X[a,s,c] W1[c,f] W2[f,o]", biases ? " B1[f] B2[o]" : "",
                      "\nconst W1 W2", biases ? " B1 B2" : "", "\nH[a,s,f] = sum(c) X[a,s,c] * W1[c,f]\nA[a,s,f] = gelu_tanh(H[a,s,f]",
                      biases ? " + B1[f]" : "", ")\nY[a,s,o] = sum(f) A[a,s,f] * W2[f,o]\n",
                      biases ? "Z[a,s,o] = Y[a,s,o] + B2[o]\nout Z\n" : "out Y\n");
}
// LLaMA: SwiGLU, no biases.
const char kLlamaFfn[] = R"(
dim a=8 s=128 c=64 f=256 o=64
in X[a,s,c] WG[c,f] WU[c,f] WD[f,o]
const WG WU WD
G[a,s,f] = sum(c) X[a,s,c] * WG[c,f]
U[a,s,f] = sum(c) X[a,s,c] * WU[c,f]
A[a,s,f] = G[a,s,f] * sigmoid(G[a,s,f]) * U[a,s,f]
Y[a,s,o] = sum(f) A[a,s,f] * WD[f,o]
out Y
)";
const char kHeads[] = "in Q[b0,m,b1,d] K[b0,n,b1,d] V[b0,n,b1,e] M[b0,1,m,n]";
const char kMasked[] = "P[b0,b1,m,n] = softmax(n) S[b0,b1,m,n] + M[b0,0,m,n]\n";
// The model's mask masks every key past the query whatever attention_mask
// says (ReadCausalMask): the softmax is causal, the mask is still read for
// the padding.
const char kCausal[] = "P[b0,b1,m,n] = softmax(n <= m) S[b0,b1,m,n] + M[b0,0,m,n]\n";
const char kGrouped[] = "in Q[b0,g,r,m,d] K[b0,g,n,d] V[b0,g,n,e] M[b0,1,m,n]";
const char kGroupedMasked[] =
    "S[b0,g,r,m,n] = sum(d) Q[b0,g,r,m,d] * K[b0,g,n,d] * 0.25\n"
    "P[b0,g,r,m,n] = softmax(n <= m) S[b0,g,r,m,n] + M[b0,0,m,n]\n"
    "O[b0,g,r,m,e] = sum(n) P[b0,g,r,m,n] * V[b0,g,n,e]\n";

class OtherModelsTest : public ::testing::TestWithParam<OtherModel> {};

TEST_P(OtherModelsTest, EveryLayerFound) {
  const OtherModel& want = GetParam();
  auto out = Extract(want.fixture);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->rejected.empty()) << out->rejected[0];
  ASSERT_EQ(out->chains.size(), 2u);
  const ModelChain& a = out->chains[0];
  EXPECT_EQ(a.role, "attention");
  EXPECT_EQ(a.instances, 2);
  const std::string text = ir::ChainToText(a.chain);
  EXPECT_THAT(text, HasSubstr(std::string(want.inputs) + "\n"));
  EXPECT_THAT(text, HasSubstr(want.probs));
  EXPECT_EQ(out->chains[1].role, "gemm chain");
  EXPECT_EQ(out->chains[1].instances, 2);
  EXPECT_EQ(out->chains[1].key, Key(want.ffn)) << ir::ChainToText(out->chains[1].chain);
}

// GPT-2 and LLaMA exported in float16 by both exporters: the scale and the
// mask are FLOAT16 scalars, and LLaMA's softmax in f32 (TorchScript: a Cast
// up and back around it) is exact. The same chains as the f32 exports, in
// f16.
TEST(OnnxExportsTest, Float16ExportsReadAsTheirF32Twins) {
  for (const char* fixture :
       {"gpt2_torchscript_eager", "gpt2_dynamo_eager", "llama_torchscript_eager", "llama_dynamo_eager"}) {
    SCOPED_TRACE(fixture);
    auto half = Extract(absl::StrCat(fixture, "_f16"));
    auto single = Extract(fixture);
    ASSERT_TRUE(half.ok()) << half.status();
    ASSERT_TRUE(single.ok()) << single.status();
    EXPECT_TRUE(half->rejected.empty()) << half->rejected[0];
    ASSERT_EQ(half->chains.size(), 2u);
    ASSERT_EQ(single->chains.size(), 2u);
    for (int i = 0; i < 2; ++i) {
      const ModelChain& h = half->chains[i];
      ir::Chain want = single->chains[i].chain;
      want.dtype = ir::DType::kF16;
      EXPECT_EQ(h.chain.dtype, ir::DType::kF16);
      EXPECT_EQ(h.instances, 2);
      EXPECT_EQ(h.key, ir::Canonicalize(want).key) << ir::ChainToText(h.chain);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Exports, OtherModelsTest,
    ::testing::Values(
        // The causal and padding masks combined by the model into one additive
        // mask, read as a causal softmax plus the mask.
        // (The TorchScript export appends K and V to an empty KV cache
        // first: a Concat read as the identity.)
        OtherModel{"gpt2_torchscript_eager", kHeads, kCausal, Gpt2Ffn(true)},
        OtherModel{"gpt2_torchscript_sdpa", kHeads, kCausal, Gpt2Ffn(true)},
        OtherModel{"gpt2_dynamo_eager", kHeads, kCausal, Gpt2Ffn(false)},
        OtherModel{"gpt2_dynamo_sdpa", kHeads, kCausal, Gpt2Ffn(false)},
        // T5: unscaled, the mask and the relative position bias as two terms
        // (SDPA receives their sum as one).
        OtherModel{"t5_torchscript_eager", "in Q[b0,m,b1,d] K[b0,n,b1,d] V[b0,n,b1,e] M[b0,1,m,n] B[1,b1,m,n]",
                   "S[b0,b1,m,n] = sum(d) Q[b0,m,b1,d] * K[b0,n,b1,d]\nP[b0,b1,m,n] = softmax(n) S[b0,b1,m,n] + "
                   "M[b0,0,m,n] + B[0,b1,m,n]\n",
                   kT5Ffn},
        OtherModel{"t5_dynamo_eager", "in Q[b0,m,b1,d] K[b0,n,b1,d] V[b0,n,b1,e] M[b0,1,m,n] B[1,b1,m,n]",
                   "+ M[b0,0,m,n] + B[0,b1,m,n]\n", kT5Ffn},
        OtherModel{"t5_torchscript_sdpa", "in Q[b0,m,b1,d] K[b0,n,b1,d] V[b0,n,b1,e] M[b0,b1,m,n]",
                   "softmax(n) S[b0,b1,m,n] + M[b0,b1,m,n]\n", kT5Ffn},
        // ViT: no mask in the TorchScript exports; the dynamo exports keep
        // the one transformers builds.
        OtherModel{"vit_torchscript_eager", "in Q[b0,m,b1,d] K[b0,n,b1,d] V[b0,n,b1,e]",
                   "P[b0,b1,m,n] = softmax(n) S[b0,b1,m,n]\n", GeluFfn(17)},
        OtherModel{"vit_torchscript_sdpa", "in Q[b0,m,b1,d] K[b0,n,b1,d] V[b0,n,b1,e]",
                   "P[b0,b1,m,n] = softmax(n) S[b0,b1,m,n]\n", GeluFfn(17)},
        OtherModel{"vit_dynamo_eager", kHeads, kMasked, GeluFfn(17)},
        OtherModel{"vit_dynamo_sdpa", kHeads, kMasked, GeluFfn(17)},
        // LLaMA: 4 query heads over 2 K/V heads, K and V repeated
        // (repeat_kv) before the attention: read as grouped-query attention
        // (g: K/V head, r: query head in its group), K and V unrepeated;
        // the model's causal and padding masks combined into one, read as a
        // causal softmax plus the mask.
        OtherModel{"llama_torchscript_eager", kGrouped, kGroupedMasked, kLlamaFfn},
        OtherModel{"llama_torchscript_sdpa", kGrouped, kGroupedMasked, kLlamaFfn},
        OtherModel{"llama_dynamo_eager", kGrouped, kGroupedMasked, kLlamaFfn},
        OtherModel{"llama_dynamo_sdpa", kGrouped, kGroupedMasked, kLlamaFfn}),
    [](const ::testing::TestParamInfo<OtherModel>& info) { return std::string(info.param.fixture); });

TEST(OnnxExportsTest, OnnxruntimeOptimized) {
  // com.microsoft ops, whose shapes ONNX's inference does not know:
  // EmbedLayerNormalization, Attention (one packed QKV projection, the mask
  // as key lengths), SkipLayerNormalization (which adds the FFN's second
  // bias) and BiasGelu.
  auto out = Extract("bert_ort_optimized");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->rejected.empty()) << out->rejected[0];
  ASSERT_EQ(out->chains.size(), 2u);
  const ModelChain& a = out->chains[0];
  EXPECT_EQ(a.role, "attention");
  EXPECT_EQ(a.instances, 2);
  EXPECT_EQ(a.key, Key(R"(dim b=8 h=4 d=16 e=16 m=128 n=128
in Q[b,m,h,d] K[b,n,h,d] V[b,n,h,e] M[b,n]
S[b,h,m,n] = sum(d) Q[b,m,h,d] * K[b,n,h,d] * 0.25
P[b,h,m,n] = softmax(n) S[b,h,m,n] + M[b,n]
O[b,m,h,e] = sum(n) P[b,h,m,n] * V[b,n,h,e]
out O
)")) << ir::ChainToText(a.chain);
  EXPECT_THAT(a.layers, HasSubstr("Q, K and V are the parts of 'EmbedLayerNormalization_0_output' projected by "
                                  "'Attention_0_qkv_weight' plus 'Attention_0_qkv_bias'"));
  EXPECT_THAT(a.layers, HasSubstr("from each row's key length"));
  const ModelChain& f = out->chains[1];
  EXPECT_EQ(f.instances, 2);
  EXPECT_EQ(f.key, Key(R"(dim a=8 s=128 c=64 f=256 o=64
in X[a,s,c] W1[c,f] W2[f,o] B1[f]
const W1 W2 B1
H[a,s,f] = sum(c) X[a,s,c] * W1[c,f]
A[a,s,f] = gelu(H[a,s,f] + B1[f])
Y[a,s,o] = sum(f) A[a,s,f] * W2[f,o]
out Y
)")) << ir::ChainToText(f.chain);
  EXPECT_THAT(f.layers, HasSubstr("is added by 'SkipLayerNorm_AddBias_1' (SkipLayerNormalization) after the chain"));
}

TEST(OnnxExportsTest, UnboundDimsAreNamed) {
  auto out = ExtractOnnx(std::string(FUSOR_SOURCE_DIR) + "/tests/common/zoo/exports/bert_torchscript_eager.onnx",
                         {{"batch", 8}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->chains.empty());
  ASSERT_FALSE(out->rejected.empty());
  for (const std::string& r : out->rejected) {
    EXPECT_THAT(r, HasSubstr("(unbound input dims: seq; bind them with --dim seq=N)"));
  }
}

}  // namespace
}  // namespace fusor::zoo
