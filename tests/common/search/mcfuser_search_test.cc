#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include <memory>
#include <set>
#include <tuple>

#include "common/hw/devices.h"
#include "common/ir/parse.h"
#include "common/space/loop_nest.h"
#include "common/search/search_strategy.h"
#include "common/space/split.h"
#include "tests/test_chains.h"
#include "tests/test_targets.h"

namespace fusor::search {
namespace {

using ::testing::HasSubstr;

hw::TargetDesc Cpu() {
  hw::TargetDesc t = testing::Avx2Target();
  t.l1d_bytes = 32 << 10;
  t.l2_bytes = 1 << 20;
  t.bandwidth_bytes_per_s = 20e9;
  t.peak_flops = 200e9;
  return t;
}

// Runs a strategy to the end, reporting each candidate as `time(c)`.
std::vector<std::string> Drive(SearchStrategy& s, int batch,
                               const std::function<double(const CandidateSpec&)>& time) {
  std::vector<std::string> order;
  for (int round = 0; round < 100 && !s.Done(); ++round) {
    std::vector<CandidateSpec> b = s.NextBatch(batch);
    if (b.empty()) break;
    std::vector<MeasuredResult> results;
    for (const CandidateSpec& c : b) {
      order.push_back(c.schedule_text);
      results.push_back({c.schedule_text, true, time(c)});
    }
    s.NotifyResults(results);
  }
  return order;
}

TEST(McfuserSearchTest, DeterministicWithinBudgetAndNeverRepeats) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  auto a = MakeMcfuserSearch(), b = MakeMcfuserSearch();
  ASSERT_TRUE(a->Initialize({&*chain, Cpu(), 12}).ok());
  ASSERT_TRUE(b->Initialize({&*chain, Cpu(), 12}).ok());
  auto t = [](const CandidateSpec& c) { return c.prediction.t_estm_s * 1.5; };
  std::vector<std::string> x = Drive(*a, 4, t), y = Drive(*b, 4, t);
  EXPECT_EQ(x, y);
  EXPECT_LE(x.size(), 12u);
  EXPECT_EQ(std::set<std::string>(x.begin(), x.end()).size(), x.size());
  EXPECT_TRUE(a->NextBatch(4).empty());
}

// The first round is the model's best of each of the best classes (its
// association order, tiling expression and mappings), in model order.
TEST(McfuserSearchTest, FirstRoundIsTheModelsBestOfEachClass) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  auto space = space::BuildSpace(*chain, Cpu());
  ASSERT_TRUE(space.ok());
  auto s = MakeMcfuserSearch();
  ASSERT_TRUE(s->Initialize({&*chain, Cpu(), 8}).ok());
  std::vector<CandidateSpec> first = s->NextBatch(4);
  ASSERT_EQ(first.size(), 4u);
  auto class_of = [&](const space::RankedSchedule& r) {
    return ScheduleToText(r.schedule, *chain).substr(0, r.schedule.regroup.empty() ? 0 : 12) +
           space::TilingExpression(r.schedule, *chain) + " " + r.mappings;
  };
  std::vector<std::string> expected;
  std::set<std::string> seen;
  for (const space::RankedSchedule& r : space->ranked) {
    if (expected.size() == 4) break;
    if (seen.insert(class_of(r)).second) expected.push_back(space::ScheduleToText(r.schedule, *chain));
  }
  EXPECT_EQ(first[0].schedule_text, space::ScheduleToText(space->ranked[0].schedule, *chain));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(first[i].schedule_text, expected[i]) << i;
}

// Measurements that contradict the model move the search: a class (tiling
// expression, association order, mappings) measured far slower than
// predicted is not proposed again while others are left.
TEST(McfuserSearchTest, PenalizesWhatTheModelOverRated) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  McfuserSearchOptions options;
  options.exhaustive_limit = 0;  // evolutionary
  options.patience = 100;
  auto s = MakeMcfuserSearch(options);
  ASSERT_TRUE(s->Initialize({&*chain, Cpu(), 40}).ok());
  std::vector<CandidateSpec> first = s->NextBatch(4);
  ASSERT_FALSE(first.empty());
  // The search's classes: association order, tiling expression, mappings.
  auto class_of = [&](const CandidateSpec& c) {
    return std::make_tuple(c.schedule.regroup.consumer, space::TilingExpression(c.schedule, *chain), c.mapping);
  };
  const auto bad = class_of(first[0]);
  std::vector<MeasuredResult> results;
  for (const CandidateSpec& c : first) {
    bool is_bad = class_of(c) == bad;
    results.push_back({c.schedule_text, true, c.prediction.t_estm_s * (is_bad ? 50 : 1)});
  }
  s->NotifyResults(results);
  int bad_next = 0;
  std::vector<CandidateSpec> second = s->NextBatch(8);
  for (const CandidateSpec& c : second) bad_next += class_of(c) == bad;
  EXPECT_EQ(bad_next, 0);
  EXPECT_EQ(second.size(), 8u);
}

TEST(McfuserSearchTest, StopsAfterRoundsWithoutImprovement) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  McfuserSearchOptions options;
  options.patience = 2;
  auto s = MakeMcfuserSearch(options);
  ASSERT_TRUE(s->Initialize({&*chain, Cpu(), 100}).ok());
  int calls = 0;
  // Every candidate after the first round is slower than the first one.
  std::vector<std::string> order = Drive(*s, 2, [&](const CandidateSpec&) { return ++calls == 1 ? 1e-6 : 1.0; });
  EXPECT_EQ(order.size(), 2u * 3);  // round 1, then two stale rounds
  EXPECT_TRUE(s->Done());
}

// The confidence bound: when every candidate measures what the model
// predicted (times one factor) and the model's error is taken as nil,
// nothing unproposed is predicted faster than the best measured: the
// search stops after two rounds and 8 candidates, far below its budget and
// patience. With the default floor on the error (many schedules score
// within e^0.5 of the best), or with errors of a factor up to 2, it goes on.
TEST(McfuserSearchTest, StopsWhenNothingLeftIsExpectedToBeatTheBest) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  auto exactly = [](const CandidateSpec& c) { return 3 * c.prediction.t_estm_s; };
  McfuserSearchOptions options;
  options.patience = 100;
  options.min_error_spread = 0;
  auto exact = MakeMcfuserSearch(options);
  ASSERT_TRUE(exact->Initialize({&*chain, Cpu(), 100}).ok());
  EXPECT_EQ(Drive(*exact, 4, exactly).size(), 8u);
  EXPECT_TRUE(exact->Done());
  auto noisy = MakeMcfuserSearch(options);
  ASSERT_TRUE(noisy->Initialize({&*chain, Cpu(), 40}).ok());
  int calls = 0;
  EXPECT_GT(Drive(*noisy, 4, [&](const CandidateSpec& c) {
              constexpr double kErrors[] = {1.0, 1.9, 0.6, 1.4, 0.8, 2.0, 1.2, 0.5};
              return c.prediction.t_estm_s * kErrors[calls++ % 8];
            }).size(),
            8u);
  options.min_error_spread = McfuserSearchOptions().min_error_spread;
  auto floored = MakeMcfuserSearch(options);
  ASSERT_TRUE(floored->Initialize({&*chain, Cpu(), 40}).ok());
  EXPECT_GT(Drive(*floored, 4, exactly).size(), 8u);
  options.stop_at_bound = false;
  options.min_error_spread = 0;
  auto off = MakeMcfuserSearch(options);
  ASSERT_TRUE(off->Initialize({&*chain, Cpu(), 40}).ok());
  EXPECT_EQ(Drive(*off, 4, exactly).size(), 40u);
}

TEST(McfuserSearchTest, FailsClearlyWhenNothingFits) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  hw::TargetDesc tiny = Cpu();
  tiny.l1d_bytes = 64;
  tiny.l2_bytes = 64;
  auto s = MakeMcfuserSearch();
  absl::Status st = s->Initialize({&*chain, tiny, 4});
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("no schedule survives pruning"));
}

TEST(McfuserSearchTest, CandidatesCarryTheirMappings) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  auto s = MakeMcfuserSearch();
  ASSERT_TRUE(s->Initialize({&*chain, Cpu(), 4}).ok());
  std::vector<CandidateSpec> batch = s->NextBatch(1);
  ASSERT_EQ(batch.size(), 1u);
  // The model's best is the other association order, E = A*(B*D).
  EXPECT_EQ(batch[0].schedule_text.substr(0, 12), "{E=A*(B*D)} ");
  EXPECT_EQ(batch[0].mapping, "B_D=fma.avx2.6x16[i=k j=h k=n] E=fma.avx2.6x16[i=m j=h k=k]");
}

// On a GPU the search also measures other launches (warps, stages, split) of the
// best schedule measured so far; they are legal schedules that parse back,
// and a CPU target never gets one.
TEST(McfuserSearchTest, TriesOtherLaunchesOfTheBestOnAGpu) {
  auto chain = ir::ParseChainText(testing::kMaskedF16Attention);
  ASSERT_TRUE(chain.ok());
  const hw::TargetDesc gpu = *hw::LookupDevice("h200");
  auto s = MakeMcfuserSearch();
  ASSERT_TRUE(s->Initialize({&*chain, gpu, 16}).ok());
  std::vector<CandidateSpec> first = s->NextBatch(4);
  ASSERT_EQ(first.size(), 4u);
  std::vector<MeasuredResult> results;
  // On a GPU the register-resident kernels are ranked first.
  EXPECT_THAT(first[0].schedule_text, HasSubstr("registers"));
  for (size_t i = 0; i < first.size(); ++i) {
    results.push_back({first[i].schedule_text, true, i == 2 ? 1e-6 : 1e-5});  // the third is best
  }
  s->NotifyResults(results);
  std::vector<CandidateSpec> second = s->NextBatch(4);
  ASSERT_FALSE(second.empty());
  // The variant comes first: the best with its intermediates in registers
  // where that applies (in shared memory, unsplit, where they were in
  // registers), else with its stages flipped.
  auto best = space::ParseSchedule(first[2].schedule_text, *chain);
  ASSERT_TRUE(best.ok());
  if (best->registers) {
    best->registers = false;
    if (!space::BuildLoopNest(*chain, *best, gpu).ok()) best->split = 1;  // a softmax does not split there
  } else if (auto in_registers = space::RegisterResidentVariant(*chain, *best, gpu)) {
    best = *in_registers;
  } else {
    best->stages = 1;
  }
  EXPECT_EQ(second[0].schedule_text, space::ScheduleToText(*best, *chain));
  EXPECT_THAT(second[0].schedule_text, HasSubstr("/ cuda "));
  auto parsed = space::ParseSchedule(second[0].schedule_text, *chain);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(space::BuildLoopNest(*chain, *parsed, gpu).ok());
  EXPECT_EQ(second[0].mapping, first[2].mapping);

  auto cpu = MakeMcfuserSearch();
  ASSERT_TRUE(cpu->Initialize({&*chain, Cpu(), 16}).ok());
  for (const std::string& text : Drive(*cpu, 4, [](const CandidateSpec& c) { return c.prediction.t_estm_s; })) {
    EXPECT_THAT(text, ::testing::Not(HasSubstr("cuda")));
  }
}

// The analytical model inverted: what it rates fastest is slowest here.
class InvertedModel final : public model::CostModel {
 public:
  const char* name() const override { return "inverted"; }
  model::Prediction Predict(const space::LoopNest& nest, const hw::TargetDesc& target,
                            const ir::Chain& chain) const override {
    model::Prediction p = model::AnalyticalModel().Predict(nest, target, chain);
    p.t_estm_s = 1 / p.t_estm_s;
    ++calls;
    return p;
  }
  mutable int calls = 0;
};

TEST(McfuserSearchTest, RanksWithTheCostModelItIsGiven) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  auto inverted = std::make_shared<InvertedModel>();
  McfuserSearchOptions options;
  options.cost_model = inverted;
  auto given = MakeMcfuserSearch(options);
  auto analytical = MakeMcfuserSearch();
  ASSERT_TRUE(given->Initialize({&*chain, Cpu(), 8}).ok());
  ASSERT_TRUE(analytical->Initialize({&*chain, Cpu(), 8}).ok());
  EXPECT_GT(inverted->calls, 0);
  const std::vector<CandidateSpec> a = analytical->NextBatch(1), g = given->NextBatch(1);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(g.size(), 1u);
  // The given model's first pick is what it rates fastest, by its own
  // prediction, and not the analytical model's pick.
  EXPECT_NE(g[0].schedule_text, a[0].schedule_text);
  EXPECT_LT(g[0].prediction.t_estm_s, 1 / a[0].prediction.t_estm_s);
  space::SpaceOptions ranked_by;
  ranked_by.model = inverted.get();
  const auto space = space::BuildSpace(*chain, Cpu(), ranked_by);
  ASSERT_TRUE(space.ok());
  EXPECT_DOUBLE_EQ(g[0].prediction.t_estm_s, space->ranked.front().prediction.t_estm_s);
  for (const space::RankedSchedule& r : space->ranked) EXPECT_GE(r.prediction.t_estm_s, g[0].prediction.t_estm_s);
}

TEST(McfuserSearchTest, SplitsComeLastWithinTheBudgetOnePerKindFirst) {
  auto chain = ir::ParseChainText(testing::kConstFfn);
  ASSERT_TRUE(chain.ok());
  McfuserSearchOptions o;
  o.split_candidates = 3;
  auto a = MakeMcfuserSearch(o), b = MakeMcfuserSearch(o);
  ASSERT_TRUE(a->Initialize({&*chain, Cpu(), 16}).ok());
  ASSERT_TRUE(b->Initialize({&*chain, Cpu(), 16}).ok());
  auto t = [](const CandidateSpec& c) { return c.prediction.t_estm_s * 1.5; };
  const std::vector<std::string> x = Drive(*a, 4, t);
  EXPECT_EQ(x, Drive(*b, 4, t));  // deterministic, so a restarted task replays it
  EXPECT_TRUE(a->Done());
  EXPECT_LE(x.size(), 16u);
  ASSERT_GE(x.size(), 3u);
  std::set<int> kinds;
  for (size_t i = 0; i < x.size(); ++i) {
    const bool split = space::IsSplitText(x[i]);
    // The fused search first, then exactly the three splits.
    EXPECT_EQ(split, i + 3 >= x.size()) << i << ": " << x[i];
    if (!split) continue;
    auto parsed = space::ParseSplit(x[i], *chain);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    const bool head_fused = space::UnfusedVendor(parsed->texts[0]).empty();
    const bool tail_fused = space::UnfusedVendor(parsed->texts[1]).empty();
    EXPECT_TRUE(head_fused || tail_fused) << x[i];
    kinds.insert(head_fused + 2 * tail_fused);
  }
  EXPECT_EQ(kinds.size(), 3u);  // head fused, tail fused, both

  // The best measured schedule, restricted to a part, is that part's
  // schedule: every fused part of a split is a projection of it.
  std::string best;
  double best_s = 0;
  auto c = MakeMcfuserSearch(o);
  ASSERT_TRUE(c->Initialize({&*chain, Cpu(), 16}).ok());
  const std::vector<std::string> y = Drive(*c, 4, [&](const CandidateSpec& s) {
    const double time = space::IsSplitText(s.schedule_text) ? 1 : s.prediction.t_estm_s * (1 + s.schedule_text.size() % 7);
    if (!space::IsSplitText(s.schedule_text) && (best_s == 0 || time < best_s)) {
      best_s = time;
      best = s.schedule_text;
    }
    return time;
  });
  auto best_schedule = space::ParseSchedule(best, *chain);
  ASSERT_TRUE(best_schedule.ok());
  for (const std::string& text : y) {
    if (!space::IsSplitText(text)) continue;
    auto parsed = space::ParseSplit(text, *chain);
    ASSERT_TRUE(parsed.ok());
    for (int p = 0; p < 2; ++p) {
      if (!space::UnfusedVendor(parsed->texts[p]).empty()) continue;
      auto projected = space::ProjectSchedule(*best_schedule, *chain, parsed->chains.parts[p]);
      ASSERT_TRUE(projected.ok());
      auto part = space::ParseSchedule(parsed->texts[p], parsed->chains.parts[p]);
      ASSERT_TRUE(part.ok());
      // The same, or the same with its stream loop run over blocks where the part cannot split it.
      EXPECT_EQ(part->tile, projected->tile) << text << " from " << best;
    }
  }
}

TEST(McfuserSearchTest, NoSplitsUnlessAskedOrWithoutRoom) {
  auto chain = ir::ParseChainText(testing::kConstFfn);
  auto t = [](const CandidateSpec& c) { return c.prediction.t_estm_s; };
  for (const auto& [splits, budget] : {std::pair{0, 16}, std::pair{3, 3}}) {
    McfuserSearchOptions o;
    o.split_candidates = splits;
    auto s = MakeMcfuserSearch(o);
    ASSERT_TRUE(s->Initialize({&*chain, Cpu(), budget}).ok());
    for (const std::string& text : Drive(*s, 4, t)) EXPECT_FALSE(space::IsSplitText(text)) << text;
  }
}

}  // namespace
}  // namespace fusor::search
