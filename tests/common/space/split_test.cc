#include "common/space/split.h"

#include <gtest/gtest.h>

#include "common/ir/parse.h"
#include "common/space/loop_nest.h"
#include "common/space/schedule.h"
#include "tests/test_chains.h"
#include "tests/test_targets.h"

namespace fusor::space {
namespace {

std::vector<std::string> Names(const ir::Chain& chain, const std::vector<int>& tensors) {
  std::vector<std::string> out;
  for (int t : tensors) out.push_back(chain.tensors[t].name);
  return out;
}

hw::TargetDesc Target() { return testing::Avx2Target(); }

TEST(SplitTest, PartsKeepTheirNamesAndHandOnWhatTheTailReads) {
  const ir::Chain ffn = *ir::ParseChainText(testing::kConstFfn);
  auto parts = SplitChain(ffn, ffn.FindTensor("G"));
  ASSERT_TRUE(parts.ok()) << parts.status();
  const ir::Chain& head = parts->parts[0];
  const ir::Chain& tail = parts->parts[1];
  EXPECT_EQ(Names(head, head.inputs), (std::vector<std::string>{"X", "W1", "B1"}));
  EXPECT_EQ(Names(head, head.outputs), (std::vector<std::string>{"G"}));
  EXPECT_EQ(Names(tail, tail.inputs), (std::vector<std::string>{"W2", "G"}));
  EXPECT_EQ(Names(tail, tail.outputs), (std::vector<std::string>{"Y"}));
  EXPECT_EQ(parts->handed_on, (std::vector<std::string>{"G"}));
  // Constants stay constant; what the head hands on is not one; each part
  // keeps only the dims it uses.
  EXPECT_TRUE(head.tensors[head.FindTensor("W1")].constant);
  EXPECT_TRUE(tail.tensors[tail.FindTensor("W2")].constant);
  EXPECT_FALSE(tail.tensors[tail.FindTensor("G")].constant);
  EXPECT_EQ(head.FindDim("o"), -1);
  EXPECT_EQ(tail.FindDim("c"), -1);
  EXPECT_EQ(tail.dims[tail.FindDim("f")].extent, 80);

  // After H the bias and GELU go with the tail, which reads B1 as well.
  parts = SplitChain(ffn, ffn.FindTensor("H"));
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ(parts->parts[0].ops.size(), 1u);
  EXPECT_EQ(Names(parts->parts[1], parts->parts[1].inputs), (std::vector<std::string>{"B1", "W2", "H"}));
}

TEST(SplitTest, AChainOutputReadLaterIsWrittenOnceAndHandedOnByTheOutput) {
  const ir::Chain chain = *ir::ParseChainText(R"(
dim m=8 k=4 n=6 h=5
in A[m,k] B[k,n] D[n,h]
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
out C E
)");
  auto parts = SplitChain(chain, chain.FindTensor("C"));
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ(Names(parts->parts[0], parts->parts[0].outputs), (std::vector<std::string>{"C"}));
  EXPECT_EQ(Names(parts->parts[1], parts->parts[1].inputs), (std::vector<std::string>{"D", "C"}));
  EXPECT_TRUE(parts->handed_on.empty());  // the tail reads the caller's C
}

TEST(SplitTest, SplitPointsLeaveASumOnEachSide) {
  const ir::Chain ffn = *ir::ParseChainText(testing::kConstFfn);
  EXPECT_EQ(Names(ffn, SplitPoints(ffn)), (std::vector<std::string>{"H", "G"}));
  const ir::Chain conv = *ir::ParseChainText(testing::kConvChain);
  EXPECT_EQ(Names(conv, SplitPoints(conv)), (std::vector<std::string>{"T", "U"}));
  // One GEMM and its epilogue: no split leaves a sum on both sides.
  const ir::Chain gemm = *ir::ParseChainText(R"(
dim m=8 k=4 n=6
in A[m,k] B[k,n]
C[m,n] = sum(k) A[m,k] * B[k,n]
D[m,n] = relu(C[m,n])
out D
)");
  EXPECT_TRUE(SplitPoints(gemm).empty());
  EXPECT_FALSE(SplitChain(gemm, gemm.FindTensor("D")).ok());  // nothing after it
  EXPECT_FALSE(SplitChain(gemm, gemm.FindTensor("A")).ok());  // an input
}

TEST(SplitTest, TextsRoundTripAndBadOnesAreNamed) {
  const ir::Chain ffn = *ir::ParseChainText(testing::kConstFfn);
  const std::string text = SplitToText(ffn, ffn.FindTensor("G"), {"m=16 / - / H(c=16)", "unfused onednn"});
  EXPECT_EQ(text, "split after G: m=16 / - / H(c=16) | unfused onednn");
  EXPECT_TRUE(IsSplitText(text));
  EXPECT_FALSE(IsSplitText("unfused onednn"));
  EXPECT_EQ(UnfusedVendor("unfused onednn"), "onednn");
  EXPECT_EQ(UnfusedVendor("m=16 / - / -"), "");
  auto split = ParseSplit(text, ffn);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->boundary, ffn.FindTensor("G"));
  EXPECT_EQ(split->texts[0], "m=16 / - / H(c=16)");
  EXPECT_EQ(split->texts[1], "unfused onednn");
  EXPECT_EQ(SplitToText(ffn, split->boundary, split->texts), text);
  const std::string mappings = SplitMappings(*split, Target());
  EXPECT_NE(mappings.find("H=fma"), std::string::npos) << mappings;
  EXPECT_NE(mappings.find(" | unfused onednn"), std::string::npos) << mappings;

  for (const char* bad : {"split after G m=16 / - / - | unfused onednn", "split after G: unfused onednn",
                          "split after Z: unfused onednn | unfused onednn", "split after Y: - / - / - | unfused onednn",
                          "split after G: m=16 / - / Y(o=8) | unfused onednn", "split after G: a | b | c"}) {
    EXPECT_FALSE(ParseSplit(bad, ffn).ok()) << bad;
  }
}

TEST(SplitTest, ProjectionKeepsThePartsLoopsTilesAndMappings) {
  const ir::Chain ffn = *ir::ParseChainText(testing::kConstFfn);
  auto schedule = ParseSchedule("m=16 / f=16 / H(c=16) Y(o=8)", ffn);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  auto nest = BuildLoopNest(ffn, *schedule, Target());
  ASSERT_TRUE(nest.ok()) << nest.status();
  auto parts = SplitChain(ffn, ffn.FindTensor("G"));
  ASSERT_TRUE(parts.ok());
  auto head = ProjectSchedule(nest->schedule, ffn, parts->parts[0]);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(ScheduleToText(*head, parts->parts[0]), "m=16 / f=16 / H(c=16)");
  auto tail = ProjectSchedule(nest->schedule, ffn, parts->parts[1]);
  ASSERT_TRUE(tail.ok()) << tail.status();
  // One op: the stream loop over f becomes its own innermost loop.
  EXPECT_EQ(ScheduleToText(*tail, parts->parts[1]), "m=16 / - / Y(o=8 f=16)");
  auto tail_nest = BuildLoopNest(parts->parts[1], *tail, Target());
  EXPECT_TRUE(tail_nest.ok()) << tail_nest.status();
  // After H the head is one GEMM, over blocks of f as well.
  parts = SplitChain(ffn, ffn.FindTensor("H"));
  ASSERT_TRUE(parts.ok());
  head = ProjectSchedule(nest->schedule, ffn, parts->parts[0]);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(ScheduleToText(*head, parts->parts[0]), "m=16 f=16 / - / H(c=16)");
  auto head_nest = BuildLoopNest(parts->parts[0], *head, Target());
  EXPECT_TRUE(head_nest.ok()) << head_nest.status();
}

}  // namespace
}  // namespace fusor::space
