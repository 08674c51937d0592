#include "common/space/schedule.h"

#include <gtest/gtest.h>

#include "common/ir/parse.h"
#include "tests/test_chains.h"

namespace fusor::space {
namespace {

TEST(ScheduleTest, PrintsParsesAndRemaps) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  auto s = ParseSchedule("block[m=16] n=32 h=16", *chain);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(ScheduleToText(*s, *chain), "block[m=16] n=32 h=16");
  auto renamed = ir::ParseChainText(R"(
dim i=64 j=64 l=32 o=32
in A[i,l] B[l,j] D[j,o]
C[i,j] = sum(l) A[i,l] * B[l,j]
E[i,o] = sum(j) C[i,j] * D[j,o]
out E
)");
  std::vector<int> map = {0, 1, 2, 3};  // m->i, n->j, k->l, h->o
  EXPECT_EQ(ScheduleToText(RemapSchedule(*s, map, *renamed), *renamed), "block[i=16] j=32 o=16");
}

TEST(ScheduleTest, RejectsMalformedText) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  for (const char* bad : {"m=16", "block[m=16", "block[m=0]", "block[m=65]", "block[m=16] q=4",
                          "block[m=16] m=4", "block[m=x]"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseSchedule(bad, *chain).status())) << bad;
  }
}

}  // namespace
}  // namespace fusor::space
