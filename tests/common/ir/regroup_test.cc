#include "common/ir/regroup.h"

#include <random>

#include <gtest/gtest.h>

#include "common/ir/parse.h"
#include "common/ir/reference.h"
#include "tests/test_chains.h"

namespace fusor::ir {
namespace {

std::vector<std::vector<double>> Random(const Chain& chain, int seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<std::vector<double>> in;
  for (int t : chain.inputs) {
    in.emplace_back(chain.tensors[t].NumElements());
    for (double& x : in.back()) x = u(rng);
  }
  return in;
}

// Both association orders compute the same outputs (float64, so up to
// rounding of a different summation order).
void ExpectSameOutputs(const Chain& a, const Chain& b) {
  auto in = Random(a, 3);
  auto ra = EvaluateReference(a, in);
  auto rb = EvaluateReference(b, in);
  ASSERT_TRUE(ra.ok() && rb.ok());
  ASSERT_EQ(ra->size(), rb->size());
  for (size_t o = 0; o < ra->size(); ++o) {
    for (size_t i = 0; i < (*ra)[o].size(); ++i) EXPECT_NEAR((*ra)[o][i], (*rb)[o][i], 1e-9);
  }
}

TEST(RegroupTest, GemmChainRegroupsIntoTheSmallIntermediate) {
  auto chain = ParseChainText(testing::kGemmChain);
  ASSERT_TRUE(chain.ok());
  std::vector<Regroup> all = Regroupings(*chain);
  // (A*D)*B would contract nothing first: an outer product, not offered.
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(RegroupToText(*chain, all[0]), "E=A*(B*D)");
  auto regrouped = ApplyRegroup(*chain, all[0]);
  ASSERT_TRUE(regrouped.ok()) << regrouped.status();
  EXPECT_EQ(OpToString(regrouped->ops[0], *regrouped), "B_D[k,h] = sum(n) B[k,n] * D[n,h]");
  EXPECT_EQ(OpToString(regrouped->ops[1], *regrouped), "E[m,h] = sum(k) A[m,k] * B_D[k,h]");
  EXPECT_EQ(regrouped->inputs, chain->inputs);
  EXPECT_EQ(regrouped->outputs, chain->outputs);
  ExpectSameOutputs(*chain, *regrouped);
}

TEST(RegroupTest, ParsesItsTextInEitherOrderAndRefusesOthers) {
  auto chain = ParseChainText(testing::kGemmChain);
  auto r = ParseRegroup(" E = A * ( B*D ) ", *chain);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, Regroupings(*chain)[0]);
  EXPECT_TRUE(ParseRegroup("E=(D*B)*A", *chain).ok());
  for (const char* bad : {"E=(A*B)*D", "E=A*(B*X)", "C=A*(B*D)", "E=D*(A*B)", "E=A*B*D", "E=A*(B*D*A)"}) {
    EXPECT_FALSE(ParseRegroup(bad, *chain).ok()) << bad;
  }
}

TEST(RegroupTest, KeepsBatchDimsScalesAndTransposedOperands) {
  auto chain = ParseChainText(R"(
dim b=3 m=7 k=5 n=11 h=4
in A[b,k,m] B[b,n,k] D[b,h,n]
C[b,m,n] = sum(k) A[b,k,m] * B[b,n,k] * 0.5
E[b,m,h] = sum(n) -C[b,m,n] * D[b,h,n] * 3
out E
)");
  ASSERT_TRUE(chain.ok()) << chain.status();
  std::vector<Regroup> all = Regroupings(*chain);
  ASSERT_EQ(all.size(), 1u);
  auto regrouped = ApplyRegroup(*chain, all[0]);
  ASSERT_TRUE(regrouped.ok()) << regrouped.status();
  EXPECT_EQ(OpToString(regrouped->ops[0], *regrouped), "B_D[b,k,h] = sum(n) B[b,n,k] * D[b,h,n]");
  ExpectSameOutputs(*chain, *regrouped);
}

TEST(RegroupTest, ThreeGemmsRegroupEachPairOnItsOwn) {
  auto chain = ParseChainText(R"(
dim m=6 k=5 n=9 h=4 g=3
in A[m,k] B[k,n] D[n,h] F[h,g]
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
G[m,g] = sum(h) E[m,h] * F[h,g]
out G
)");
  ASSERT_TRUE(chain.ok());
  std::vector<Regroup> all = Regroupings(*chain);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(RegroupToText(*chain, all[0]), "E=A*(B*D)");
  EXPECT_EQ(RegroupToText(*chain, all[1]), "G=C*(D*F)");
  for (const Regroup& r : all) {
    auto regrouped = ApplyRegroup(*chain, r);
    ASSERT_TRUE(regrouped.ok()) << regrouped.status();
    ExpectSameOutputs(*chain, *regrouped);
  }
}

TEST(RegroupTest, NothingNonlinearOutputOrSharedIsRegrouped) {
  for (const char* text : {
           // A GELU between the sums.
           "dim m=4 c=5 f=6 o=3\nin X[m,c] W1[c,f] W2[f,o]\nH[m,f] = sum(c) X[m,c] * W1[c,f]\n"
           "G[m,f] = gelu(H[m,f])\nY[m,o] = sum(f) G[m,f] * W2[f,o]\nout Y",
           // The intermediate is an output too.
           "dim m=4 k=5 n=6 h=3\nin A[m,k] B[k,n] D[n,h]\nC[m,n] = sum(k) A[m,k] * B[k,n]\n"
           "E[m,h] = sum(n) C[m,n] * D[n,h]\nout E C",
           // The intermediate is read twice.
           "dim m=4 k=5 n=6\nin A[m,k] B[k,n]\nC[m,n] = sum(k) A[m,k] * B[k,n]\n"
           "E[m] = sum(n) C[m,n] * C[m,n]\nout E",
           // A softmax between (attention).
           "dim m=4 n=6 k=5 h=3\nin Q[m,k] K[n,k] V[n,h]\nS[m,n] = sum(k) Q[m,k] * K[n,k]\n"
           "P[m,n] = softmax(n) S[m,n]\nO[m,h] = sum(n) P[m,n] * V[n,h]\nout O",
       }) {
    auto chain = ParseChainText(text);
    ASSERT_TRUE(chain.ok()) << chain.status();
    EXPECT_TRUE(Regroupings(*chain).empty()) << text;
  }
}

TEST(RegroupTest, ApplyRefusesWhatIsNotARegrouping) {
  auto chain = ParseChainText(testing::kGemmChain);
  Regroup as_written{1, {chain->FindTensor("A"), chain->FindTensor("B")}};
  EXPECT_FALSE(ApplyRegroup(*chain, as_written).ok());
  EXPECT_FALSE(ApplyRegroup(*chain, Regroup{0, {1, 2}}).ok());
}

}  // namespace
}  // namespace fusor::ir
