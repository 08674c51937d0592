#include "common/search/search_strategy.h"

#include <gtest/gtest.h>

#include "common/ir/parse.h"
#include "tests/test_chains.h"

namespace fusor::search {
namespace {

TEST(TileSearchTest, DeterministicRankedWithinBudgetAndCountsPruning) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  hw::TargetDesc target;
  target.compute_units = 2;
  target.isa_features = {"avx2", "fma"};
  target.vector_lanes_f32 = 8;
  target.l1d_bytes = 32 << 10;
  target.l2_bytes = 256 << 10;
  auto a = MakeModelRankedTileSearch();
  auto b = MakeModelRankedTileSearch();
  ASSERT_TRUE(a->Initialize({&*chain, target, 5}).ok());
  ASSERT_TRUE(b->Initialize({&*chain, target, 5}).ok());
  SpaceStats stats = a->Stats();
  int64_t pruned = 0;
  for (const auto& [rule, count] : stats.pruned_by_rule) pruned += count;
  EXPECT_EQ(stats.total, stats.after_pruning + pruned);
  EXPECT_GT(stats.after_pruning, 5);
  std::vector<std::string> seen;
  double last = 0;
  while (!a->Done()) {
    auto batch_a = a->NextBatch(2);
    auto batch_b = b->NextBatch(2);
    ASSERT_EQ(batch_a.size(), batch_b.size());
    for (size_t i = 0; i < batch_a.size(); ++i) {
      EXPECT_EQ(batch_a[i].schedule_text, batch_b[i].schedule_text);
      EXPECT_GE(batch_a[i].prediction.t_estm_s, last);
      last = batch_a[i].prediction.t_estm_s;
      seen.push_back(batch_a[i].schedule_text);
    }
    a->NotifyResults({});
  }
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_TRUE(a->NextBatch(2).empty());
}

TEST(TileSearchTest, FailsClearlyWhenNothingFits) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  hw::TargetDesc tiny;
  tiny.l1d_bytes = 64;
  tiny.l2_bytes = 64;
  auto s = MakeModelRankedTileSearch();
  absl::Status st = s->Initialize({&*chain, tiny, 4});
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
}

TEST(TileSearchTest, UnavoidablePaddingIsNotPruned) {
  // h=16 is narrower than the 32-column micro-kernel: every schedule pads.
  auto chain = ir::ParseChainText(R"(
dim m=64 k=16 n=48 h=16
in A[m,k] B[k,n] D[n,h]
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
out E
)");
  hw::TargetDesc target;
  target.isa_features = {"avx512f"};
  target.vector_lanes_f32 = 16;
  target.l2_bytes = 1 << 20;
  auto s = MakeModelRankedTileSearch();
  ASSERT_TRUE(s->Initialize({&*chain, target, 4}).ok());
  EXPECT_EQ(s->NextBatch(4).size(), 4u);
}

TEST(DescribeMappingTest, NamesTheDimsOfEachRole) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  EXPECT_EQ(DescribeMapping(*chain, {"k.8x32", 8, 8, 32}),
            "k.8x32 C[batch=- rows=m cols=n k=k] E[batch=- rows=m cols=h k=n]");
}

}  // namespace
}  // namespace fusor::search
