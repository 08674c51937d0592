// Built-in model descriptions expand to the chains of their layers: the
// examples' published shapes, grouped-query attention, SwiGLU, an
// encoder-decoder's five chains, de-duplication, and clear errors.
#include "common/zoo/transformer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "common/util/files.h"
#include "common/hw/devices.h"
#include "common/ir/canonical.h"
#include "common/space/space.h"

namespace fusor::zoo {
namespace {

using ::testing::HasSubstr;

std::string Read(const std::string& path) { return ReadFile(path).value_or(""); }

TransformerConfig Example(const std::string& name) {
  auto c = ParseTransformerConfig(Read(std::string(FUSOR_SOURCE_DIR) + "/examples/models/" + name));
  EXPECT_TRUE(c.ok()) << name << ": " << c.status();
  return c.ok() ? *c : TransformerConfig();
}

const ir::Tensor& TensorNamed(const ir::Chain& chain, const std::string& name) {
  const int t = chain.FindTensor(name);
  EXPECT_GE(t, 0) << name;
  return chain.tensors[t >= 0 ? t : 0];
}

std::vector<int64_t> Extents(const ir::Chain& chain) {
  std::vector<int64_t> e;
  for (const ir::Dim& d : chain.dims) e.push_back(d.extent);
  return e;
}

TEST(TransformerTest, BertBaseHasItsPublishedShapes) {
  auto chains = ExpandTransformer(Example("bert_base.json"));
  ASSERT_TRUE(chains.ok()) << chains.status();
  ASSERT_EQ(chains->size(), 2u);
  const ModelChain& attention = (*chains)[0];
  EXPECT_EQ(attention.role, "self-attention");
  EXPECT_EQ(attention.layers, "layers 1-12");
  EXPECT_EQ(attention.instances, 12);
  // b=8 h=12 m=128 n=128 d=64 e=64, an additive padding mask per batch and key.
  EXPECT_EQ(Extents(attention.chain), (std::vector<int64_t>{8, 12, 128, 128, 64, 64}));
  EXPECT_EQ(TensorNamed(attention.chain, "M").shape, (std::vector<int64_t>{8, 128}));
  EXPECT_THAT(ir::ChainToText(attention.chain), HasSubstr("* 0.125"));
  const ModelChain& ffn = (*chains)[1];
  EXPECT_EQ(Extents(ffn.chain), (std::vector<int64_t>{1024, 768, 3072, 768}));  // 8 x 128 tokens
  EXPECT_THAT(ir::ChainToText(ffn.chain), HasSubstr("gelu("));
  EXPECT_GE(ffn.chain.FindTensor("B2"), 0);
}

TEST(TransformerTest, GroupedQueryAttentionSharesKAndVAcrossAGroup) {
  TransformerConfig c = Example("llama_7b.json");
  c.kv_heads = 8;
  auto chains = ExpandTransformer(c);
  ASSERT_TRUE(chains.ok()) << chains.status();
  const ir::Chain& attention = (*chains)[0].chain;
  EXPECT_EQ(TensorNamed(attention, "Q").shape, (std::vector<int64_t>{1, 8, 4, 2048, 128}));
  EXPECT_EQ(TensorNamed(attention, "K").shape, (std::vector<int64_t>{1, 8, 2048, 128}));
  EXPECT_EQ(attention.FindTensor("C"), -1);  // causal: the softmax's condition, no mask read
  EXPECT_THAT(ir::ChainToText(attention), HasSubstr("softmax(n <= m)"));
  // SwiGLU: two GEMMs into the gate, no biases.
  const ir::Chain& ffn = (*chains)[1].chain;
  int sums = 0;
  for (const ir::Op& op : ffn.ops) sums += op.kind == ir::OpKind::kSum;
  EXPECT_EQ(sums, 3);
  EXPECT_THAT(ir::ChainToText(ffn), HasSubstr("sigmoid("));
  EXPECT_EQ(ffn.FindTensor("B1"), -1);
}

TEST(TransformerTest, EncoderDecoderHasFiveChains) {
  auto chains = ExpandTransformer(Example("t5_base.json"));
  ASSERT_TRUE(chains.ok()) << chains.status();
  ASSERT_EQ(chains->size(), 5u);
  std::vector<std::string> roles;
  for (const ModelChain& m : *chains) roles.push_back(m.role);
  EXPECT_EQ(roles, (std::vector<std::string>{"self-attention", "ffn", "decoder self-attention", "cross-attention",
                                             "decoder ffn"}));
  // Decoder self-attention: position bias and a causal softmax; unscaled.
  const ir::Chain& dec = (*chains)[2].chain;
  EXPECT_EQ(TensorNamed(dec, "B").shape, (std::vector<int64_t>{12, 128, 128}));
  EXPECT_THAT(ir::ChainToText(dec), HasSubstr("softmax(n <= m) S[b,h,m,n] + B[h,m,n]"));
  EXPECT_THAT(ir::ChainToText(dec), ::testing::Not(HasSubstr(" * 0.")));
  // Cross-attention: decoder queries over encoder keys, no mask.
  const ir::Chain& cross = (*chains)[3].chain;
  EXPECT_EQ(TensorNamed(cross, "Q").shape, (std::vector<int64_t>{4, 12, 128, 64}));
  EXPECT_EQ(TensorNamed(cross, "K").shape, (std::vector<int64_t>{4, 12, 512, 64}));
  EXPECT_EQ(cross.inputs.size(), 3u);
  EXPECT_THAT(ir::ChainToText((*chains)[1].chain), HasSubstr("relu("));
}

TEST(TransformerTest, IdenticalChainsAreOneWithTheirInstances) {
  TransformerConfig c = Example("t5_base.json");
  ASSERT_TRUE(BindDims({{"target_seq", 512}}, c).ok());
  auto chains = ExpandTransformer(c);
  ASSERT_TRUE(chains.ok()) << chains.status();
  ASSERT_EQ(chains->size(), 4u);  // the two FFNs are the same chain
  EXPECT_EQ((*chains)[1].role, "ffn = decoder ffn");
  EXPECT_EQ((*chains)[1].instances, 24);
  EXPECT_EQ((*chains)[1].layers, "encoder layers 1-12; decoder layers 1-12");
}

TEST(TransformerTest, EveryExampleExpandsToChainsWithASpace) {
  const hw::TargetDesc gpu = *hw::LookupDevice("h200");
  for (const auto& entry : std::filesystem::directory_iterator(std::string(FUSOR_SOURCE_DIR) + "/examples/models")) {
    SCOPED_TRACE(entry.path().filename().string());
    TransformerConfig c = Example(entry.path().filename().string());
    // Small shapes keep the spaces quick; the structure is the model's.
    ASSERT_TRUE(BindDims({{"batch", 1}, {"seq", 32}}, c).ok());
    auto chains = ExpandTransformer(c);
    ASSERT_TRUE(chains.ok()) << chains.status();
    EXPECT_GE(chains->size(), 2u);
    for (const ModelChain& m : *chains) {
      EXPECT_GT(m.instances, 0);
      auto space = space::BuildSpace(m.chain, gpu);
      EXPECT_TRUE(space.ok() && !space->ranked.empty()) << m.chain.name << ": " << space.status();
    }
  }
}

TEST(TransformerTest, MalformedDescriptionsSayWhatIsWrong) {
  auto error = [](const std::string& json) {
    auto c = ParseTransformerConfig(json);
    EXPECT_FALSE(c.ok()) << json;
    return std::string(c.status().message());
  };
  const std::string ok = R"("hidden": 64, "heads": 4, "ffn": 128, "layers": 2, "seq": 16)";
  EXPECT_THAT(error("[1, 2]"), HasSubstr("JSON object"));
  EXPECT_THAT(error("{" + ok + "}"), HasSubstr("\"model\""));
  EXPECT_THAT(error(R"({"model": "m", "hidden": 64, "heads": 4, "ffn": 128, "seq": 16})"), HasSubstr("layers"));
  EXPECT_THAT(error(R"({"model": "m", "colour": 1, )" + ok + "}"), HasSubstr("unknown field \"colour\""));
  EXPECT_THAT(error(R"({"model": "m", "hidden": 65, "heads": 4, "ffn": 128, "layers": 2, "seq": 16})"),
              HasSubstr("heads must divide hidden"));
  EXPECT_THAT(error(R"({"model": "m", "kv_heads": 3, )" + ok + "}"), HasSubstr("kv_heads must divide heads"));
  EXPECT_THAT(error(R"({"model": "m", "activation": "swish", )" + ok + "}"), HasSubstr("activation"));
  EXPECT_THAT(error(R"({"model": "m", "dtype": "f8", )" + ok + "}"), HasSubstr("dtype"));
  EXPECT_THAT(error(R"({"model": "m", "architecture": "encoder-decoder", )" + ok + "}"), HasSubstr("decoder_layers"));
  EXPECT_THAT(error(R"({"model": "m", "hidden": "big", "heads": 4, "ffn": 128, "layers": 2, "seq": 16})"),
              HasSubstr("wrong type"));

  TransformerConfig c = Example("bert_base.json");
  EXPECT_THAT(std::string(BindDims({{"target_seq", 64}}, c).message()), HasSubstr("no dim 'target_seq'"));
  EXPECT_THAT(std::string(BindDims({{"seq", 0}}, c).message()), HasSubstr("at least 1"));
}

}  // namespace
}  // namespace fusor::zoo
