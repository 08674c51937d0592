#include "common/space/schedule.h"

#include <gtest/gtest.h>

#include "common/ir/parse.h"
#include "tests/test_chains.h"

namespace fusor::space {
namespace {

TEST(ScheduleTest, PrintsParsesAndCanonicalizes) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  auto s = ParseSchedule(" h=16 m=16 / n=32 / C(k=16) ", *chain);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(ScheduleToText(*s, *chain), "m=16 h=16 / n=32 / C(k=16)");
  EXPECT_EQ(TilingExpression(*s, *chain), "mhnk");
  // Loops of one trip vanish: h=32 is the full extent.
  auto t = ParseSchedule("m=16 h=32 / n=32 / C(k=16) E(h=32)", *chain);
  EXPECT_EQ(ScheduleToText(*t, *chain), "m=16 / n=32 / C(k=16)");
  EXPECT_EQ(ScheduleToText(UntiledSchedule(*chain), *chain), "- / - / -");
  auto flat = ParseSchedule("m=16 / n=32 / C(k=16) E(h=16)", *chain);
  EXPECT_EQ(TilingExpression(*flat, *chain), "mn(k,h)");
  auto back = ParseSchedule(ScheduleToText(*flat, *chain), *chain);
  EXPECT_EQ(Canonical(*back, *chain), Canonical(*flat, *chain));
}

TEST(ScheduleTest, RemapsToRenamedChains) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  auto s = ParseSchedule("m=16 / n=32 / C(k=16) E(h=16)", *chain);
  auto renamed = ir::ParseChainText(R"(
dim i=64 j=64 l=32 o=32
in A[i,l] B[l,j] D[j,o]
X[i,j] = sum(l) A[i,l] * B[l,j]
Y[i,o] = sum(j) X[i,j] * D[j,o]
out Y
)");
  EXPECT_EQ(ScheduleToText(RemapSchedule(*s, {0, 1, 2, 3}, {0, 1}, *renamed), *renamed),
            "i=16 / j=32 / X(l=16) Y(o=16)");
}

// A CUDA schedule's launch: only what differs from the default is printed,
// after the mappings; it survives renaming; a CPU nest refuses it.
TEST(ScheduleTest, CarriesTheCudaLaunch) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  auto s = ParseSchedule("m=16 / n=32 / - /  cuda  stages=1 warps=8", *chain);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(WarpsOf(*s), 8);
  EXPECT_EQ(StagesOf(*s), 1);
  EXPECT_EQ(ScheduleToText(*s, *chain), "m=16 / n=32 / - / cuda warps=8 stages=1");
  auto mapped = ParseSchedule("m=16 / n=32 / - / C=fma.avx2.6x16[i=m j=n k=k] / cuda warps=2", *chain);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(mapped->warps, 2);
  EXPECT_NE(mapped->maps[0].intrinsic, nullptr);
  auto defaults = ParseSchedule("m=16 / n=32 / - / cuda warps=4 stages=2", *chain);
  EXPECT_EQ(ScheduleToText(*defaults, *chain), "m=16 / n=32 / -");
  EXPECT_EQ(Canonical(*defaults, *chain), Canonical(*ParseSchedule("m=16 / n=32 / -", *chain), *chain));
  EXPECT_EQ(RemapSchedule(*s, {0, 1, 2, 3}, {0, 1}, *chain).warps, 8);
  auto regs = ParseSchedule("m=16 / n=32 / - / cuda registers", *chain);
  ASSERT_TRUE(regs.ok()) << regs.status();
  EXPECT_TRUE(regs->registers);
  EXPECT_EQ(ScheduleToText(*regs, *chain), "m=16 / n=32 / - / cuda registers");
  EXPECT_TRUE(RemapSchedule(*regs, {0, 1, 2, 3}, {0, 1}, *chain).registers);
}

TEST(ScheduleTest, RejectsMalformedText) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  for (const char* bad : {"m=16", "m=16 / -", "m=0 / - / -", "m=65 / - / -", "q=4 / - / -", "m=16 m=16 / - / -",
                          "m=16 / - / C(m=8)", "m=x / - / -", "- / - / Q(k=16)", "- / - / A(k=16)",
                          "- / - / C(k=16", "m=16 / m=16 / -", "- / - / C(k=16) C(n=16)",
                          "m=16 / - / - / cuda warps=3", "m=16 / - / - / cuda stages=4", "m=16 / - / - / cuda x=1",
                          "m=16 / - / - / cuda warps=8 / cuda stages=1"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseSchedule(bad, *chain).status())) << bad;
  }
}

// A regrouping leads the text in braces; the rest names the regrouped
// chain's ops (B_D), and both survive renaming.
TEST(ScheduleTest, RegroupedSchedulesPrintParseAndRemap) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  auto s = ParseSchedule("{E=A*(B*D)} m=16 / - / B_D(n=32)", *chain);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->regroup.empty());
  EXPECT_EQ(ScheduleToText(*s, *chain), "{E=A*(B*D)} m=16 / - / B_D(n=32)");
  EXPECT_EQ(Canonical(*ParseSchedule(ScheduleToText(*s, *chain), *chain), *chain), Canonical(*s, *chain));
  auto regrouped = ScheduledChain(*chain, *s);
  ASSERT_TRUE(regrouped.ok());
  EXPECT_EQ(regrouped->tensors[regrouped->ops[0].output].name, "B_D");
  // C is the regrouped chain's B_D: its own loops are not C's any more.
  EXPECT_FALSE(ParseSchedule("{E=A*(B*D)} m=16 / - / C(k=16)", *chain).ok());
  EXPECT_FALSE(ParseSchedule("{E=(A*B)*D} - / - / -", *chain).ok());
  EXPECT_FALSE(ParseSchedule("{E=A*(B*D) m=16 / - / -", *chain).ok());

  auto renamed = ir::ParseChainText(R"(
dim i=64 j=64 l=32 o=32
in P[i,l] Q[l,j] R[j,o]
X[i,j] = sum(l) P[i,l] * Q[l,j]
Y[i,o] = sum(j) X[i,j] * R[j,o]
out Y
)");
  std::vector<int> tensors = {0, 1, 2, 3, 4};  // A->P, B->Q, D->R, C->X, E->Y
  EXPECT_EQ(ScheduleToText(RemapSchedule(*s, {0, 1, 2, 3}, {0, 1}, *renamed, tensors), *renamed),
            "{Y=P*(Q*R)} i=16 / - / Q_R(j=32)");
}

// A split stream loop prints and parses as dim=TILExN; only the stream
// level takes it, and it goes with the loop when the loop vanishes.
TEST(ScheduleTest, SplitStreamLoops) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  auto s = ParseSchedule("m=16 / n=16x2 / C(k=16)", *chain);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->split, 2);
  EXPECT_EQ(ScheduleToText(*s, *chain), "m=16 / n=16x2 / C(k=16)");
  EXPECT_EQ(ScheduleToText(*ParseSchedule("m=16 / n=64x2 / -", *chain), *chain), "m=16 / - / -");
  EXPECT_FALSE(ParseSchedule("m=16x2 / n=16 / -", *chain).ok());
  EXPECT_FALSE(ParseSchedule("m=16 / n=16x0 / -", *chain).ok());
  EXPECT_FALSE(ParseSchedule("m=16 / n=16xy / -", *chain).ok());
}

}  // namespace
}  // namespace fusor::space
