#include "common/model/learned_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include <nlohmann/json.hpp>

#include "common/ir/parse.h"
#include "common/space/loop_nest.h"
#include "common/space/space.h"
#include "tests/test_chains.h"
#include "tests/test_targets.h"

namespace fusor::model {
namespace {

constexpr int kOwnLoops = 17;  // FeatureNames()[17]
constexpr int kPadding = 2;

// Samples of `groups` workloads whose measured times follow the analytical
// ones times exp(0.4 * own_loops - 0.6 * padding), plus a level per
// workload and a little noise: a pattern the analytical model misses.
std::vector<Sample> Synthetic(int groups, int per_group, uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<Sample> out;
  for (int g = 0; g < groups; ++g) {
    const double level = 2.0 * normal(rng);
    for (int i = 0; i < per_group; ++i) {
      Sample s;
      s.group = "w" + std::to_string(g);
      for (size_t j = 0; j < FeatureNames().size(); ++j) s.features.push_back(normal(rng));
      s.analytical_s = 1e-3 * std::exp(0.3 * normal(rng));
      s.measured_s = s.analytical_s *
                     std::exp(level + 0.4 * s.features[kOwnLoops] - 0.6 * s.features[kPadding] + 0.03 * normal(rng));
      out.push_back(s);
    }
  }
  return out;
}

TEST(LearnedModelTest, FeatureNamesMatchTheFeatures) {
  EXPECT_EQ(FeatureNames()[kOwnLoops], "own_loops");
  EXPECT_EQ(FeatureNames()[kPadding], "log_padding");
  auto chain = ir::ParseChainText(testing::kGemmChain);
  const hw::TargetDesc target = testing::Avx2Target();
  auto sample = MakeSample(*chain, "m=16 / - / C(n=32) E(h=16 n=32)", target, 1e-3, "g");
  ASSERT_TRUE(sample.ok()) << sample.status();
  EXPECT_EQ(sample->features.size(), FeatureNames().size());
  EXPECT_DOUBLE_EQ(sample->features[kOwnLoops], 3);  // C's n, E's h and n
  EXPECT_FALSE(MakeSample(*chain, "m=16 / - / bogus", target, 1e-3, "g").ok());
}

// On a CPU a last wave that idles a core is a feature only in proportion to
// how short the kernel is (under 20 us with every core busy): on a long
// kernel both of its features are 0, so no weight learned from short chains
// moves its prediction. Blocks per core count only beyond one.
TEST(LearnedModelTest, TheLastWaveIsAFeatureOfShortKernelsOnly) {
  constexpr int kShortLogAlpha = 1, kShortFewerBlocks = 4;
  EXPECT_EQ(FeatureNames()[kShortLogAlpha], "short_log_alpha");
  EXPECT_EQ(FeatureNames()[kShortFewerBlocks], "short_fewer_blocks");
  hw::TargetDesc target = testing::Avx512Target();
  target.compute_units = 2;
  target.bandwidth_bytes_per_s = 2e10;
  target.peak_flops = 3e11;
  auto features = [&](const std::string& text, const std::string& schedule) {
    auto chain = ir::ParseChainText(text);
    EXPECT_TRUE(chain.ok()) << chain.status();
    auto sample = MakeSample(*chain, schedule, target, 1e-3, "g");
    EXPECT_TRUE(sample.ok()) << sample.status();
    return sample.ok() ? sample->features : std::vector<double>(FeatureNames().size(), 0.0);
  };
  const std::string attention = R"(
dim b=4 m=512 n=512 k=16 h=16
in Q[b,m,k] K[b,n,k] V[b,n,h]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k]
P[b,m,n] = softmax(n) S[b,m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)";
  // One block on two cores, about 0.2 ms of work: no feature to undo it.
  std::vector<double> one = features(attention, "- / - / -");
  EXPECT_EQ(one[kShortLogAlpha], 0);
  EXPECT_EQ(one[kShortFewerBlocks], 0);
  // The same at 16 tokens, well under 20 us: the last wave is a feature.
  std::string tiny = attention;
  tiny.replace(tiny.find("m=512 n=512"), 11, "m=16 n=16");
  one = features(tiny, "- / - / -");
  EXPECT_GT(one[kShortLogAlpha], 0);
  EXPECT_GT(one[kShortFewerBlocks], 0);
  // Enough blocks for both cores: nothing idles, short or not.
  const std::vector<double> two = features(tiny, "b=2 / - / -");
  EXPECT_EQ(two[kShortLogAlpha], 0);
  EXPECT_EQ(two[kShortFewerBlocks], 0);
  constexpr int kWaves = 3;
  EXPECT_EQ(FeatureNames()[kWaves], "log_waves");
  EXPECT_EQ(one[kWaves], 0);
  EXPECT_EQ(two[kWaves], 0);
  EXPECT_DOUBLE_EQ(features(tiny, "b=1 / - / -")[kWaves], std::log(2.0));
}

TEST(LearnedModelTest, LearnsWhatTheAnalyticalModelMissesAndRanksHeldOutWorkloads) {
  const std::vector<Sample> samples = Synthetic(4, 30);
  auto model = LearnedModel::Train(samples);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->samples(), 120);
  EXPECT_EQ((*model)->groups(), 4);
  // The correction follows the pattern: one more own loop, about 0.4 more in log time.
  std::vector<double> f(FeatureNames().size(), 0.0);
  const double base = (*model)->LogCorrection(f);
  f[kOwnLoops] = 1;
  EXPECT_NEAR((*model)->LogCorrection(f) - base, 0.4, 0.05);
  // Beyond the range seen in training a feature is clipped.
  f[kOwnLoops] = 100;
  const double far = (*model)->LogCorrection(f);
  f[kOwnLoops] = 1000;
  EXPECT_DOUBLE_EQ((*model)->LogCorrection(f), far);
  const std::vector<HeldOut> held = LeaveOneGroupOut(samples);
  ASSERT_EQ(held.size(), 4u);
  for (const HeldOut& h : held) {
    EXPECT_TRUE(h.trained);
    EXPECT_EQ(h.samples, 30);
    EXPECT_GT(h.spearman_learned, 0.9) << h.group;
    EXPECT_LT(h.spearman_analytical, 0.5) << h.group;
    EXPECT_LT(h.top1_learned, 1.1) << h.group;
    EXPECT_LE(h.top1_learned, h.top1_analytical) << h.group;
  }
}

TEST(LearnedModelTest, RefusesTooLittleDataAndFallsBackToTheAnalyticalRanking) {
  auto few_groups = LearnedModel::Train(Synthetic(2, 40));
  EXPECT_EQ(few_groups.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(few_groups.status().message().find("2 workloads"), std::string::npos) << few_groups.status();
  EXPECT_EQ(LearnedModel::Train(Synthetic(4, 10)).status().code(), absl::StatusCode::kFailedPrecondition);
  // Three workloads: each held-out one leaves two, not enough; the
  // learned ranking is then the analytical one.
  for (const HeldOut& h : LeaveOneGroupOut(Synthetic(3, 30))) {
    EXPECT_FALSE(h.trained);
    EXPECT_DOUBLE_EQ(h.spearman_learned, h.spearman_analytical);
  }
}

TEST(LearnedModelTest, PersistsAsJson) {
  const std::vector<Sample> samples = Synthetic(3, 20);
  auto model = LearnedModel::Train(samples);
  ASSERT_TRUE(model.ok()) << model.status();
  auto back = LearnedModel::FromJson((*model)->ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->samples(), 60);
  EXPECT_EQ((*back)->groups(), 3);
  for (const Sample& s : samples) EXPECT_DOUBLE_EQ((*back)->LogCorrection(s.features), (*model)->LogCorrection(s.features));
  EXPECT_EQ(LearnedModel::FromJson("not json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LearnedModel::FromJson("{}").status().code(), absl::StatusCode::kInvalidArgument);
  std::string other = (*model)->ToJson();
  other.replace(other.find("own_loops"), 9, "own_loopz");
  EXPECT_NE(LearnedModel::FromJson(other).status().message().find("other features"), std::string::npos);
  // A feature's range upside down, or a weight that is not a number (JSON
  // null, as a NaN is written), is refused.
  nlohmann::json inverted = nlohmann::json::parse((*model)->ToJson());
  inverted["low"][0] = inverted["high"][0].get<double>() + 1;
  EXPECT_EQ(LearnedModel::FromJson(inverted.dump()).status().code(), absl::StatusCode::kInvalidArgument);
  nlohmann::json nan = nlohmann::json::parse((*model)->ToJson());
  nan["weights"][3] = nullptr;
  EXPECT_EQ(LearnedModel::FromJson(nan.dump()).status().code(), absl::StatusCode::kInvalidArgument);
}

// On real nests: the learned prediction is the analytical one scaled by
// the correction, and a space ranked with the model follows it.
TEST(LearnedModelTest, CorrectsTheAnalyticalPredictionOfANest) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  hw::TargetDesc target = testing::Avx2Target();
  target.bandwidth_bytes_per_s = 1e10;
  target.peak_flops = 1e11;
  auto space = space::BuildSpace(*chain, target);
  ASSERT_TRUE(space.ok()) << space.status();
  // Measured: analytical times exp(own loops), for three copies of the chain.
  std::vector<Sample> samples;
  for (const std::string group : {"a", "b", "c"}) {
    for (size_t i = 0; i < space->ranked.size() && i < 40; ++i) {
      const std::string text = space::ScheduleToText(space->ranked[i].schedule, *chain);
      auto first = MakeSample(*chain, text, target, 1, group);
      ASSERT_TRUE(first.ok()) << first.status();
      auto s = MakeSample(*chain, text, target, first->analytical_s * std::exp(first->features[kOwnLoops]), group);
      samples.push_back(*s);
    }
  }
  auto model = LearnedModel::Train(samples);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string text = space::ScheduleToText(space->ranked[0].schedule, *chain);
  auto nest = space::BuildLoopNest(*chain, space->ranked[0].schedule, target);
  ASSERT_TRUE(nest.ok());
  const Prediction analytical = model::Predict(*nest, target, *chain);
  const Prediction learned = (*model)->Predict(*nest, target, *chain);
  const double c = std::exp((*model)->LogCorrection(NestFeatures(*nest, target, *chain, analytical)));
  EXPECT_DOUBLE_EQ(learned.t_estm_s, analytical.t_estm_s * c);
  EXPECT_DOUBLE_EQ(learned.alpha, analytical.alpha);
  space::SpaceOptions options;
  options.model = model->get();
  auto ranked = space::BuildSpace(*chain, target, options);
  ASSERT_TRUE(ranked.ok());
  for (size_t i = 1; i < ranked->ranked.size(); ++i) {
    EXPECT_LE(ranked->ranked[i - 1].prediction.t_estm_s, ranked->ranked[i].prediction.t_estm_s);
  }
  // The learned ranking puts fewer own loops first than the analytical one did.
  auto features_of = [&](const space::Schedule& s) {
    auto n = space::BuildLoopNest(*chain, s, target);
    return NestFeatures(*n, target, *chain, model::Predict(*n, target, *chain))[kOwnLoops];
  };
  EXPECT_LE(features_of(ranked->ranked[0].schedule), features_of(space->ranked[0].schedule));
}

TEST(LearnedModelTest, SpearmanRanksWithTies) {
  EXPECT_DOUBLE_EQ(Spearman({1, 2, 3, 4}, {10, 20, 30, 40}), 1);
  EXPECT_DOUBLE_EQ(Spearman({1, 2, 3, 4}, {4, 3, 2, 1}), -1);
  EXPECT_DOUBLE_EQ(Spearman({1, 1, 1}, {1, 2, 3}), 0);  // constant side
  EXPECT_DOUBLE_EQ(Spearman({1}, {1}), 0);
  EXPECT_NEAR(Spearman({1, 2, 2, 3}, {1, 2, 3, 4}), 0.9487, 1e-4);
}

}  // namespace
}  // namespace fusor::model
