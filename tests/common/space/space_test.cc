// The space's stage counts against an independent brute-force enumerator:
// every placement of every dim (tiled or not) and every order of each op's
// tiled own output loops is built as a plain schedule, equivalent nests are
// merged through their canonical text, and every stage is recounted from
// the nests. The production enumerator instead builds only canonical
// schedules and counts equivalents arithmetically.
#include "common/space/space.h"

#include <algorithm>
#include <set>

#include <gtest/gtest.h>

#include "common/hw/devices.h"
#include "common/ir/parse.h"
#include "common/ir/regroup.h"
#include "tests/test_chains.h"
#include "tests/test_targets.h"

namespace fusor::space {
namespace {

struct Counts {
  int64_t enumerated = 0, distinct = 0, legal = 0, intermediates = 0, padding = 0, scratch = 0;
};

// One association order's schedules (the chain as written, or regrouped).
void BruteForceVariant(const ir::Chain& chain, const hw::TargetDesc& target, const SpaceOptions& options,
                       Counts& c) {
  const int n = static_cast<int>(chain.dims.size());
  const std::vector<int> block_ok = BlockEligibleDims(chain);
  // Placements: 0 own, 1 block, 2 stream.
  std::vector<std::vector<int>> places(n);
  for (int d = 0; d < n; ++d) {
    places[d] = {0};
    bool block = std::count(block_ok.begin(), block_ok.end(), d) > 0;
    int users = 0;
    for (const ir::Op& op : chain.ops) {
      users += std::count(op.index.begin(), op.index.end(), d) + std::count(op.reduce.begin(), op.reduce.end(), d) > 0;
    }
    if (block) places[d].push_back(1);
    // A CPU block may stream through its own rows; a GPU block may not.
    const bool stream_ok = !block || target.backend == hw::Backend::kCpu;
    if (stream_ok && users >= 2) places[d].push_back(2);
  }
  std::set<std::string> seen;
  std::vector<Schedule> distinct;
  std::vector<std::vector<int64_t>> tiles(n);
  for (int d = 0; d < n; ++d) tiles[d] = TileOptions(chain, target, d);
  // All combinations of (tile, place) per dim, by recursion.
  std::vector<int64_t> tile(n);
  std::vector<int> place(n);
  std::function<void(int)> rec = [&](int d) {
    if (d == n) {
      // Own loops of each sum op: its tiled dims placed nowhere else;
      // output loops in every order, then reduced loops in chain order.
      std::vector<std::vector<int>> outs(chain.ops.size()), reds(chain.ops.size());
      for (size_t o = 0; o < chain.ops.size(); ++o) {
        const ir::Op& op = chain.ops[o];
        if (op.kind != ir::OpKind::kSum) continue;
        for (int x = 0; x < n; ++x) {
          if (place[x] != 0 || tile[x] == chain.dims[x].extent) continue;
          if (std::count(op.index.begin(), op.index.end(), x)) outs[o].push_back(x);
        }
        for (int x = 0; x < n; ++x) {
          if (place[x] == 0 && tile[x] < chain.dims[x].extent && std::count(op.reduce.begin(), op.reduce.end(), x)) {
            reds[o].push_back(x);
          }
        }
      }
      while (true) {
        Schedule s = UntiledSchedule(chain);
        s.tile = tile;
        for (int x = 0; x < n; ++x) {
          if (place[x] == 1) s.block.push_back(x);
          if (place[x] == 2) s.stream.push_back(x);
        }
        for (size_t o = 0; o < chain.ops.size(); ++o) {
          s.own[o] = outs[o];
          s.own[o].insert(s.own[o].end(), reds[o].begin(), reds[o].end());
        }
        for (int split : SplitOptions(s, chain, target)) {
          s.split = split;
          ++c.enumerated;
          if (seen.insert(ScheduleToText(s, chain)).second) distinct.push_back(s);
        }
        size_t o = 0;
        for (; o < outs.size(); ++o) {
          if (std::next_permutation(outs[o].begin(), outs[o].end())) break;
        }
        if (o == outs.size()) break;
      }
      return;
    }
    for (int64_t t : tiles[d]) {
      for (int p : places[d]) {
        tile[d] = t;
        place[d] = p;
        rec(d + 1);
      }
    }
  };
  rec(0);
  c.distinct += static_cast<int64_t>(distinct.size());
  const int64_t budget = hw::ScratchBudget(target);
  auto untiled = BuildLoopNest(chain, UntiledSchedule(chain), target);
  const double min_padding = untiled->PaddingRatio();
  for (const Schedule& s : distinct) {
    auto nest = BuildLoopNest(chain, s, target);
    if (!nest.ok()) continue;
    ++c.legal;
    if (nest->intermediate_bytes > options.intermediate_fraction * budget) continue;
    ++c.intermediates;
    if (nest->PaddingRatio() > (1 + options.max_padding) * min_padding) continue;
    ++c.padding;
    if (nest->scratch_bytes * options.scratch_margin > budget) continue;
    ++c.scratch;
  }
}

// Every association order: the chain as written and each regrouping.
Counts BruteForce(const ir::Chain& chain, const hw::TargetDesc& target, const SpaceOptions& options) {
  Counts c;
  BruteForceVariant(chain, target, options, c);
  for (const ir::Regroup& r : ir::Regroupings(chain)) {
    auto regrouped = ir::ApplyRegroup(chain, r);
    EXPECT_TRUE(regrouped.ok()) << regrouped.status();
    if (regrouped.ok()) BruteForceVariant(*regrouped, target, options, c);
  }
  return c;
}

void Check(const char* text, const hw::TargetDesc& target) {
  auto chain = ir::ParseChainText(text);
  ASSERT_TRUE(chain.ok()) << chain.status();
  SpaceOptions options;
  auto space = BuildSpace(*chain, target, options);
  ASSERT_TRUE(space.ok()) << space.status();
  Counts expected = BruteForce(*chain, target, options);
  EXPECT_EQ(space->stats.enumerated, expected.enumerated);
  ASSERT_EQ(space->stats.stages.size(), 5u);
  EXPECT_EQ(space->stats.stages[0].remaining, expected.distinct);
  EXPECT_EQ(space->stats.stages[1].remaining, expected.legal);
  EXPECT_EQ(space->stats.stages[2].remaining, expected.intermediates);
  EXPECT_EQ(space->stats.stages[3].remaining, expected.padding);
  EXPECT_EQ(space->stats.stages[4].remaining, expected.scratch);
  // Plus the other mappings tried on the best tilings; each survivor
  // re-evaluates to the same prediction on its own. On a GPU, the
  // register-resident kernels come first.
  const int64_t first = space->stats.register_resident;
  EXPECT_EQ(static_cast<int64_t>(space->ranked.size()), expected.scratch + space->stats.mapped_schedules + first);
  EXPECT_LE(space->stats.mapped_schedules, space->stats.mappings * options.mapping_tilings);
  int explicit_mappings = 0;
  for (const RankedSchedule& r : space->ranked) {
    if (r.schedule.registers) continue;
    bool any = false;
    for (const mapping::Mapping& m : r.schedule.maps) any = any || m.intrinsic != nullptr;
    if (!any) continue;
    ++explicit_mappings;
    auto again = EvaluateSchedule(*chain, target, r.schedule, options);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_DOUBLE_EQ(again->prediction.t_estm_s, r.prediction.t_estm_s);
  }
  EXPECT_EQ(explicit_mappings, space->stats.mapped_schedules);
  EXPECT_GT(expected.scratch, 0);
  EXPECT_LT(expected.distinct, expected.enumerated);  // rule 1 merges something
  for (size_t i = 0; i < space->ranked.size(); ++i) {
    const bool registers = space->ranked[i].schedule.registers;
    EXPECT_EQ(registers, static_cast<int64_t>(i) < first) << i;
    if (i == 0 || static_cast<int64_t>(i) == first) continue;
    // Sorted by prediction; register-resident ties (within 1%) broken by the launch.
    const double slack = registers ? 1.0202 : 1.0;
    EXPECT_LE(space->ranked[i - 1].prediction.t_estm_s, slack * space->ranked[i].prediction.t_estm_s) << i;
  }
  if (target.backend != hw::Backend::kCuda) EXPECT_EQ(first, 0);
}

constexpr char kSmallGemmChain[] = R"(
dim m=256 n=256 k=64 h=64
in A[m,k] B[k,n] D[n,h]
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
out E
)";

hw::TargetDesc Cpu() {
  hw::TargetDesc t = testing::Avx512Target();
  t.l1d_bytes = 48 << 10;
  t.l2_bytes = 2 << 20;
  return t;
}

TEST(SpaceTest, ReferenceGemmChainStageByStage) {
  Check(R"(
dtype f16
dim m=1024 n=1024 k=512 h=512
in A[m,k] B[k,n] D[n,h]
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
out E
)",
        Cpu());
}

TEST(SpaceTest, BertBaseAttentionStageByStageOnCpuAndH100) {
  const char* attention = R"(
dtype f16
dim b=12 m=128 n=128 k=64 h=64
in Q[b,m,k] K[b,n,k] V[b,n,h]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.125
P[b,m,n] = softmax(n) S[b,m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)";
  Check(attention, Cpu());
  Check(attention, *hw::LookupDevice("h100"));
}

// f16 BERT-base attention on an H200: the register-resident kernel comes
// first, 32 rows a warp (each B fragment feeds two mma) and a 64-column
// stream tile (a 128-column one needs more registers than a thread has).
TEST(SpaceTest, AttentionRanksTheRegisterResidentKernelFirstOnAGpu) {
  auto chain = ir::ParseChainText(R"(
dtype f16
dim b=96 m=512 n=512 k=64 h=64
in Q[b,m,k] K[b,n,k] V[b,n,h]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.125
P[b,m,n] = softmax(n) S[b,m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)");
  ASSERT_TRUE(chain.ok()) << chain.status();
  auto space = BuildSpace(*chain, *hw::LookupDevice("h200"));
  ASSERT_TRUE(space.ok()) << space.status();
  ASSERT_GT(space->stats.register_resident, 0);
  Schedule top = space->ranked[0].schedule;
  top.maps.assign(chain->ops.size(), {});
  EXPECT_EQ(ScheduleToText(top, *chain), "b=1 m=128 / n=64 / - / cuda registers");
  hw::TargetDesc host;
  host.compute_units = 2;
  EXPECT_EQ(BuildSpace(*chain, host)->stats.register_resident, 0);
}

// On a GPU a stream loop is split while the grid is short of the SMs:
// register-resident kernels down to one step a part, nests in shared
// memory only with four steps a part or more.
TEST(SplitOptionsTest, AGpuSplitsShortGridsOnly) {
  auto chain = ir::ParseChainText(testing::kGemmChain);  // m=64 n=64
  ASSERT_TRUE(chain.ok());
  const hw::TargetDesc h200 = *hw::LookupDevice("h200");  // 132 SMs
  Schedule s = *ParseSchedule("m=16 / n=16 / - / cuda registers", *chain);  // 4 blocks, 4 steps
  EXPECT_EQ(SplitOptions(s, *chain, h200), (std::vector<int>{1, 2, 4}));
  s.registers = false;
  EXPECT_EQ(SplitOptions(s, *chain, h200), (std::vector<int>{1}));
  s = *ParseSchedule("m=16 / n=8 / -", *chain);  // 8 steps: two parts of four
  EXPECT_EQ(SplitOptions(s, *chain, h200), (std::vector<int>{1, 2}));
  hw::TargetDesc small = h200;
  small.compute_units = 4;  // the 4 blocks already fill it
  s.registers = true;
  EXPECT_EQ(SplitOptions(s, *chain, small), (std::vector<int>{1}));
}

TEST(SpaceTest, ConvChainWithDimsNoLoopUses) {
  // y and x only shape the input; r and s are too short to loop over.
  Check(R"(
dim n=1 c=16 k=32 p=14 q=14 r=3 s=3 j=16 y=16 x=16
in I[n,c,y,x] W1[k,c,r,s] W2[j,k]
T[n,k,p,q] = sum(c,r,s) I[n,c,p+r,q+s] * W1[k,c,r,s]
U[n,k,p,q] = relu(T[n,k,p,q])
O[n,j,p,q] = sum(k) U[n,k,p,q] * W2[j,k]
out O
)",
        Cpu());
}

TEST(SpaceTest, RulesSwitchOffOneByOne) {
  auto chain = ir::ParseChainText(kSmallGemmChain);
  auto all = BuildSpace(*chain, Cpu());
  ASSERT_TRUE(all.ok());
  SpaceOptions no_dedupe;
  no_dedupe.dedupe = false;
  auto dup = BuildSpace(*chain, Cpu(), no_dedupe);
  EXPECT_EQ(dup->stats.stages[0].remaining, all->stats.enumerated);
  EXPECT_GT(dup->ranked.size(), all->ranked.size());
  for (auto flag : {&SpaceOptions::limit_intermediates, &SpaceOptions::limit_padding, &SpaceOptions::limit_scratch}) {
    SpaceOptions off;
    off.*flag = false;
    auto more = BuildSpace(*chain, Cpu(), off);
    EXPECT_GE(more->ranked.size(), all->ranked.size());
  }
  SpaceOptions none;
  none.limit_intermediates = none.limit_padding = none.limit_scratch = false;
  auto everything = BuildSpace(*chain, Cpu(), none);
  EXPECT_EQ(static_cast<int64_t>(everything->ranked.size()),
            everything->stats.stages[1].remaining + everything->stats.mapped_schedules);
}

TEST(SpaceTest, EvaluateScheduleAppliesTheSameRules) {
  auto chain = ir::ParseChainText(kSmallGemmChain);
  auto space = BuildSpace(*chain, Cpu());
  auto best = EvaluateSchedule(*chain, Cpu(), space->ranked[0].schedule);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_DOUBLE_EQ(best->prediction.t_estm_s, space->ranked[0].prediction.t_estm_s);
  hw::TargetDesc small = Cpu();
  small.l2_bytes = 0;
  small.l1d_bytes = 8 << 10;
  EXPECT_TRUE(absl::IsFailedPrecondition(EvaluateSchedule(*chain, small, UntiledSchedule(*chain)).status()));
}

TEST(TileOptionsTest, IntrinsicDimsTakeMultiplesOf16) {
  auto chain = ir::ParseChainText(R"(
dim b=12 m=100 k=64 n=8
in A[b,m,k] B[b,k,n]
C[b,m,n] = sum(k) A[b,m,k] * B[b,k,n]
out C
)");
  const hw::TargetDesc h100 = *hw::LookupDevice("h100");  // f32: mma.sync.m16n8k8.tf32
  EXPECT_EQ(TileOptions(*chain, h100, chain->FindDim("b")), (std::vector<int64_t>{1, 2, 4, 8, 12}));
  EXPECT_EQ(TileOptions(*chain, h100, chain->FindDim("m")), (std::vector<int64_t>{16, 32, 64, 100}));
  EXPECT_EQ(TileOptions(*chain, h100, chain->FindDim("n")), (std::vector<int64_t>{8}));
  // The CPU's fma.avx512.8x32: rows from 16, columns in steps of its 32.
  EXPECT_EQ(TileOptions(*chain, Cpu(), chain->FindDim("m")), (std::vector<int64_t>{16, 32, 64, 100}));
  auto conv = ir::ParseChainText(R"(
dim c=16 k=16 p=8 r=3 y=10
in I[c,y] W[k,c,r]
T[k,p] = sum(c,r) I[c,p+r] * W[k,c,r]
out T
)");
  EXPECT_EQ(TileOptions(*conv, Cpu(), conv->FindDim("y")), (std::vector<int64_t>{10}));  // no loop uses y
  EXPECT_EQ(TileOptions(*conv, Cpu(), conv->FindDim("r")), (std::vector<int64_t>{3}));
  // c alone on the k axis of the default mapping (r stays outside): multiples of 16.
  EXPECT_EQ(TileOptions(*conv, Cpu(), conv->FindDim("c")), (std::vector<int64_t>{16}));
  auto wide = ir::ParseChainText("dim m=256 n=256 k=64\nin A[m,k] B[k,n]\nC[m,n] = sum(k) A[m,k] * B[k,n]\nout C");
  EXPECT_EQ(TileOptions(*wide, Cpu(), wide->FindDim("n")), (std::vector<int64_t>{32, 64, 128, 256}));
  // A block dim under 8 (4 heads) still splits over a CPU's cores: 2 and 1
  // on 2 cores; a GPU leaves it whole.
  auto heads = ir::ParseChainText("dim b=4 m=64 n=64 k=16\nin A[b,m,k] B[b,k,n]\nC[b,m,n] = sum(k) A[b,m,k] * B[b,k,n]\nout C");
  hw::TargetDesc two_cores = Cpu();
  two_cores.compute_units = 2;
  EXPECT_EQ(TileOptions(*heads, two_cores, heads->FindDim("b")), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(TileOptions(*heads, h100, heads->FindDim("b")), (std::vector<int64_t>{4}));
}

}  // namespace
}  // namespace fusor::space
