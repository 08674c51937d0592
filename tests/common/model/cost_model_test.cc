#include "common/model/cost_model.h"

#include <gtest/gtest.h>

#include "common/ir/parse.h"
#include "common/hw/devices.h"
#include "common/ir/regroup.h"
#include "common/space/schedule.h"
#include "tests/test_chains.h"
#include "tests/test_targets.h"

namespace fusor::model {
namespace {

// t_estm = (t_mem + t_comp) * alpha for m=16 / - / C(n=32) E(h=16 n=32) of a GEMM
// chain, with every statement's TS/Fp and trip counts worked out by hand
// (the statements themselves are checked in loop_nest_test.cc).
TEST(CostModelTest, FollowsTheFormulaTermByTerm) {
  auto chain = ir::ParseChainText(R"(
dim m=64 n=64 k=32 h=32
in A[m,k] B[k,n] D[n,h]
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
out E
)");
  auto schedule = space::ParseSchedule("m=16 / - / C(n=32) E(h=16 n=32)", *chain);
  hw::TargetDesc target;  // AVX-512: fma.avx512.8x32 tiles, at the full calibrated P
  target.isa_features = {"avx512f", "avx2", "fma"};
  target.vector_lanes_f32 = 16;
  target.bandwidth_bytes_per_s = 1e9;
  target.peak_flops = 1e9;
  target.compute_units = 4;
  auto nest = space::BuildLoopNest(*chain, *schedule, target);
  ASSERT_TRUE(nest.ok()) << nest.status();
  Prediction p = Predict(*nest, target, *chain);
  // L(A) 2 KiB x 4 blocks, L(B) 4 KiB x 8, L(D) 2 KiB x 16, S(E) 1 KiB x 8;
  // and on a CPU, at P / 2 bytes/s: E's accumulator (its own n loop makes
  // two partial sums, so its 64 x 32 floats are read and written once
  // more), and the packs the emitter makes, each read and written: B's
  // 32 x 32 floats per n tile (x 8), D's 32 x 32 (h padded) per h and n tile
  // (x 16). A and C are read in place, and C and E written in place.
  EXPECT_DOUBLE_EQ(p.t_mem_s, (2048.0 * 4 + 4096.0 * 8 + 2048.0 * 16 + 1024.0 * 8) / 1e9 +
                                  (2 * 4 * 64.0 * 32 + 8 * 1024.0 * 8 + 8 * 1024.0 * 16) / (0.5 * 1e9));
  // C(C): 2*16*32*32 FLOPs x 8; C(E): 16 x 32 (padded from 16) x 32 x 2 x 16.
  EXPECT_DOUBLE_EQ(p.t_comp_s, (32768.0 * 8 + 32768.0 * 16) / 1e9);
  // 4 blocks on 4 cores: one wave, nothing idles (a GPU's alpha would be 2).
  EXPECT_DOUBLE_EQ(p.alpha, 1);
  EXPECT_DOUBLE_EQ(p.t_estm_s, p.t_mem_s + p.t_comp_s);

  // The same nest on the AVX2 unit (6x16 tiles) runs at half the peak.
  auto avx2 = space::ParseSchedule(
      "m=16 / - / C(n=32) E(h=16 n=32) / C=fma.avx2.6x16[i=m j=n k=k] E=fma.avx2.6x16[i=m j=h k=n]", *chain);
  ASSERT_TRUE(avx2.ok()) << avx2.status();
  auto narrow = space::BuildLoopNest(*chain, *avx2, target);
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  // Tiles pad to 18 rows (16 -> 3 x 6) and 32 / 16 columns; FLOPs count at rate 1/2.
  EXPECT_DOUBLE_EQ(Predict(*narrow, target, *chain).t_comp_s,
                   (2.0 * 18 * 32 * 32 * 8 + 2.0 * 18 * 16 * 32 * 16) / (1e9 * 0.5));
}

// On a CPU the model sees what the emitter plans: a convolution's result
// written in place from its register tiles (and its ReLU applied there)
// against one gathered through the accumulator with strided stores, and a
// pointwise pass; the packs of a side read in place cost nothing, nor
// those of constant weights packed once.
TEST(CostModelTest, CpuChargesThePacksCopiesAndPassesTheEmitterPlans) {
  auto chain = ir::ParseChainText(R"(
dim n=1 c=64 k=128 j=64 p=28 q=28
in I[n,c,p,q] W1[k,c] W2[j,k]
T[n,k,p,q] = sum(c) I[n,c,p,q] * W1[k,c]
U[n,k,p,q] = relu(T[n,k,p,q])
O[n,j,p,q] = sum(k) U[n,k,p,q] * W2[j,k]
out O
)");
  ASSERT_TRUE(chain.ok()) << chain.status();
  hw::TargetDesc target;
  target.isa_features = {"avx512f", "avx2", "fma"};
  target.vector_lanes_f32 = 16;
  target.bandwidth_bytes_per_s = 1e10;
  target.peak_flops = 1e11;
  target.compute_units = 2;
  auto t_mem = [&](const ir::Chain& c, const std::string& text) {
    auto nest = space::BuildLoopNest(c, *space::ParseSchedule(text, c), target);
    EXPECT_TRUE(nest.ok()) << nest.status();
    return nest.ok() ? Predict(*nest, target, c).t_mem_s : 0.0;
  };
  const std::string o = " O=fma.avx512.8x32[i=j j=n.p.q k=k swap]";
  const double in_place = t_mem(*chain, "p=14 / - / - / T=fma.avx512.8x32[i=k j=n.p.q k=c swap]" + o);
  const double gathered = t_mem(*chain, "p=14 / - / - / T=fma.avx512.8x32[i=n.p.q j=k k=c]" + o);
  // T's two 128 x 392 tiles through the accumulator, stored 784 floats
  // apart (4x), and U's pass over them, read and written; and T's packs per
  // block: I as A (64 x 392 floats) and W1 as B (64 x 128), against I as B
  // (64 x 416, its columns padded to 32) while W1 is read in place.
  EXPECT_NEAR(gathered - in_place,
              (8.0 * 128 * 392 * 2 * 4 + 8.0 * 128 * 392 * 2 + 8.0 * (64 * 392 + 64 * 128 - 64 * 416) * 2) /
                  (0.5 * 1e11),
              1e-15);
  // Constant weights: W1's pack as T's B side is made once, by fusor_prepare.
  auto constant = ir::ParseChainText(ir::ChainToText(*chain) + "const W1 W2\n");
  ASSERT_TRUE(constant.ok()) << constant.status();
  EXPECT_NEAR(gathered - t_mem(*constant, "p=14 / - / - / T=fma.avx512.8x32[i=n.p.q j=k k=c]" + o),
              8.0 * 64 * 128 * 2 / (0.5 * 1e11), 1e-15);
}

// On a GPU, tiles of an input that other blocks already read come from
// the L2 at twice the memory's rate, when the inputs fit in half the L2;
// the first read of every element comes from memory.
TEST(CostModelTest, GpuReReadsOfSmallInputsComeFromTheL2) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  auto schedule = space::ParseSchedule("m=16 / n=32 / - / cuda warps=1", *chain);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  hw::TargetDesc gpu = *hw::LookupDevice("h100");
  gpu.bandwidth_bytes_per_s = 1e12;  // calibrated W and P
  gpu.peak_flops = 1e15;
  auto nest = space::BuildLoopNest(*chain, *schedule, gpu);
  ASSERT_TRUE(nest.ok()) << nest.status();
  // f32: A 8 KiB read once; B 8 KiB and D 8 KiB read by each of the 4 row
  // blocks (3 of the 4 reads from the L2); E 8 KiB stored.
  const double kib = 8192;
  EXPECT_DOUBLE_EQ(Predict(*nest, gpu, *chain).t_mem_s, (kib + 2 * (kib + 3 * kib / 2) + kib) / 1e12);
  gpu.l2_bytes = 16 * 1024;  // inputs no longer fit in half of it: every read from memory
  EXPECT_DOUBLE_EQ(Predict(*nest, gpu, *chain).t_mem_s, (kib + 2 * 4 * kib + kib) / 1e12);

  // A split loop's partial sums (E's 8 KiB, twice) are read back in the
  // launch that wrote them: from the L2, when they fit in half of it.
  gpu.l2_bytes = 50 << 20;
  auto split = space::BuildLoopNest(*chain, *space::ParseSchedule("m=16 / n=32x2 / - / cuda warps=1", *chain), gpu);
  ASSERT_TRUE(split.ok()) << split.status();
  space::LoopNest from_memory = *split;
  int partials = 0;
  for (space::Statement& s : from_memory.statements) {
    if (!s.partials) continue;
    ++partials;
    EXPECT_DOUBLE_EQ(s.bytes * s.executions, 2 * kib);
    s.partials = false;
  }
  ASSERT_EQ(partials, 1);
  EXPECT_DOUBLE_EQ(Predict(from_memory, gpu, *chain).t_mem_s - Predict(*split, gpu, *chain).t_mem_s,
                   2 * kib / 1e12 - 2 * kib / 2e12);
}

// alpha: on a CPU the exact waves of blocks over the cores; on a GPU
// MCFuser's (N_block + N_SM) / N_block.
TEST(CostModelTest, AlphaChargesTheLastWaveAndEstimatesApply) {
  auto chain = ir::ParseChainText("dim m=256 k=8\nin A[m,k]\nS[m] = sum(k) A[m,k] * A[m,k]\nout S");
  auto alpha = [&](int64_t tile, const hw::TargetDesc& target) {
    space::Schedule s = space::UntiledSchedule(*chain);
    s.block = {chain->FindDim("m")};
    s.tile[chain->FindDim("m")] = tile;
    auto nest = space::BuildLoopNest(*chain, s, target);
    Prediction p = Predict(*nest, target, *chain);
    EXPECT_GT(p.t_mem_s, 0);
    EXPECT_GT(p.t_comp_s, 0);
    return p.alpha;
  };
  hw::TargetDesc cpu;  // no W or P: estimated from the cores
  cpu.compute_units = 2;
  EXPECT_DOUBLE_EQ(alpha(1, cpu), 1);            // 256 blocks: 128 waves of 2
  EXPECT_DOUBLE_EQ(alpha(128, cpu), 1);          // 2 blocks, one wave
  EXPECT_DOUBLE_EQ(alpha(96, cpu), 4.0 / 3);     // 3 blocks: the second wave half idle
  const hw::TargetDesc gpu = *hw::LookupDevice("h100");
  EXPECT_DOUBLE_EQ(alpha(1, gpu), (256.0 + gpu.compute_units) / 256);
}

// The unfused chain: every op reads and writes its whole tensors once at W,
// its FLOPs at P.
TEST(CostModelTest, UnfusedChainMovesEveryTensorOncePerOp) {
  const ir::Chain chain = *ir::ParseChainText(testing::kGemmChain);  // m=64 n=64 k=32 h=32
  hw::TargetDesc t;
  t.compute_units = 2;
  t.bandwidth_bytes_per_s = 1e10;
  t.peak_flops = 1e11;
  const model::Prediction p = PredictUnfused(chain, t);
  // C: C + A + B = 4096 + 2048 + 2048 elements; E: E + C + D = 2048 + 4096 + 2048.
  EXPECT_DOUBLE_EQ(p.t_mem_s, 16384.0 * 4 / 1e10);
  EXPECT_DOUBLE_EQ(p.t_comp_s, (2.0 * 64 * 64 * 32 + 2.0 * 64 * 32 * 64) / 1e11);
  EXPECT_DOUBLE_EQ(p.t_estm_s, p.t_mem_s + p.t_comp_s);
  EXPECT_EQ(p.alpha, 1);
}

// A regrouped schedule (E = A*(B*D), the pair with the smaller result
// first) does a fraction of the chain's FLOPs as written: the floor must
// allow it (examples/gemm_chain's regrouped kernel was refused as
// implausibly fast).
TEST(PhysicalFloorTest, AllowsTheCheapestRegrouping) {
  auto chain = ir::ParseChainText(R"(
dim b=8 m=512 k=64 n=512 h=64
in A[b,m,k] B[b,k,n] D[b,n,h]
C[b,m,n] = sum(k) A[b,m,k] * B[b,k,n]
E[b,m,h] = sum(n) C[b,m,n] * D[b,n,h]
out E
)");
  ASSERT_TRUE(chain.ok()) << chain.status();
  const std::vector<ir::Regroup> regroups = ir::Regroupings(*chain);
  ASSERT_FALSE(regroups.empty());
  auto regrouped = ir::ApplyRegroup(*chain, regroups[0]);
  ASSERT_TRUE(regrouped.ok()) << regrouped.status();
  ASSERT_LT(ir::ChainFlops(*regrouped) * 4, ir::ChainFlops(*chain));
  const hw::TargetDesc target = testing::Avx512Target();
  const double floor = PhysicalFloorS(*chain, target);
  EXPECT_LE(floor, PhysicalFloorS(*regrouped, target));
  EXPECT_GT(floor, 0);
}

}  // namespace
}  // namespace fusor::model

namespace fusor::hw {
namespace {

TEST(RatesTest, CalibratedThenDeviceTableThenEstimate) {
  TargetDesc cpu;
  cpu.compute_units = 4;
  cpu.vector_lanes_f32 = 8;
  ModelRates est = RatesFor(cpu);
  EXPECT_EQ(est.source, RateSource::kEstimate);
  EXPECT_DOUBLE_EQ(est.peak_flops, 4 * 8 * 2 * 2 * 2.5e9);
  cpu.bandwidth_bytes_per_s = 12e9;
  cpu.peak_flops = 300e9;
  EXPECT_EQ(RatesFor(cpu).source, RateSource::kCalibrated);
  EXPECT_DOUBLE_EQ(RatesFor(cpu).bandwidth_bytes_per_s, 12e9);
  auto h200 = LookupDevice("H200");
  ASSERT_TRUE(h200.has_value());
  ModelRates table = RatesFor(*h200);
  EXPECT_EQ(table.source, RateSource::kDeviceTable);
  EXPECT_DOUBLE_EQ(table.bandwidth_bytes_per_s, 4.8e12);
  EXPECT_EQ(table.compute_units, 132);
  EXPECT_EQ(ScratchBudget(*h200), 227 << 10);
  EXPECT_FALSE(LookupDevice("tpu").has_value());
}

}  // namespace
}  // namespace fusor::hw
