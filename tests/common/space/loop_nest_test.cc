#include "common/space/loop_nest.h"

#include <gtest/gtest.h>

#include "common/ir/parse.h"
#include "tests/test_chains.h"
#include "common/space/schedule.h"

namespace fusor::space {
namespace {

const hw::CpuMicroKernel kKernel{"test.8x32", 8, 8, 32};

const Statement* Find(const LoopNest& nest, const std::string& label) {
  for (const Statement& s : nest.statements) {
    if (s.label == label) return &s;
  }
  return nullptr;
}

TEST(FusableDimsTest, FindsDimsSharedByEveryOp) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  ASSERT_TRUE(chain.ok());
  EXPECT_EQ(FusableDims(*chain), (std::vector<int>{chain->FindDim("m")}));
  auto attention = ir::ParseChainText(R"(
dim b=2 m=8 n=8 k=4 h=4
in Q[b,m,k] K[b,n,k] V[b,n,h]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k]
P[b,m,n] = softmax(n) S[b,m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)");
  ASSERT_TRUE(attention.ok());
  EXPECT_EQ(FusableDims(*attention), (std::vector<int>{attention->FindDim("b"), attention->FindDim("m")}));
  // Reading the intermediate transposed breaks fusion along m and n.
  auto transposed = ir::ParseChainText(R"(
dim m=8 n=8
in A[m,n]
T[m,n] = relu(A[m,n])
U[m,n] = T[n,m] * 2
out U
)");
  ASSERT_TRUE(transposed.ok());
  EXPECT_TRUE(FusableDims(*transposed).empty());
}

TEST(GemmFormTest, ClassifiesBatchRowsAndColumns) {
  auto chain = ir::ParseChainText(R"(
dim b=2 m=8 n=8 k=4
in Q[b,m,k] K[b,n,k]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.5
out S
)");
  GemmForm g = AnalyzeGemmForm(chain->ops[0], *chain);
  ASSERT_TRUE(g.ok);
  EXPECT_DOUBLE_EQ(g.scale, 0.5);
  EXPECT_EQ(g.batch, (std::vector<int>{chain->FindDim("b")}));
  EXPECT_EQ(g.rows, (std::vector<int>{chain->FindDim("m")}));
  EXPECT_EQ(g.cols, (std::vector<int>{chain->FindDim("n")}));
  auto generic = ir::ParseChainText("dim m=4 k=4\nin A[m,k]\nS[m] = sum(k) relu(A[m,k])\nout S");
  EXPECT_FALSE(AnalyzeGemmForm(generic->ops[0], *generic).ok);
}

// The statements and their LP_sets after hoisting, worked out by hand for block[m=16] n=32 h=16 (k and the n of the second
// op's reduction keep one trip or two as noted).
TEST(LoopNestTest, HoistsLoadsAndCountsTrafficByHand) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  ASSERT_TRUE(chain.ok());
  auto schedule = ParseSchedule("block[m=16] n=32 h=16", *chain);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  auto nest = BuildLoopNest(*chain, *schedule, kKernel);
  ASSERT_TRUE(nest.ok()) << nest.status();
  const int m = chain->FindDim("m"), n = chain->FindDim("n"), h = chain->FindDim("h");
  EXPECT_EQ(nest->num_blocks, 4);
  // Op C: k has one tile, so its loop vanishes and A hoists out of n.
  EXPECT_EQ(nest->ops[0].loops, (std::vector<int>{n}));
  EXPECT_EQ(nest->ops[0].a_depth, 0);
  EXPECT_EQ(nest->ops[0].b_depth, 1);
  const Statement* la = Find(*nest, "L(A)");
  ASSERT_NE(la, nullptr);
  EXPECT_EQ(la->loops, (std::vector<int>{m}));
  EXPECT_DOUBLE_EQ(la->bytes, 16 * 32 * 4);
  EXPECT_DOUBLE_EQ(la->executions, 4);
  const Statement* lb = Find(*nest, "L(B)");
  EXPECT_EQ(lb->loops, (std::vector<int>{m, n}));
  EXPECT_DOUBLE_EQ(lb->bytes, 32 * 32 * 4);
  EXPECT_DOUBLE_EQ(lb->executions, 8);
  // Op E: loops h then n (reduced); D depends on both; C is block-local.
  EXPECT_EQ(nest->ops[1].loops, (std::vector<int>{h, n}));
  EXPECT_EQ(Find(*nest, "L(C)"), nullptr);
  const Statement* ld = Find(*nest, "L(D)");
  EXPECT_EQ(ld->loops, (std::vector<int>{m, h, n}));
  EXPECT_DOUBLE_EQ(ld->bytes, 32 * 16 * 4);
  EXPECT_DOUBLE_EQ(ld->executions, 16);
  const Statement* se = Find(*nest, "S(E)");
  EXPECT_EQ(se->loops, (std::vector<int>{m, h}));
  EXPECT_DOUBLE_EQ(se->bytes, 16 * 16 * 4);
  // Padded compute: C's tile is 16 x 32 (n=32), E's 16 x 16 padded to 32 columns.
  EXPECT_DOUBLE_EQ(Find(*nest, "C(C)")->flops, 2.0 * 16 * 32 * 32);
  EXPECT_DOUBLE_EQ(Find(*nest, "C(E)")->flops, 2.0 * 16 * 32 * 32);
  EXPECT_EQ(nest->local_floats[chain->FindTensor("C")], 16 * 64);

}

TEST(LoopNestTest, RejectsSchedulesThatDoNotFit) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  Schedule s = UntiledSchedule(*chain);
  s.block_dims = {chain->FindDim("n")};
  EXPECT_FALSE(BuildLoopNest(*chain, s, kKernel).ok());
  EXPECT_FALSE(ParseSchedule("block[m=0]", *chain).ok());
  EXPECT_FALSE(ParseSchedule("block[m=16] q=4", *chain).ok());
  EXPECT_FALSE(ParseSchedule("block[m=16] m=4", *chain).ok());
}

}  // namespace
}  // namespace fusor::space
