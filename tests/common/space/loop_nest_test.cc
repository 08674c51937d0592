#include "common/space/loop_nest.h"

#include <algorithm>
#include <functional>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/hw/devices.h"
#include "common/ir/parse.h"
#include "common/mapping/mapping.h"
#include "common/hw/intrinsic.h"
#include "common/model/cost_model.h"
#include "common/space/loop_nest_phases.h"
#include "common/space/schedule.h"
#include "tests/test_chains.h"

namespace fusor::space {
namespace {

using ::testing::HasSubstr;

// The fma.avx512.8x32 micro-kernel: tiles pad to 8 rows and 32 columns.
hw::TargetDesc Avx512() {
  hw::TargetDesc t;
  t.isa_features = {"avx512f"};
  t.vector_lanes_f32 = 16;
  return t;
}

const Statement* Find(const LoopNest& nest, const std::string& label) {
  for (const Statement& s : nest.statements) {
    if (s.label == label) return &s;
  }
  return nullptr;
}

LoopNest Nest(const ir::Chain& chain, const std::string& text) {
  auto schedule = ParseSchedule(text, chain);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  auto nest = BuildLoopNest(chain, *schedule, Avx512());
  EXPECT_TRUE(nest.ok()) << text << ": " << nest.status();
  return *nest;
}

std::vector<int> Dims(const ir::Chain& chain, std::initializer_list<const char*> names) {
  std::vector<int> out;
  for (const char* n : names) out.push_back(chain.FindDim(n));
  return out;
}

TEST(BlockEligibleDimsTest, OutputDimsNeverReducedAndReadUnchanged) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  // h is E's: C lacks it and is simply recomputed per h block.
  EXPECT_EQ(BlockEligibleDims(*chain), Dims(*chain, {"m", "h"}));
  auto transposed = ir::ParseChainText(R"(
dim m=8 n=8
in A[m,n]
T[m,n] = relu(A[m,n])
U[m,n] = T[n,m] * 2
out U
)");
  EXPECT_TRUE(BlockEligibleDims(*transposed).empty());
}

TEST(GemmFormTest, ClassifiesBatchRowsAndColumns) {
  auto chain = ir::ParseChainText(R"(
dim b=2 m=8 n=8 k=4
in Q[b,m,k] K[b,n,k]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.5
out S
)");
  auto m = DefaultMappingFor(*chain, 0, Avx512());
  ASSERT_TRUE(m.has_value());
  GemmForm g = FormOf(*chain, *mapping::ViewOp(*chain, 0), *m);
  ASSERT_TRUE(g.ok);
  EXPECT_DOUBLE_EQ(g.scale, 0.5);
  EXPECT_EQ(g.batch, Dims(*chain, {"b"}));
  EXPECT_EQ(g.rows, Dims(*chain, {"m"}));
  EXPECT_EQ(g.cols, Dims(*chain, {"n"}));
  EXPECT_EQ(g.kdims, Dims(*chain, {"k"}));
  auto generic = ir::ParseChainText("dim m=4 k=4\nin A[m,k]\nS[m] = sum(k) relu(A[m,k])\nout S");
  EXPECT_FALSE(DefaultMappingFor(*generic, 0, Avx512()).has_value());
}

// The statements and their LP_sets after hoisting, worked out by hand for
// m/-/C(n=32) E(h=16 n=32) of the 64x64x32x32 GEMM chain.
TEST(LoopNestTest, HoistsLoadsAndCountsTrafficByHand) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  LoopNest nest = Nest(*chain, "m=16 / - / C(n=32) E(h=16 n=32)");
  const int m = chain->FindDim("m"), n = chain->FindDim("n"), h = chain->FindDim("h");
  EXPECT_EQ(nest.num_blocks, 4);
  // Op C: k has one tile, so its loop vanishes and A hoists out of n.
  EXPECT_EQ(nest.ops[0].loops, (std::vector<int>{n}));
  EXPECT_EQ(nest.ops[0].a_depth, 0);
  EXPECT_EQ(nest.ops[0].b_depth, 1);
  const Statement* la = Find(nest, "L(A)");
  ASSERT_NE(la, nullptr);
  EXPECT_EQ(la->loops, (std::vector<int>{m}));
  EXPECT_DOUBLE_EQ(la->bytes, 16 * 32 * 4);
  EXPECT_DOUBLE_EQ(la->executions, 4);
  const Statement* lb = Find(nest, "L(B)");
  EXPECT_EQ(lb->loops, (std::vector<int>{m, n}));
  EXPECT_DOUBLE_EQ(lb->bytes, 32 * 32 * 4);
  EXPECT_DOUBLE_EQ(lb->executions, 8);
  // Op E: loops h then n (reduced); D depends on both; C is block-local.
  EXPECT_EQ(nest.ops[1].loops, (std::vector<int>{h, n}));
  EXPECT_EQ(Find(nest, "L(C)"), nullptr);
  const Statement* ld = Find(nest, "L(D)");
  EXPECT_EQ(ld->loops, (std::vector<int>{m, h, n}));
  EXPECT_DOUBLE_EQ(ld->bytes, 32 * 16 * 4);
  EXPECT_DOUBLE_EQ(ld->executions, 16);
  const Statement* se = Find(nest, "S(E)");
  EXPECT_EQ(se->loops, (std::vector<int>{m, h}));
  EXPECT_DOUBLE_EQ(se->bytes, 16 * 16 * 4);
  // Padded compute: C's tile is 16 x 32, E's 16 x 16 padded to 32 columns.
  EXPECT_DOUBLE_EQ(Find(nest, "C(C)")->flops, 2.0 * 16 * 32 * 32);
  EXPECT_DOUBLE_EQ(Find(nest, "C(E)")->flops, 2.0 * 16 * 32 * 32);
  EXPECT_EQ(nest.local[chain->FindTensor("C")].floats, 16 * 64);
}

// mhnk: m and h are block loops, n the stream loop, k C's own loop.
TEST(LoopNestTest, DeepTilingStoresEOutsideNAndK) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  LoopNest nest = Nest(*chain, "m=16 h=16 / n=32 / C(k=16)");
  const int m = chain->FindDim("m"), n = chain->FindDim("n"), k = chain->FindDim("k"), h = chain->FindDim("h");
  EXPECT_EQ(TilingExpression(nest.schedule, *chain), "mhnk");
  EXPECT_EQ(nest.ops[0].region, Region::kStream);
  EXPECT_TRUE(nest.ops[1].accumulates);
  // S_E leaves the n and k loops: it runs once per block, after the stream.
  EXPECT_EQ(Find(nest, "S(E)")->loops, (std::vector<int>{m, h}));
  // C is computed inside n and k, and (lacking h) once per h block.
  EXPECT_EQ(Find(nest, "C(C)")->loops, (std::vector<int>{m, h, n, k}));
  // L_A depends on k, so it stays inside the k loop.
  EXPECT_EQ(Find(nest, "L(A)")->loops, (std::vector<int>{m, h, n, k}));
  EXPECT_EQ(Find(nest, "L(D)")->loops, (std::vector<int>{m, h, n}));
}

TEST(LoopNestTest, FullKTileRemovesTheLoopAndHoistsLoadA) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  LoopNest nest = Nest(*chain, "m=16 h=16 / n=32 / -");
  const int m = chain->FindDim("m"), h = chain->FindDim("h");
  EXPECT_TRUE(nest.ops[0].loops.empty());
  EXPECT_TRUE(nest.ops[0].a_hoisted);
  EXPECT_FALSE(nest.ops[0].b_hoisted);
  EXPECT_EQ(Find(nest, "L(A)")->loops, (std::vector<int>{m, h}));
  EXPECT_DOUBLE_EQ(Find(nest, "L(A)")->bytes, 16 * 32 * 4);
}

// With h a block loop outside n, every h block computes C again; with h
// inside E's own loop, C is computed once per m block. The model charges
// exactly the recomputation.
TEST(LoopNestTest, HOutsideNRecomputesCAndTheModelCharges) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  LoopNest deep = Nest(*chain, "m=16 h=16 / n=32 / -");
  LoopNest flat = Nest(*chain, "m=16 / n=32 / E(h=16)");
  const Statement* c_deep = Find(deep, "C(C)");
  const Statement* c_flat = Find(flat, "C(C)");
  EXPECT_DOUBLE_EQ(c_deep->executions, 4 * 2 * 2);  // m, h, n
  EXPECT_DOUBLE_EQ(c_flat->executions, 4 * 2);      // m, n
  EXPECT_DOUBLE_EQ(c_deep->flops, c_flat->flops);
  hw::TargetDesc target;
  target.bandwidth_bytes_per_s = 1e9;
  target.peak_flops = 1e9;
  target.compute_units = 1;
  model::Prediction p_deep = model::Predict(deep, target, *chain);
  model::Prediction p_flat = model::Predict(flat, target, *chain);
  const double extra_c = c_deep->flops * (c_deep->executions - c_flat->executions) / 1e9;
  // E's compute is the same work tiled differently (16 x 32 padded tiles either way).
  EXPECT_DOUBLE_EQ(p_deep.t_comp_s - p_flat.t_comp_s, extra_c);
  // A and B are also loaded once per h block instead of once per m block.
  EXPECT_GT(p_deep.t_mem_s, p_flat.t_mem_s);
}

TEST(LoopNestTest, RegionsFollowDependencies) {
  auto chain = ir::ParseChainText(R"(
dim m=32 n=32 k=16 h=16
in A[m,k] B[k,n] D[n,h] Z[h] W[m]
V[m] = W[m] * 2
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
G[m,h] = relu(E[m,h] + Z[h]) * V[m]
out G
)");
  LoopNest nest = Nest(*chain, "m=16 / n=16 / -");
  EXPECT_EQ(nest.ops[0].region, Region::kBefore);  // V: no n, hoisted out of the stream loop
  EXPECT_EQ(nest.ops[1].region, Region::kStream);  // C: a tile per n step
  EXPECT_EQ(nest.ops[2].region, Region::kStream);  // E: accumulates across n
  EXPECT_TRUE(nest.ops[2].accumulates);
  EXPECT_EQ(nest.ops[3].region, Region::kAfter);   // G: needs all of E
  EXPECT_EQ(nest.local[chain->FindTensor("C")].shape, (std::vector<int64_t>{16, 16}));
}

TEST(LoopNestTest, OnlineSoftmaxAlongTheStreamLoop) {
  auto chain = ir::ParseChainText(testing::kMaskedF16Attention);
  LoopNest nest = Nest(*chain, "b=1 m=16 / n=16 / -");
  EXPECT_TRUE(nest.ops[1].online);
  EXPECT_EQ(nest.ops[2].online_softmax, 1);
  EXPECT_GT(nest.ops[1].state_floats, 0);
  EXPECT_EQ(TilingExpression(nest.schedule, *chain), "bmn");
}

// Intermediates in registers: attention and GEMM chains, whole rows
// (no own loops), rows within the warps; the variant sizes the warps.
TEST(LoopNestTest, RegisterResidentIntermediates) {
  const hw::TargetDesc gpu = *hw::LookupDevice("h200");
  auto attention = ir::ParseChainText(testing::kMaskedF16Attention);
  auto nest = [&](const ir::Chain& chain, const std::string& text) {
    return BuildLoopNest(chain, *ParseSchedule(text, chain), gpu);
  };
  EXPECT_TRUE(nest(*attention, "b=1 m=16 / n=16 / - / cuda registers").ok());
  EXPECT_THAT(std::string(nest(*attention, "b=1 m=16 / n=16 / O(h=8) / cuda registers").status().message()),
              HasSubstr("no op may have own loops"));
  EXPECT_THAT(std::string(nest(*attention, "b=1 / n=16 / - / cuda warps=1 registers").status().message()),
              HasSubstr("exceeds 32 rows per warp"));
  // A third cp.async stage only with intermediates in registers.
  EXPECT_TRUE(nest(*attention, "b=1 m=16 / n=16 / - / cuda stages=3 registers").ok());
  EXPECT_THAT(std::string(nest(*attention, "b=1 m=16 / n=16 / - / cuda stages=3").status().message()),
              HasSubstr("three stages apply to intermediates in registers only"));
  // Two row fragments per warp take whole pairs of fragments.
  EXPECT_TRUE(nest(*attention, "b=1 m=32 / n=16 / - / cuda warps=1 registers").ok());
  EXPECT_THAT(std::string(nest(*attention, "b=1 / n=16 / - / cuda warps=2 registers").status().message()),
              HasSubstr("multiple of 32"));
  EXPECT_THAT(std::string(nest(*attention, "b=1 m=16 / - / - / cuda registers").status().message()),
              HasSubstr("needs a stream loop"));
  // A GEMM chain too (no softmax), unless its intermediate is an output.
  auto gemm = ir::ParseChainText(testing::kGemmChain);
  EXPECT_TRUE(nest(*gemm, "m=16 / n=16 / - / cuda registers").ok());
  auto both = ir::ParseChainText(std::string(testing::kGemmChain).replace(std::string(testing::kGemmChain).find("out E"), 5, "out C E"));
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_THAT(std::string(nest(*both, "m=16 / n=16 / - / cuda registers").status().message()),
              HasSubstr("an intermediate is a chain output"));

  auto variant = RegisterResidentVariant(*attention, *ParseSchedule("b=1 / n=16 / O(h=8)", *attention), gpu);
  ASSERT_TRUE(variant.has_value());
  EXPECT_EQ(ScheduleToText(*variant, *attention), "b=1 / n=16 / - / cuda registers");  // 33 rows: 4 warps
  EXPECT_FALSE(RegisterResidentVariant(*both, *ParseSchedule("m=16 / n=16 / -", *both), gpu).has_value());
}

// A split stream loop: the parts are blocks; what runs outside the loop
// runs once per part, and the partial sums are read back and added.
TEST(LoopNestTest, SplitStreamLoop) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  LoopNest whole = Nest(*chain, "m=16 / n=16 / C(k=16)");
  LoopNest split = Nest(*chain, "m=16 / n=16x2 / C(k=16)");
  EXPECT_EQ(split.split, 2);
  EXPECT_EQ(split.num_blocks, 2 * whole.num_blocks);
  // L(D) sits inside the n loop: the same traffic either way. S(E) sits
  // outside it: once per part.
  EXPECT_DOUBLE_EQ(Find(split, "L(D)")->executions, Find(whole, "L(D)")->executions);
  EXPECT_DOUBLE_EQ(Find(split, "S(E)")->executions, 2 * Find(whole, "S(E)")->executions);
  ASSERT_NE(Find(split, "L(E partials)"), nullptr);
  EXPECT_DOUBLE_EQ(Find(split, "L(E partials)")->bytes, 64.0 * 32 * 4 * 2);

  auto error = [&](const ir::Chain& c, const std::string& text, const hw::TargetDesc& target) {
    auto nest = BuildLoopNest(c, *ParseSchedule(text, c), target);
    EXPECT_FALSE(nest.ok()) << text;
    return std::string(nest.status().message());
  };
  auto attention = ir::ParseChainText(testing::kMaskedF16Attention);
  EXPECT_THAT(error(*attention, "b=1 / n=16x2 / -", Avx512()), HasSubstr("a softmax is online along it"));
  auto epilogue = ir::ParseChainText(R"(
dim m=64 n=64 k=32 h=32
in A[m,k] B[k,n] D[n,h] Z[h]
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
G[m,h] = relu(E[m,h] + Z[h])
out G
)");
  EXPECT_THAT(error(*epilogue, "m=16 / n=16x2 / -", Avx512()), HasSubstr("what accumulates along it is not an output"));
  EXPECT_THAT(error(*chain, "m=16 / n=32x4 / -", Avx512()), HasSubstr("more parts than the loop has steps"));
  // A GPU splits a nest in shared memory by the same rules, a
  // register-resident one with its softmax too; no part may be empty.
  const hw::TargetDesc gpu = *hw::LookupDevice("h100");
  EXPECT_TRUE(BuildLoopNest(*chain, *ParseSchedule("m=16 / n=16x2 / -", *chain), gpu).ok());
  EXPECT_THAT(error(*attention, "b=1 / n=16x2 / -", gpu), HasSubstr("a softmax is online along it"));
  EXPECT_TRUE(BuildLoopNest(*attention, *ParseSchedule("b=1 m=16 / n=16x2 / - / cuda registers", *attention), gpu).ok());
  EXPECT_THAT(error(*chain, "m=16 / n=16x3 / -", gpu), HasSubstr("a part would have no steps"));  // 4 steps: 2, 2, 0
}

TEST(LoopNestTest, RejectsIllegalNests) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  auto error = [&](const std::string& text) {
    auto schedule = ParseSchedule(text, *chain);
    if (!schedule.ok()) return std::string(schedule.status().message());
    auto nest = BuildLoopNest(*chain, *schedule, Avx512());
    EXPECT_FALSE(nest.ok()) << text;
    return std::string(nest.status().message());
  };
  EXPECT_THAT(error("n=16 / - / -"), HasSubstr("cannot be a block loop"));
  EXPECT_THAT(error("- / k=16 / -"), HasSubstr("fewer than two ops"));
  EXPECT_THAT(error("- / - / C(h=16)"), HasSubstr("is not a loop of 'C'"));
  EXPECT_THAT(error("- / - / E(n=16 m=16)"), HasSubstr("output dims come before reduced dims"));
  EXPECT_THAT(error("m=16 / - / C(m=16)"), HasSubstr("already a block or stream loop"));
  EXPECT_THAT(error("m=16 / - / - / cuda warps=8"), HasSubstr("CUDA targets only"));
  EXPECT_THAT(error("m=16 / - / - / cuda registers"), HasSubstr("CUDA targets only"));
  auto attention = ir::ParseChainText(std::string(testing::kMaskedF16Attention) + "out P\n");
  auto s = ParseSchedule("b=1 / n=16 / -", *attention);
  EXPECT_THAT(std::string(BuildLoopNest(*attention, *s, Avx512()).status().message()),
              HasSubstr("is an output; it cannot be online"));
}

// The phases of BuildLoopNest, one at a time (loop_nest_phases.h).

// The phases after StartNest, in the order BuildLoopNest runs them.
enum class Phase {
  kPlaceLoops,
  kPlaceRegions,
  kResolveMappings,
  kCheckStreamLoopFuses,
  kLinkOnlineSoftmax,
  kLayOutBuffers,
  kPlaceStatements,
  kSkipCausalTiles,
  kSplitStreamLoop,
  kCheckRegisters,
};

absl::Status RunPhase(Phase phase, const ir::Chain& chain, const hw::TargetDesc& target, LoopNest& nest) {
  const NestContext context = MakeNestContext(chain, target);
  switch (phase) {
    case Phase::kPlaceLoops: return phases::PlaceLoops(chain, context, nest);
    case Phase::kPlaceRegions: return phases::PlaceRegions(chain, nest);
    case Phase::kResolveMappings: return phases::ResolveMappings(chain, context, nest);
    case Phase::kCheckStreamLoopFuses: return phases::CheckStreamLoopFuses(chain, nest);
    case Phase::kLinkOnlineSoftmax: return phases::LinkOnlineSoftmax(chain, nest);
    case Phase::kLayOutBuffers: phases::LayOutBuffers(chain, nest); return absl::OkStatus();
    case Phase::kPlaceStatements: phases::PlaceStatements(chain, nest); return absl::OkStatus();
    case Phase::kSkipCausalTiles: phases::SkipCausalTiles(chain, target, nest); return absl::OkStatus();
    case Phase::kSplitStreamLoop: return phases::SplitStreamLoop(chain, target, nest);
    case Phase::kCheckRegisters: return phases::CheckRegisters(chain, nest);
  }
  return absl::InternalError("unknown phase");
}

// The nest of `schedule` after StartNest and every phase before `next`,
// each expected to succeed.
LoopNest NestBefore(Phase next, const ir::Chain& chain, const Schedule& schedule, const hw::TargetDesc& target) {
  auto started = phases::StartNest(chain, schedule, target);
  EXPECT_TRUE(started.ok()) << started.status();
  if (!started.ok()) return LoopNest();
  LoopNest nest = *std::move(started);
  for (int p = 0; p < static_cast<int>(next); ++p) {
    absl::Status status = RunPhase(static_cast<Phase>(p), chain, target, nest);
    EXPECT_TRUE(status.ok()) << "phase " << p << ": " << status;
  }
  return nest;
}

Schedule Parsed(const ir::Chain& chain, const std::string& text) {
  auto schedule = ParseSchedule(text, chain);
  EXPECT_TRUE(schedule.ok()) << text << ": " << schedule.status();
  return schedule.ok() ? *schedule : UntiledSchedule(chain);
}

LoopNest NestBefore(Phase next, const ir::Chain& chain, const std::string& text,
                    const hw::TargetDesc& target = Avx512()) {
  return NestBefore(next, chain, Parsed(chain, text), target);
}

// The message of `phase`'s error on `schedule`, every phase before it
// having succeeded; "" when `phase` succeeds.
std::string PhaseError(Phase phase, const ir::Chain& chain, const Schedule& schedule,
                       const hw::TargetDesc& target = Avx512()) {
  LoopNest nest = NestBefore(phase, chain, schedule, target);
  return std::string(RunPhase(phase, chain, target, nest).message());
}

std::string PhaseError(Phase phase, const ir::Chain& chain, const std::string& text,
                       const hw::TargetDesc& target = Avx512()) {
  return PhaseError(phase, chain, Parsed(chain, text), target);
}

// `text` parsed, then changed by `edit` (for schedules the parser refuses).
Schedule Edited(const ir::Chain& chain, const std::string& text, const std::function<void(Schedule&)>& edit) {
  Schedule s = Parsed(chain, text);
  edit(s);
  return s;
}

TEST(StartNestTest, CanonicalScheduleAndTrips) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  const int m = chain->FindDim("m"), n = chain->FindDim("n"), k = chain->FindDim("k"), h = chain->FindDim("h");
  // h's tile is looped over by nobody: canonically its full extent.
  Schedule s = Edited(*chain, "m=16 / n=32 / C(k=16)", [&](Schedule& s) { s.tile[h] = 8; });
  auto nest = phases::StartNest(*chain, s, Avx512());
  ASSERT_TRUE(nest.ok()) << nest.status();
  EXPECT_EQ(nest->schedule, Canonical(s, *chain));
  EXPECT_EQ(nest->schedule.tile[h], 32);
  std::vector<int64_t> trips(4);
  trips[m] = 4;
  trips[n] = 2;
  trips[k] = 2;
  trips[h] = 1;
  EXPECT_EQ(nest->trips, trips);
  // Loops and ops are left to the phases after it.
  EXPECT_EQ(nest->num_blocks, 1);
  EXPECT_EQ(nest->stream_dim, -1);
  EXPECT_TRUE(nest->ops.empty());
  EXPECT_TRUE(nest->statements.empty());
  // Extents no tile divides round the trips up.
  auto attention = ir::ParseChainText(testing::kMaskedF16Attention);
  auto padded = phases::StartNest(*attention, Parsed(*attention, "b=1 m=16 / n=16 / -"), Avx512());
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_EQ(padded->trips, (std::vector<int64_t>{2, 3, 3, 1, 1}));  // b m n k h
}

TEST(StartNestTest, RejectsMalformedSchedules) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  const int m = chain->FindDim("m");
  auto error = [&](const std::function<void(Schedule&)>& edit, const hw::TargetDesc& target = Avx512()) {
    auto nest = phases::StartNest(*chain, Edited(*chain, "m=16 / n=32 / -", edit), target);
    return std::string(nest.status().message());
  };
  EXPECT_EQ(error([](Schedule& s) { s.tile.pop_back(); }), "schedule: wrong number of tile sizes");
  EXPECT_EQ(error([&](Schedule& s) { s.tile[m] = 0; }), "schedule: tile 0 of 'm' out of range");
  EXPECT_EQ(error([&](Schedule& s) { s.tile[m] = 65; }), "schedule: tile 65 of 'm' out of range");
  EXPECT_EQ(error([](Schedule& s) { s.own.resize(3); }), "schedule: loops given for more ops than the chain has");
  const std::string cuda_only = "schedule: warps, stages and registers apply to CUDA targets only";
  EXPECT_EQ(error([](Schedule& s) { s.warps = 8; }), cuda_only);
  EXPECT_EQ(error([](Schedule& s) { s.stages = 1; }), cuda_only);
  EXPECT_EQ(error([](Schedule& s) { s.warps = 8; }, *hw::LookupDevice("h100")), "");
  // The default warps canonically read as none, on any target.
  EXPECT_EQ(error([](Schedule& s) { s.warps = kDefaultWarps; }), "");
}

TEST(PlaceLoopsTest, CountsBlocksAndNamesTheStreamDim) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  LoopNest nest = NestBefore(Phase::kPlaceRegions, *chain, "m=16 h=16 / n=32 / C(k=16)");
  EXPECT_EQ(nest.num_blocks, 4 * 2);
  EXPECT_EQ(nest.stream_dim, chain->FindDim("n"));
  EXPECT_TRUE(nest.ops.empty());  // regions come next
  LoopNest flat = NestBefore(Phase::kPlaceRegions, *chain, "- / - / C(m=16)");
  EXPECT_EQ(flat.num_blocks, 1);
  EXPECT_EQ(flat.stream_dim, -1);
}

TEST(PlaceLoopsTest, RejectsIllegalLoops) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  const int m = chain->FindDim("m"), n = chain->FindDim("n"), k = chain->FindDim("k");
  EXPECT_THAT(PhaseError(Phase::kPlaceLoops, *chain, "n=16 / - / -"), HasSubstr("'n' cannot be a block loop"));
  Schedule two_streams = Edited(*chain, "m=16 / n=32 / C(k=16)", [&](Schedule& s) {
    s.own[0].clear();
    s.stream = {n, k};
  });
  EXPECT_EQ(PhaseError(Phase::kPlaceLoops, *chain, two_streams), "schedule: at most one stream loop");
  Schedule both = Edited(*chain, "m=16 / - / -", [&](Schedule& s) { s.stream = {m}; });
  EXPECT_EQ(PhaseError(Phase::kPlaceLoops, *chain, both), "schedule: a dim cannot be both a block and a stream loop");
  EXPECT_EQ(PhaseError(Phase::kPlaceLoops, *chain, "- / - / C(h=16)"), "schedule: 'h' is not a loop of 'C'");
  EXPECT_EQ(PhaseError(Phase::kPlaceLoops, *chain, "m=16 / - / C(m=16)"),
            "schedule: 'm' is already a block or stream loop");
  EXPECT_EQ(PhaseError(Phase::kPlaceLoops, *chain, "- / n=16 / E(n=16)"),
            "schedule: 'n' is already a block or stream loop");
  EXPECT_EQ(PhaseError(Phase::kPlaceLoops, *chain, "- / - / E(n=16 m=16)"),
            "schedule: loops of 'E': output dims come before reduced dims");
  auto attention = ir::ParseChainText(testing::kMaskedF16Attention);
  const int an = attention->FindDim("n");
  Schedule softmax_own = Edited(*attention, "b=1 / - / -", [&](Schedule& s) {
    s.tile[an] = 16;
    s.own[1] = {an};
  });
  EXPECT_EQ(PhaseError(Phase::kPlaceLoops, *attention, softmax_own), "schedule: only sum ops have own loops ('P')");
}

TEST(PlaceRegionsTest, RegionsFollowDependencies) {
  auto chain = ir::ParseChainText(R"(
dim m=32 n=32 k=16 h=16
in A[m,k] B[k,n] D[n,h] Z[h] W[m]
V[m] = W[m] * 2
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
G[m,h] = relu(E[m,h] + Z[h]) * V[m]
out G
)");
  LoopNest nest = NestBefore(Phase::kResolveMappings, *chain, "m=16 / n=16 / -");
  ASSERT_EQ(nest.ops.size(), 4u);
  for (int o = 0; o < 4; ++o) EXPECT_EQ(nest.ops[o].op, o);
  EXPECT_EQ(nest.ops[0].region, Region::kBefore);
  EXPECT_EQ(nest.ops[1].region, Region::kStream);
  EXPECT_EQ(nest.ops[2].region, Region::kStream);
  EXPECT_EQ(nest.ops[3].region, Region::kAfter);
  EXPECT_FALSE(nest.ops[1].accumulates);
  EXPECT_TRUE(nest.ops[2].accumulates);
  EXPECT_FALSE(nest.ops[2].gemm.ok);  // mappings come next
  // Without a stream loop everything runs before it.
  LoopNest flat = NestBefore(Phase::kResolveMappings, *chain, "m=16 / - / -");
  for (const OpNest& on : flat.ops) {
    EXPECT_EQ(on.region, Region::kBefore);
    EXPECT_FALSE(on.accumulates);
  }
  // A softmax along the stream dim is online; its consumer accumulates.
  auto attention = ir::ParseChainText(testing::kMaskedF16Attention);
  LoopNest online = NestBefore(Phase::kResolveMappings, *attention, "b=1 m=16 / n=16 / -");
  EXPECT_FALSE(online.ops[0].online);
  EXPECT_TRUE(online.ops[1].online);
  EXPECT_EQ(online.ops[1].region, Region::kStream);
  EXPECT_TRUE(online.ops[2].accumulates);
  EXPECT_EQ(online.ops[2].online_softmax, -1);  // linked later
}

TEST(PlaceRegionsTest, RejectsTilesReadAcrossOrBesideCompleteResults) {
  auto transposed = ir::ParseChainText(R"(
dim m=32 n=32 k=16
in A[m,k] B[k,n]
C[m,n] = sum(k) A[m,k] * B[k,n]
T[m,n] = C[n,m] * 2
out T
)");
  EXPECT_EQ(PhaseError(Phase::kPlaceRegions, *transposed, "- / n=16 / -"),
            "schedule: 'T' reads 'C' across the 'n' loop");
  auto mixed = ir::ParseChainText(R"(
dim m=32 n=32 k=16
in A[m,k] B[k,n]
C[m,n] = sum(k) A[m,k] * B[k,n]
F[m] = sum(n) C[m,n]
G[m,n] = C[m,n] * F[m]
out G
)");
  EXPECT_EQ(PhaseError(Phase::kPlaceRegions, *mixed, "- / n=16 / -"),
            "schedule: 'G' needs both a result complete after the 'n' loop and a tile of 'C' made inside it");
  EXPECT_EQ(PhaseError(Phase::kPlaceRegions, *mixed, "- / - / -"), "");
}

TEST(ResolveMappingsTest, DefaultsAndChosenMappingsSetTheRate) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  const int m = chain->FindDim("m"), n = chain->FindDim("n"), k = chain->FindDim("k"), h = chain->FindDim("h");
  LoopNest nest = NestBefore(Phase::kCheckStreamLoopFuses, *chain, "m=16 / n=32 / -");
  for (const OpNest& on : nest.ops) {
    ASSERT_NE(on.mapping.intrinsic, nullptr);
    EXPECT_EQ(on.mapping.intrinsic->name, "fma.avx512.8x32");
    EXPECT_EQ(on.kernel.name, "fma.avx512.8x32");
    EXPECT_EQ(on.kernel.mr, 8);
    EXPECT_EQ(on.kernel.nr, 32);
    EXPECT_DOUBLE_EQ(on.rate, 1.0);  // the widest vectors reach all of P
    EXPECT_TRUE(on.gemm.ok);
  }
  EXPECT_EQ(nest.ops[0].gemm.rows, (std::vector<int>{m}));
  EXPECT_EQ(nest.ops[0].gemm.cols, (std::vector<int>{n}));
  EXPECT_EQ(nest.ops[0].gemm.kdims, (std::vector<int>{k}));
  EXPECT_EQ(nest.ops[1].gemm.cols, (std::vector<int>{h}));
  EXPECT_EQ(nest.ops[1].gemm.kdims, (std::vector<int>{n}));
  EXPECT_TRUE(nest.ops[0].loops.empty());  // statements come later
  EXPECT_EQ(nest.ops[0].acc_floats, 0);

  // A mapping onto 4-lane vectors runs at a quarter of the 16-lane P.
  const hw::Intrinsic* simd4 = hw::FindIntrinsic("simd4.4x8");
  ASSERT_NE(simd4, nullptr);
  auto narrow = mapping::DefaultMapping(*chain, *mapping::ViewOp(*chain, 0), *simd4);
  ASSERT_TRUE(narrow.has_value());
  Schedule s = Edited(*chain, "m=16 / n=32 / -", [&](Schedule& s) { s.maps[0] = *narrow; });
  LoopNest mapped = NestBefore(Phase::kCheckStreamLoopFuses, *chain, s, Avx512());
  EXPECT_EQ(mapped.ops[0].kernel.name, "simd4.4x8");
  EXPECT_EQ(mapped.ops[0].kernel.mr, 4);
  EXPECT_DOUBLE_EQ(mapped.ops[0].rate, 0.25);
  EXPECT_EQ(mapped.ops[1].kernel.name, "fma.avx512.8x32");

  // Scalar code: a softmax, and a sum that is no product, at 1/16 of P on
  // the CPU; on a GPU the sums run on mma.sync.
  auto attention = ir::ParseChainText(testing::kMaskedF16Attention);
  LoopNest cpu = NestBefore(Phase::kCheckStreamLoopFuses, *attention, "b=1 m=16 / n=16 / -");
  EXPECT_DOUBLE_EQ(cpu.ops[1].rate, 1.0 / 16);
  EXPECT_EQ(cpu.ops[1].mapping.intrinsic, nullptr);
  LoopNest gpu = NestBefore(Phase::kCheckStreamLoopFuses, *attention, "b=1 m=16 / n=16 / -", *hw::LookupDevice("h100"));
  EXPECT_EQ(gpu.ops[0].mapping.intrinsic->name, "mma.sync.m16n8k16.f16");
  EXPECT_DOUBLE_EQ(gpu.ops[0].rate, 0.65);
  EXPECT_DOUBLE_EQ(gpu.ops[1].rate, 1.0 / 16);
  auto generic = ir::ParseChainText("dim m=4 k=4\nin A[m,k]\nS[m] = sum(k) relu(A[m,k])\nout S");
  LoopNest scalar = NestBefore(Phase::kCheckStreamLoopFuses, *generic, "- / - / -");
  EXPECT_FALSE(scalar.ops[0].gemm.ok);
  EXPECT_EQ(scalar.ops[0].mapping.intrinsic, nullptr);
  EXPECT_DOUBLE_EQ(scalar.ops[0].rate, 1.0 / 16);
}

TEST(ResolveMappingsTest, RejectsMappingsTheOpOrTargetCannotTake) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  auto with_map = [&](int op, std::optional<mapping::Mapping> m) {
    EXPECT_TRUE(m.has_value());
    return Edited(*chain, "m=16 / n=32 / -", [&](Schedule& s) { s.maps[op] = m.value_or(mapping::Mapping()); });
  };
  hw::TargetDesc avx2;
  avx2.vector_lanes_f32 = 8;
  avx2.isa_features = {"avx2", "fma"};
  EXPECT_EQ(PhaseError(Phase::kResolveMappings, *chain, with_map(0, DefaultMappingFor(*chain, 0, avx2))),
            "schedule: the target cannot use fma.avx2.6x16 for f32");
  EXPECT_THAT(PhaseError(Phase::kResolveMappings, *chain, with_map(0, DefaultMappingFor(*chain, 1, Avx512()))),
              HasSubstr("schedule: mapping of 'C' is invalid: "));
  auto relu = ir::ParseChainText(R"(
dim m=32 n=32 k=16 h=16
in A[m,k] B[k,n] F[n,h]
C[m,n] = sum(k) relu(A[m,k]) * B[k,n]
D[m,h] = sum(n) C[m,n] * F[n,h]
out D
)");
  auto d_map = DefaultMappingFor(*relu, 1, Avx512());
  ASSERT_TRUE(d_map.has_value());
  Schedule s = Edited(*relu, "- / - / -", [&](Schedule& s) { s.maps[0] = *d_map; });
  EXPECT_EQ(PhaseError(Phase::kResolveMappings, *relu, s),
            "schedule: 'C' cannot be mapped: it is not a product of tensors");
}

TEST(CheckStreamLoopFusesTest, NeedsTwoOpsInTheStreamLoop) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  EXPECT_EQ(PhaseError(Phase::kCheckStreamLoopFuses, *chain, "- / k=16 / -"),
            "schedule: the 'k' stream loop encloses fewer than two ops");
  EXPECT_EQ(PhaseError(Phase::kCheckStreamLoopFuses, *chain, "m=16 / n=32 / -"), "");
  EXPECT_EQ(PhaseError(Phase::kCheckStreamLoopFuses, *chain, "m=16 / - / -"), "");
}

TEST(LinkOnlineSoftmaxTest, LinksTheSumThatRescales) {
  auto attention = ir::ParseChainText(testing::kMaskedF16Attention);
  LoopNest nest = NestBefore(Phase::kLinkOnlineSoftmax, *attention, "b=1 m=16 / n=16 / -");
  ASSERT_TRUE(phases::LinkOnlineSoftmax(*attention, nest).ok());
  EXPECT_EQ(nest.ops[0].online_softmax, -1);
  EXPECT_EQ(nest.ops[1].online_softmax, -1);
  EXPECT_EQ(nest.ops[2].online_softmax, 1);
  // Not online without the stream loop over its axis.
  LoopNest offline = NestBefore(Phase::kLinkOnlineSoftmax, *attention, "b=1 m=16 / - / -");
  ASSERT_TRUE(phases::LinkOnlineSoftmax(*attention, offline).ok());
  EXPECT_EQ(offline.ops[2].online_softmax, -1);
}

TEST(LinkOnlineSoftmaxTest, RejectsOutputsAndSharedSoftmaxes) {
  auto output = ir::ParseChainText(std::string(testing::kMaskedF16Attention) + "out P\n");
  EXPECT_EQ(PhaseError(Phase::kLinkOnlineSoftmax, *output, "b=1 / n=16 / -"),
            "schedule: softmax 'P' along the stream loop is an output; it cannot be online");
  auto shared = ir::ParseChainText(R"(
dim m=32 n=32 k=16 h=16
in Q[m,k] K[n,k] V[n,h] W[n,h]
S[m,n] = sum(k) Q[m,k] * K[n,k]
P[m,n] = softmax(n) S[m,n]
O[m,h] = sum(n) P[m,n] * V[n,h]
R[m,h] = sum(n) P[m,n] * W[n,h]
out O R
)");
  EXPECT_EQ(PhaseError(Phase::kLinkOnlineSoftmax, *shared, "m=16 / n=16 / -"),
            "schedule: softmax 'P' along the stream loop must feed exactly one sum over 'n' as a factor");
}

TEST(LayOutBuffersTest, TilesAlongBlockAndStreamLoops) {
  auto chain = ir::ParseChainText(R"(
dim m=32 n=32 k=16 h=16
in A[m,k] B[k,n] D[n,h] Z[h] W[m]
V[m] = W[m] * 2
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
G[m,h] = relu(E[m,h] + Z[h]) * V[m]
out G
)");
  LoopNest nest = NestBefore(Phase::kLayOutBuffers, *chain, "m=16 / n=16 / -");
  phases::LayOutBuffers(*chain, nest);
  ASSERT_EQ(nest.local.size(), chain->tensors.size());
  const LocalBuffer& v = nest.local[chain->FindTensor("V")];
  EXPECT_EQ(v.shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(v.relative, (std::vector<bool>{true}));
  // C: a tile per step of n.
  const LocalBuffer& c = nest.local[chain->FindTensor("C")];
  EXPECT_EQ(c.shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(c.relative, (std::vector<bool>{true, true}));
  // E accumulates across n: m's tile, all of h.
  const LocalBuffer& e = nest.local[chain->FindTensor("E")];
  EXPECT_EQ(e.floats, 16 * 16);
  EXPECT_EQ(e.relative, (std::vector<bool>{true, false}));
  // G is read by nothing and accumulates nothing; inputs have no buffer.
  EXPECT_EQ(nest.local[chain->FindTensor("G")].floats, 0);
  EXPECT_EQ(nest.local[chain->FindTensor("A")].floats, 0);
  EXPECT_EQ(nest.intermediate_bytes, (16 + 16 * 16 + 16 * 16) * 4);
  EXPECT_TRUE(nest.statements.empty());
}

// m/n/- of the 64x64x32x32 GEMM chain on fma.avx512.8x32, by hand.
TEST(PlaceStatementsTest, GemmChainByHand) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  const int m = chain->FindDim("m"), n = chain->FindDim("n");
  LoopNest nest = NestBefore(Phase::kPlaceStatements, *chain, "m=16 / n=32 / -");
  phases::PlaceStatements(*chain, nest);
  std::vector<std::string> labels;
  for (const Statement& st : nest.statements) labels.push_back(st.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"L(A)", "L(B)", "C(C)", "L(D)", "C(E)", "S(E)"}));
  // C: a 16 x 32 tile over all 32 of k. A does not depend on n: hoisted.
  const OpNest& c = nest.ops[0];
  EXPECT_EQ(c.rows_tile, 16);
  EXPECT_EQ(c.cols_tile, 32);
  EXPECT_EQ(c.k_tile, 32);
  EXPECT_EQ(c.acc_floats, 16 * 32);
  EXPECT_EQ(c.pack_a_floats, 32 * 16);
  EXPECT_EQ(c.pack_b_floats, 32 * 32);
  EXPECT_TRUE(c.a_hoisted);
  EXPECT_FALSE(c.b_hoisted);
  EXPECT_EQ(Find(nest, "L(A)")->loops, (std::vector<int>{m}));
  EXPECT_DOUBLE_EQ(Find(nest, "L(A)")->executions, 4);
  EXPECT_EQ(Find(nest, "L(B)")->loops, (std::vector<int>{m, n}));
  EXPECT_DOUBLE_EQ(Find(nest, "L(B)")->bytes, 32 * 32 * 4);
  EXPECT_DOUBLE_EQ(Find(nest, "C(C)")->flops, 2.0 * 16 * 32 * 32);
  EXPECT_DOUBLE_EQ(Find(nest, "C(C)")->executions, 8);
  EXPECT_DOUBLE_EQ(Find(nest, "C(C)")->rate, 1.0);
  // E accumulates along n and stores once per block.
  EXPECT_EQ(Find(nest, "S(E)")->loops, (std::vector<int>{m}));
  EXPECT_DOUBLE_EQ(Find(nest, "S(E)")->bytes, 16 * 32 * 4);
  // No padding: 16 rows and 32 columns fit the 8 x 32 block.
  EXPECT_DOUBLE_EQ(nest.padded_flops, 2 * (2.0 * 16 * 32 * 32) * 8);
  EXPECT_DOUBLE_EQ(nest.useful_flops, nest.padded_flops);
  // Both ops run in the stream loop, so their scratch adds up; C and E
  // are 16 x 32 local buffers.
  EXPECT_EQ(nest.intermediate_bytes, 2 * 16 * 32 * 4);
  EXPECT_EQ(nest.scratch_bytes, nest.intermediate_bytes + 2 * (512 + 512 + 1024) * 4);
}

TEST(PlaceStatementsTest, SoftmaxRowsAndOnlineRescaling) {
  auto attention = ir::ParseChainText(testing::kMaskedF16Attention);
  const int b = attention->FindDim("b"), m = attention->FindDim("m"), n = attention->FindDim("n");
  LoopNest nest = NestBefore(Phase::kPlaceStatements, *attention, "b=1 m=16 / n=16 / -");
  phases::PlaceStatements(*attention, nest);
  // P: 1 x 16 x 16 points, two nodes (+, *) plus the softmax's four.
  EXPECT_DOUBLE_EQ(Find(nest, "C(P)")->flops, 16 * 16 * 6);
  EXPECT_DOUBLE_EQ(Find(nest, "C(P)")->rate, 1);
  EXPECT_EQ(nest.ops[1].row_floats, 16);
  EXPECT_EQ(nest.ops[1].state_floats, 3 * 16);
  EXPECT_EQ(Find(nest, "L(M)")->loops, (std::vector<int>{b, m, n}));
  // O rescales its 1 x 16 x 24 accumulator at every n step and divides it
  // once after the loop.
  std::vector<const Statement*> o_compute;
  for (const Statement& st : nest.statements) {
    if (st.label == "C(O)") o_compute.push_back(&st);
  }
  ASSERT_EQ(o_compute.size(), 3u);
  EXPECT_DOUBLE_EQ(o_compute[1]->flops, 2.0 * 16 * 24);
  EXPECT_EQ(o_compute[1]->loops, (std::vector<int>{b, m, n}));
  EXPECT_DOUBLE_EQ(o_compute[2]->flops, 16 * 24);
  EXPECT_EQ(o_compute[2]->loops, (std::vector<int>{b, m}));
}

// The labels of the statements SkipCausalTiles scaled by the share (each
// other one kept its executions).
std::multiset<std::string> Scaled(const LoopNest& before, const LoopNest& after) {
  std::multiset<std::string> scaled;
  for (size_t i = 0; i < after.statements.size(); ++i) {
    const double ratio = after.statements[i].executions / before.statements[i].executions;
    if (ratio != 1) {
      EXPECT_DOUBLE_EQ(ratio, after.causal_share) << after.statements[i].label;
      scaled.insert(after.statements[i].label);
    }
  }
  return scaled;
}

// 40 rows in tiles of 16 (rows 0-15, 16-31, 32-39) against 56 keys. Tiled
// by 16 (4 tiles), with offset 0 the row tiles run 1, 2 and 3 key tiles (6
// of 12), with offset 20, 3, 4 and 4 (11 of 12). Untiled, they run 16, 32
// and 40 keys (88 of 3 x 56), with offset 20, 36, 52 and 56 (144).
TEST(SkipCausalTilesTest, StatementsOverTheAxisRunTheKeptKeysOnly) {
  auto causal = [](const std::string& condition) {
    std::string text = R"(
dim b=3 m=40 n=56 k=24 h=20
in Q[b,m,k] K[b,n,k] V[b,n,h]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.125
P[b,m,n] = softmax(CONDITION) S[b,m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)";
    text.replace(text.find("CONDITION"), 9, condition);
    auto chain = ir::ParseChainText(text);
    EXPECT_TRUE(chain.ok()) << chain.status();
    return *chain;
  };
  using Labels = std::multiset<std::string>;
  struct Case {
    const char* schedule;
    double share, offset_share;  // offset 0, offset 20
    Labels scaled;
  };
  for (const Case& c : {
           // Rows a block loop, keys streamed: the stream loop's statements (O rescaled
           // at every step; divided once after the loop, not scaled).
           Case{"b=1 m=16 / n=16 / -", 6.0 / 12, 11.0 / 12, {"L(K)", "C(S)", "C(P)", "L(V)", "C(O)", "C(O)"}},
           // Keys in own loops: S's and O's; the softmax over the row up to the bound.
           Case{"b=1 m=16 / - / S(n=16) O(n=16)", 6.0 / 12, 11.0 / 12, {"L(K)", "C(S)", "C(P)", "L(V)", "C(O)"}},
           // Keys untiled (CPU): every op over them ends at the row tile's last key.
           Case{"b=1 m=16 / - / -", 88.0 / 168, 144.0 / 168, {"L(K)", "C(S)", "C(P)", "L(V)", "C(O)"}},
           // Rows streamed (CPU), keys untiled: K and V packed once before the loop, whole.
           Case{"b=1 / m=16 / -", 88.0 / 168, 144.0 / 168, {"C(S)", "C(P)", "C(O)"}}}) {
    for (const auto& [condition, share] : {std::pair{"n <= m", c.share}, std::pair{"n <= m + 20", c.offset_share}}) {
      SCOPED_TRACE(absl::StrCat(condition, ", ", c.schedule));
      const ir::Chain chain = causal(condition);
      LoopNest nest = NestBefore(Phase::kSkipCausalTiles, chain, c.schedule);
      const LoopNest before = nest;
      phases::SkipCausalTiles(chain, Avx512(), nest);
      EXPECT_EQ(nest.causal_softmax, 1);
      EXPECT_DOUBLE_EQ(nest.causal_share, share);
      EXPECT_EQ(Scaled(before, nest), c.scaled);
      EXPECT_LT(nest.padded_flops, before.padded_flops);
    }
  }
  // Nothing to skip: the rows are in no block or stream loop; on a GPU,
  // the keys untiled or the rows streamed; an op needs the dropped entries
  // (P is an output, S is read beside the softmax) or reads a result
  // shifted along the keys. The softmax still drops them (emitted, masked).
  const ir::Chain chain = causal("n <= m");
  const hw::TargetDesc gpu = *hw::LookupDevice("h100");
  for (const auto& [schedule, target] : {std::pair{"b=1 / - / S(n=16) O(n=16)", Avx512()},
                                         std::pair{"b=1 m=16 / - / -", gpu}, std::pair{"b=1 / m=16 / -", gpu}}) {
    LoopNest nest = NestBefore(Phase::kSkipCausalTiles, chain, schedule, target);
    phases::SkipCausalTiles(chain, target, nest);
    EXPECT_EQ(nest.causal_softmax, -1) << schedule;
    EXPECT_EQ(nest.causal_share, 1);
  }
  std::string with_p = ir::ChainToText(chain);
  with_p.replace(with_p.find("out O"), 5, "out O P");
  std::string with_rowsum = ir::ChainToText(chain);
  with_rowsum.replace(with_rowsum.find("out O"), 5, "R[b,m] = sum(n) S[b,m,n]\nout O R");
  // A result read one key further on: a block's last key would read past its end.
  const std::string shifted = R"(
dim b=3 m=40 n=56 k=24 h=20 j=57
in Q[b,m,k] K[b,n,k] V[b,n,h] L[b,j,k]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k]
T[b,m,j] = sum(k) Q[b,m,k] * L[b,j,k]
P[b,m,n] = softmax(n <= m) S[b,m,n] + T[b,m,n+1]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)";
  for (const std::string& text : {with_p, with_rowsum, shifted}) {
    auto other = ir::ParseChainText(text);
    ASSERT_TRUE(other.ok()) << other.status() << text;
    LoopNest nest = NestBefore(Phase::kSkipCausalTiles, *other, "b=1 m=16 / - / S(n=16) O(n=16)");
    phases::SkipCausalTiles(*other, Avx512(), nest);
    EXPECT_EQ(nest.causal_softmax, -1) << text;
  }
  // A causal stream loop is not split.
  EXPECT_THAT(PhaseError(Phase::kSplitStreamLoop, chain, "b=1 m=16 / n=16x2 / -", gpu),
              HasSubstr("a causal softmax ends each row's work at the diagonal"));
}

TEST(SplitStreamLoopTest, PartsRunWhatIsOutsideAndAddThePartials) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  LoopNest nest = NestBefore(Phase::kSplitStreamLoop, *chain, "m=16 / n=16x2 / C(k=16)");
  const LoopNest before = nest;
  EXPECT_EQ(before.split, 1);
  ASSERT_TRUE(phases::SplitStreamLoop(*chain, Avx512(), nest).ok());
  EXPECT_EQ(nest.split, 2);
  EXPECT_EQ(nest.num_blocks, 2 * before.num_blocks);
  ASSERT_EQ(nest.statements.size(), before.statements.size() + 2);
  for (size_t i = 0; i < before.statements.size(); ++i) {
    const std::vector<int>& loops = before.statements[i].loops;
    const bool inside = std::find(loops.begin(), loops.end(), chain->FindDim("n")) != loops.end();
    EXPECT_DOUBLE_EQ(nest.statements[i].executions, before.statements[i].executions * (inside ? 1 : 2))
        << before.statements[i].label;
  }
  const Statement& partials = nest.statements[before.statements.size()];
  EXPECT_EQ(partials.label, "L(E partials)");
  EXPECT_TRUE(partials.partials);
  EXPECT_DOUBLE_EQ(partials.bytes, 64.0 * 32 * 4 * 2);
  EXPECT_TRUE(partials.loops.empty());
  const Statement& store = nest.statements.back();
  EXPECT_EQ(store.label, "S(E)");
  EXPECT_DOUBLE_EQ(store.bytes, 64.0 * 32 * 4);
  EXPECT_DOUBLE_EQ(store.executions, 1);

  // One part: nothing changes.
  LoopNest whole = NestBefore(Phase::kSplitStreamLoop, *chain, "m=16 / n=16 / C(k=16)");
  const size_t statements = whole.statements.size();
  ASSERT_TRUE(phases::SplitStreamLoop(*chain, Avx512(), whole).ok());
  EXPECT_EQ(whole.statements.size(), statements);
  EXPECT_EQ(whole.num_blocks, 4);

  EXPECT_EQ(PhaseError(Phase::kSplitStreamLoop, *chain, "m=16 / n=16x3 / -", *hw::LookupDevice("h100")),
            "schedule: the stream loop cannot be split: a part would have no steps");
}

TEST(CheckRegistersTest, OnlyWhenTheScheduleAsks) {
  const hw::TargetDesc gpu = *hw::LookupDevice("h200");
  auto attention = ir::ParseChainText(testing::kMaskedF16Attention);
  EXPECT_EQ(PhaseError(Phase::kCheckRegisters, *attention, "b=1 m=16 / n=16 / - / cuda registers", gpu), "");
  auto chain = ir::ParseChainText(testing::kConvChain);
  EXPECT_EQ(PhaseError(Phase::kCheckRegisters, *chain, "n=1 / p=3 / - / cuda registers", gpu),
            "schedule: intermediates cannot live in registers: every reduced dim must be on the intrinsic");
  EXPECT_EQ(PhaseError(Phase::kCheckRegisters, *chain, "n=1 / p=3 / -", gpu), "");
}

}  // namespace
}  // namespace fusor::space
