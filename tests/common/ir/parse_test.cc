#include "common/ir/parse.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <fstream>
#include <filesystem>

#include "absl/strings/str_replace.h"
#include "common/ir/canonical.h"
#include "tests/test_chains.h"

namespace fusor::ir {
namespace {

using ::testing::HasSubstr;

constexpr char kAttention[] = R"(
chain bert_base_attention
dtype f16
dim b=96 m=512 n=512 k=64 h=64   # b folds batch x heads
in  Q[b,m,k] K[b,n,k] V[b,n,h]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.125
P[b,m,n] = softmax(n) S[b,m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)";

absl::Status ParseError(const std::string& text) { return ParseChainText(text).status(); }

TEST(ParseChainTextTest, ParsesTheDesignExample) {
  auto chain = ParseChainText(kAttention);
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->name, "bert_base_attention");
  EXPECT_EQ(chain->dtype, DType::kF16);
  ASSERT_EQ(chain->dims.size(), 5u);
  EXPECT_EQ(chain->dims[0].extent, 96);
  ASSERT_EQ(chain->ops.size(), 3u);
  EXPECT_EQ(chain->ops[0].kind, OpKind::kSum);
  EXPECT_EQ(chain->ops[1].kind, OpKind::kSoftmax);
  EXPECT_EQ(chain->ops[1].axis, chain->FindDim("n"));
  EXPECT_EQ(chain->tensors[chain->FindTensor("S")].role, TensorRole::kIntermediate);
  EXPECT_EQ(chain->tensors[chain->FindTensor("O")].role, TensorRole::kOutput);
  EXPECT_EQ(chain->tensors[chain->FindTensor("S")].shape, (std::vector<int64_t>{96, 512, 512}));
  EXPECT_DOUBLE_EQ(ChainFlops(*chain), 2.0 * 96 * 512 * 512 * 64 * 2 + 4.0 * 96 * 512 * 512);
}

TEST(ParseChainTextTest, ReadsAffineIndicesAndEpilogues) {
  auto chain = ParseChainText(R"(
chain conv
dim n=1 c=8 k=4 p=5 q=5 r=3 s=3
in I[n,c,11,11] W[k,c,r,s] B[k]
T[n,k,p,q] = sum(c,r,s) I[n,c,p*2+r,2*q+s] * W[k,c,r,s]
U[n,k,p,q] = gelu(T[n,k,p,q] + B[k]) - relu(-T[n,k,p,q]) / 2
out U
)");
  ASSERT_TRUE(chain.ok()) << chain.status();
  const Access& in = chain->ops[0].body.args[0].access;
  EXPECT_EQ(in.index[2].Coefficient(chain->FindDim("p")), 2);
  EXPECT_EQ(in.index[2].Coefficient(chain->FindDim("r")), 1);
  EXPECT_EQ(in.index[3].Coefficient(chain->FindDim("q")), 2);
}

TEST(ParseChainTextTest, RoundTripsThroughTextAndJson) {
  auto chain = ParseChainText(kAttention);
  ASSERT_TRUE(chain.ok());
  auto again = ParseChainText(ChainToText(*chain));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ChainToText(*again), ChainToText(*chain));
  auto from_json = ParseChainJson(ChainToJson(*chain));
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  EXPECT_EQ(ChainToText(*from_json), ChainToText(*chain));
  EXPECT_EQ(Canonicalize(*from_json).key, Canonicalize(*chain).key);
}

// A model's weights declared constant: kept through text, JSON and the
// canonical form, and part of the key (a kernel may prepare them once).
TEST(ParseChainTextTest, ConstantInputsRoundTripAndChangeTheKey) {
  const std::string ffn = testing::kConstFfn;
  auto chain = ParseChainText(ffn);
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_FALSE(chain->tensors[chain->FindTensor("X")].constant);
  for (const char* w : {"W1", "B1", "W2"}) EXPECT_TRUE(chain->tensors[chain->FindTensor(w)].constant) << w;
  EXPECT_THAT(ChainToText(*chain), HasSubstr("\nconst W1 B1 W2\n"));
  auto from_json = ParseChainJson(ChainToJson(*chain));
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  EXPECT_EQ(ChainToText(*from_json), ChainToText(*chain));
  const CanonicalForm form = Canonicalize(*chain);
  EXPECT_THAT(form.text, HasSubstr("\nconst "));
  EXPECT_EQ(Canonicalize(*from_json).key, form.key);
  std::string plain = ffn;
  plain.erase(plain.find("const W1 B1 W2\n"), std::string("const W1 B1 W2\n").size());
  EXPECT_NE(Canonicalize(*ParseChainText(plain)).key, form.key);
  // Only inputs, declared first, can be constant.
  std::string bad = ffn;
  bad.replace(bad.find("const W1"), 8, "const H");
  EXPECT_THAT(ParseError(bad).message(), HasSubstr("'H' is not an input declared before this line"));
  EXPECT_THAT(std::string(ParseChainJson(R"({"name": "c", "dims": [{"name": "m", "extent": 2}],
      "inputs": [{"name": "X", "shape": ["m"], "constant": 1}], "ops": [], "outputs": []})")
                              .status()
                              .message()),
              HasSubstr("expected true or false"));
}

// Causality is written in the softmax's parentheses, kept through text,
// JSON and the canonical form, and part of the key.
TEST(ParseChainTextTest, CausalSoftmaxRoundTripsAndChangesTheKey) {
  auto with = [](const std::string& axis) {
    std::string text = kAttention;
    text.replace(text.find("softmax(n)"), 10, "softmax(" + axis + ")");
    return text;
  };
  auto chain = ParseChainText(with("n <= m"));
  ASSERT_TRUE(chain.ok()) << chain.status();
  const Op& softmax = chain->ops[1];
  EXPECT_EQ(softmax.causal_row, chain->FindDim("m"));
  EXPECT_EQ(softmax.causal_offset, 0);
  EXPECT_THAT(ChainToText(*chain), HasSubstr("= softmax(n <= m) S[b,m,n]"));
  auto offset = ParseChainText(with("n<=m+7"));
  ASSERT_TRUE(offset.ok()) << offset.status();
  EXPECT_EQ(offset->ops[1].causal_offset, 7);
  EXPECT_THAT(ChainToText(*offset), HasSubstr("softmax(n <= m + 7)"));
  for (const Chain* c : {&*chain, &*offset}) {
    auto from_json = ParseChainJson(ChainToJson(*c));
    ASSERT_TRUE(from_json.ok()) << from_json.status();
    EXPECT_EQ(ChainToText(*from_json), ChainToText(*c));
    EXPECT_EQ(Canonicalize(*from_json).key, Canonicalize(*c).key);
    EXPECT_EQ(ChainToText(*ParseChainText(ChainToText(*c))), ChainToText(*c));
  }
  const std::string plain = Canonicalize(*ParseChainText(kAttention)).key;
  EXPECT_NE(Canonicalize(*chain).key, plain);
  EXPECT_NE(Canonicalize(*offset).key, plain);
  EXPECT_NE(Canonicalize(*offset).key, Canonicalize(*chain).key);
  // The canonical form keeps the condition on its renamed dims.
  EXPECT_THAT(Canonicalize(*chain).text, HasSubstr(" <= d"));

  EXPECT_TRUE(ParseChainText(with("n <= b")).ok());  // any other dim of the index
  EXPECT_THAT(ParseError(with("n <= n")).message(), HasSubstr("compares the axis with another dim of the output"));
  EXPECT_THAT(ParseError(with("n <= k")).message(), HasSubstr("compares the axis with another dim of the output"));
  EXPECT_THAT(ParseError(with("n <= x")).message(), HasSubstr("unknown dim 'x'"));
  EXPECT_THAT(ParseError(with("n <= m + 512")).message(), HasSubstr("must be in [0, 512)"));
  EXPECT_THAT(ParseError(with("n <= m + x")).message(), HasSubstr("expected an integer offset after '+'"));
  EXPECT_THAT(ParseError(with("n <")).message(), HasSubstr("expected '='"));
  EXPECT_THAT(ParseError(with("n, m")).message(), HasSubstr("softmax takes exactly one axis"));
  EXPECT_THAT(std::string(ParseChainJson(absl::StrReplaceAll(ChainToJson(*chain), {{"n <= m", "n <= m - 1"}}))
                              .status()
                              .message()),
              HasSubstr("a causal softmax is written softmax(n <= m)"));
}

struct BadCase {
  const char* text;
  const char* message;
};

class BadTextTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadTextTest, NamesLineAndColumn) {
  absl::Status st = ParseError(GetParam().text);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Errors, BadTextTest,
    ::testing::Values(
        BadCase{"dim m=4\nin A[m]\nB[m] = A[m] +\nout B", "line 3, column 14: expected a tensor access"},
        BadCase{"dim m=4\nin A[m]\nB[m] = A[x]\nout B", "line 3, column 10: unknown dim 'x' in index"},
        BadCase{"dim m=4\nin A[m]\nB[m] = C[m]\nout B", "line 3, column 8: unknown tensor 'C'"},
        BadCase{"dim m=4 m=5\nin A[m]\nB[m] = A[m]\nout B", "line 1, column 9: dim 'm' is declared twice"},
        BadCase{"dim m=4\nin A[m]\nB[m] = A[m+1]\nout B", "index 'm+1' of 'A' axis 0 ranges over [1, 4]"},
        BadCase{"dim m=4 k=3\nin A[m,k]\nB[m] = A[m,k]\nout B", "dim 'k' is used in the expression but is not"},
        BadCase{"dim m=4\nin A[m]\nB[m] = A[m*m]\nout B", "not affine"},
        BadCase{"dim m=4\nin A[m]\nB[m] = A[m] $ 2\nout B", "line 3, column 13: unexpected character '$'"},
        BadCase{"dim m=0\nin A[m]\nB[m] = A[m]\nout B", "line 1, column 5: dim 'm' has extent 0"},
        BadCase{"dim m=4\nin A[m]\nB[m] = A[m]\nout C", "line 4, column 5: unknown output tensor 'C'"},
        BadCase{"dim m=4\nin A[m]\nB[m] = A[m]", "names no output"},
        BadCase{"dim m=4\nin A[m]\nB[m] = sum(m) A[m]\nout B", "is both in the output index and reduced"},
        BadCase{"dim m=4 k=2\nin A[m,k]\nB[m] = softmax(k) A[m,k]\nout B", "softmax axis 'k' is not in the output"},
        BadCase{"dim m=4\nin A[m] X[m]\nB[m] = A[m]\nout B", "input 'X' is never used"},
        BadCase{"dim m=4\nin A[m]\nB[m] = A[m]\nC[m] = A[m]\nout B", "line 4, column 1: result 'C' is neither used"},
        BadCase{"dim m=4\nin A[m]\nB[m] = A[m, m]\nout B", "has 1 axes but is indexed with 2"},
        BadCase{"dim sum=4\nin A[sum]\nB[sum] = A[sum]\nout B", "reserved word"},
        BadCase{"dtype f8\ndim m=4\nin A[m]\nB[m] = A[m]\nout B", "line 1, column 7: unknown dtype 'f8'"},
        BadCase{"dim m=4\nin A[m]\nB m = A[m]\nout B", "line 3, column 3: expected '['"}));

TEST(ParseChainTextTest, EnforcesLimits) {
  Limits limits;
  limits.max_spec_bytes = 100;
  absl::Status st = ParseChainText(std::string(kAttention), limits).status();
  EXPECT_THAT(std::string(st.message()), HasSubstr("limit is 100"));

  std::string many_dims = "dim";
  for (int i = 0; i < 20; ++i) many_dims += " d" + std::to_string(i) + "=2";
  st = ParseError(many_dims + "\nin A[d0]\nB[d0] = A[d0]\nout B");
  EXPECT_THAT(std::string(st.message()), HasSubstr("20 dims; the limit is 16"));

  st = ParseError("dim m=100000000\nin A[m]\nB[m] = A[m]\nout B");
  EXPECT_THAT(std::string(st.message()), HasSubstr("extents must be in [1, 16777216]"));

  st = ParseError("dim m=16000000 n=16000000\nin A[m,n]\nB[m,n] = A[m,n]\nout B");
  EXPECT_THAT(std::string(st.message()), HasSubstr("elements; the limit is"));

  std::string wide = "A[m]";
  for (int i = 0; i < 200; ++i) wide += " + A[m]";
  st = ParseError("dim m=4\nin A[m]\nB[m] = " + wide + "\nout B");
  EXPECT_THAT(std::string(st.message()), HasSubstr("more than 256 nodes"));

  std::string deep = "A[m]";
  for (int i = 0; i < 100; ++i) deep = "relu(" + deep + ")";
  st = ParseError("dim m=4\nin A[m]\nB[m] = " + deep + "\nout B");
  EXPECT_THAT(std::string(st.message()), HasSubstr("nests deeper than 64 levels"));
}

TEST(ParseChainJsonTest, AcceptsProtoJsonAndNamesFields) {
  const char* good = R"({"chain": {"name": "g", "dtype": "DTYPE_F32",
    "dims": [{"name": "m", "extent": "8"}, {"name": "k", "extent": 4}],
    "inputs": [{"name": "A", "shape": ["m", "k"]}, {"name": "B", "shape": ["k", "m"]}],
    "ops": [{"output": "C", "index": ["m"], "kind": "OP_KIND_SUM", "reduce": ["k"], "expr": "A[m,k] * B[k,m]"}],
    "outputs": ["C"]}})";
  auto chain = ParseChainJson(good);
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->dims[0].extent, 8);

  struct Case {
    std::string json, message;
  } cases[] = {
      {R"({"dims": [{"name": "m"}]})", "dims[0].extent: missing"},
      {R"({"dims": [{"name": "m", "extent": 4, "size": 1}]})", "dims[0].size: unknown field"},
      {R"({"dims": [{"name": "m", "extent": 4}], "inputs": [{"name": "A", "shape": ["m"]}],
          "ops": [{"output": "B", "index": ["m"], "expr": "A[m] + Z[m]"}], "outputs": ["B"]})",
       "ops[0].expr, column 8: unknown tensor 'Z'"},
      {R"({"dims": [{"name": "m", "extent": 4}], "inputs": [{"name": "A", "shape": ["m"]}],
          "ops": [{"output": "B", "index": ["m"], "kind": "max", "expr": "A[m]"}], "outputs": ["B"]})",
       "ops[0].kind: unknown op kind 'max'"},
      {R"({"dims": [ {"name": "m", "extent": 4} )", "malformed at byte"},
      {R"({"text": "dim m=4\nin A[m]\nB[m] = A[q]\nout B"})", "line 3, column 10: unknown dim 'q'"},
  };
  for (const Case& c : cases) {
    absl::Status st = ParseChainJson(c.json).status();
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << c.json;
    EXPECT_THAT(std::string(st.message()), HasSubstr(c.message)) << c.json;
  }
}

TEST(CanonicalKeyTest, InvariantUnderRenamingWhitespaceAndOrder) {
  const std::string base = Canonicalize(*ParseChainText(kAttention)).key;
  // Tensors and dims renamed, inputs and operands reordered, comments,
  // extra spaces, an unused dim, a constant written differently.
  auto renamed = ParseChainText(R"(
# same attention, other names
chain other_name
dtype f16
dim   hd=64   q=512 batch=96  kv=512 unused=7 vd=64
in  Vv[batch,kv,vd]   Kk[batch,kv,hd]
in  Qq[batch,q,hd]
Scores[batch,q,kv] = sum(hd)   1.25e-1 * Kk[batch,kv,hd] * Qq[batch,q,hd]
Probs[batch,q,kv] = softmax(kv) Scores[batch,q,kv]
Out[batch,q,vd] = sum(kv) Vv[batch,kv,vd] * Probs[batch,q,kv]
out Out
)");
  ASSERT_TRUE(renamed.ok()) << renamed.status();
  EXPECT_EQ(Canonicalize(*renamed).key, base);
}

TEST(CanonicalKeyTest, ChangesWithShapeDtypeOrComputation) {
  const std::string base = Canonicalize(*ParseChainText(kAttention)).key;
  auto variant = [](const std::string& from, const std::string& to) {
    std::string text = kAttention;
    text.replace(text.find(from), from.size(), to);
    auto chain = ParseChainText(text);
    EXPECT_TRUE(chain.ok()) << chain.status() << "\n" << text;
    return Canonicalize(*chain).key;
  };
  EXPECT_NE(variant("m=512", "m=256"), base);
  EXPECT_NE(variant("dtype f16", "dtype bf16"), base);
  EXPECT_NE(variant("* 0.125", "* 0.25"), base);
  EXPECT_NE(variant("softmax(n) S[b,m,n]", "softmax(n) S[b,m,n] * 2"), base);
  EXPECT_NE(variant("K[b,n,k] * 0.125", "K[b,n,k] * -0.125"), base);
  EXPECT_NE(variant("O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]", "O[b,m,h] = sum(n) P[b,m,n] + V[b,n,h]"), base);
}

TEST(CanonicalKeyTest, MapsDimsAndTensorsBothWays) {
  auto chain = ParseChainText(kAttention);
  CanonicalForm form = Canonicalize(*chain);
  // The canonical chain parses back to itself.
  auto again = ParseChainText(form.text);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << form.text;
  EXPECT_EQ(Canonicalize(*again).text, form.text);
  for (size_t d = 0; d < chain->dims.size(); ++d) {
    ASSERT_GE(form.dim_map[d], 0);
    EXPECT_EQ(form.chain.dims[form.dim_map[d]].extent, chain->dims[d].extent);
  }
  int o = chain->FindTensor("O");
  EXPECT_EQ(form.chain.tensors[form.tensor_map[o]].role, TensorRole::kOutput);
}

// Inputs the JSON fuzzer found that ended the process (an exception the
// reader did not catch) are errors now; every file the fuzzer keeps in
// tests/fuzz/regressions/proto_json is one.
TEST(ParseJsonTest, FuzzerRegressionsAreErrors) {
  for (const std::string json : {std::string("8.8888884e18888b[b"), std::string(R"({"name":"x","dims":[{"name":"m",
      "extent":"-"}],"inputs":[],"ops":[],"outputs":[]})"), std::string(R"({"name":"x","dims":[{"name":"m",
      "extent":18446744073709551615}],"inputs":[],"ops":[],"outputs":[]})")}) {
    auto chain = ParseChainJson(json);
    EXPECT_TRUE(absl::IsInvalidArgument(chain.status())) << json << ": " << chain.status();
  }
  const std::string dir = std::string(FUSOR_SOURCE_DIR) + "/tests/fuzz/regressions/proto_json";
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_FALSE(ParseChainJson(bytes).ok()) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 2);
}

}  // namespace
}  // namespace fusor::ir
