#include "common/space/loop_nest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/hw/devices.h"
#include "common/ir/parse.h"
#include "common/model/cost_model.h"
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

// Intermediates in registers: attention-shaped chains only, whole rows
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
              HasSubstr("exceeds 16 rows per warp"));
  EXPECT_THAT(std::string(nest(*attention, "b=1 m=16 / - / - / cuda registers").status().message()),
              HasSubstr("needs a stream loop"));
  auto gemm = ir::ParseChainText(testing::kGemmChain);
  EXPECT_THAT(std::string(nest(*gemm, "m=16 / n=16 / - / cuda registers").status().message()),
              HasSubstr("cannot live in registers"));

  auto variant = RegisterResidentVariant(*attention, *ParseSchedule("b=1 / n=16 / O(h=8)", *attention), gpu);
  ASSERT_TRUE(variant.has_value());
  EXPECT_EQ(ScheduleToText(*variant, *attention), "b=1 / n=16 / - / cuda registers");  // 33 rows: 4 warps
  EXPECT_FALSE(RegisterResidentVariant(*gemm, *ParseSchedule("m=16 / n=16 / -", *gemm), gpu).has_value());
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
  EXPECT_THAT(error(*chain, "m=16 / n=16x2 / -", *hw::LookupDevice("h100")), HasSubstr("only on a CPU"));
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

}  // namespace
}  // namespace fusor::space
