// The emitted CUDA, run through the host emulation (fusor_device.h's
// emulation twin) and checked element by element against the float64
// reference: schedules drawn from the search space of each chain kind
// (GEMM chains, attention with and without a mask, epilogues, conv chains,
// extents no tile divides), in f32 (tf32 mma), f16 and bf16.
#include <random>

#include <gtest/gtest.h>

#include "common/codegen/cuda/cuda_codegen.h"
#include "common/hw/devices.h"
#include "common/ir/parse.h"
#include "common/space/loop_nest.h"
#include "common/space/space.h"
#include "tests/test_chains.h"
#include "worker/cpu/compiler.h"
#include "worker/cpu/measure.h"
#include "worker/process.h"

namespace fusor::codegen {
namespace {

hw::TargetDesc Gpu(const char* name = "a100") { return *hw::LookupDevice(name); }

// Emits, compiles for the emulation and validates; returns "" or what failed.
std::string RunEmulated(const ir::Chain& chain, const space::Schedule& schedule, const hw::TargetDesc& target,
                        int warps = 4) {
  const std::string text = space::ScheduleToText(schedule, chain);
  auto nest = space::BuildLoopNest(chain, schedule, target);
  if (!nest.ok()) return absl::StrCat(text, ": ", nest.status().ToString());
  auto kernel = EmitCudaFusedKernel(chain, *nest, text, space::DescribeMappings(chain, *nest), {warps});
  if (!kernel.ok()) return absl::StrCat(text, ": ", kernel.status().ToString());
  auto dir = worker::TempDir::Create("/tmp", "fusor-cuda-emu-test-");
  if (!dir.ok()) return dir.status().ToString();
  worker::CompileOutcome compiled = worker::CompileKernel(CudaEmulationHarness(chain, *kernel), dir->path(), "c++", 120);
  if (!compiled.ok) return absl::StrCat(text, ": compile failed: ", compiled.error, "\n", kernel->source);
  auto loaded = worker::LoadedKernel::Open(compiled.so_path, "fusor_run");
  if (!loaded.ok()) return loaded.status().ToString();
  auto v = worker::ValidateKernel(*loaded, chain, 11, 2, CudaTolerance(chain.dtype));
  if (!v.ok()) return absl::StrCat(text, ": ", v.status().ToString(), "\n", kernel->source);
  if (!v->ok) return absl::StrCat(text, ": ", v->detail, "\n", kernel->source);
  return "";
}

ir::Chain Parse(const std::string& text) {
  auto chain = ir::ParseChainText(text);
  EXPECT_TRUE(chain.ok()) << chain.status();
  return *chain;
}

void CheckSchedule(const std::string& chain_text, const std::string& schedule_text, int warps = 4) {
  ir::Chain chain = Parse(chain_text);
  auto schedule = space::ParseSchedule(schedule_text, chain);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_EQ(RunEmulated(chain, *schedule, Gpu(), warps), "");
}

// `count` schedules spread over the ranked space (the best, then evenly).
void CheckSpace(const std::string& chain_text, int count, const char* device = "a100") {
  ir::Chain chain = Parse(chain_text);
  auto space = space::BuildSpace(chain, Gpu(device));
  ASSERT_TRUE(space.ok()) << space.status();
  ASSERT_FALSE(space->ranked.empty());
  std::mt19937 rng(5);
  std::vector<size_t> picks = {0};
  std::uniform_int_distribution<size_t> pick(0, space->ranked.size() - 1);
  while (static_cast<int>(picks.size()) < std::min<int>(count, space->ranked.size())) picks.push_back(pick(rng));
  for (size_t i : picks) {
    SCOPED_TRACE(space::ScheduleToText(space->ranked[i].schedule, chain));
    EXPECT_EQ(RunEmulated(chain, space->ranked[i].schedule, Gpu(device)), "");
  }
}

// f32 attention (tf32 mma) whose extents no tile divides.
constexpr char kAttention[] = R"(
chain attn
dim b=2 m=40 n=72 k=24 h=40
in Q[b,m,k] K[b,n,k] V[b,n,h]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.2
P[b,m,n] = softmax(n) S[b,m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)";

// A batched bf16 GEMM chain, the intermediate an output as well.
constexpr char kBf16Chain[] = R"(
chain bf16_chain
dtype bf16
dim b=2 m=48 k=40 n=56 h=24
in A[b,m,k] B[b,k,n] D[b,n,h]
C[b,m,n] = sum(k) A[b,m,k] * B[b,k,n]
E[b,m,h] = sum(n) C[b,m,n] * D[b,n,h]
out C E
)";

// An FFN block with bias and GELU between the GEMMs (f16).
constexpr char kFfn[] = R"(
chain ffn
dtype f16
dim m=24 c=40 f=72 o=32
in X[m,c] W1[c,f] B1[f] W2[f,o]
H[m,f] = sum(c) X[m,c] * W1[c,f]
G[m,f] = gelu(H[m,f] + B1[f])
Y[m,o] = sum(f) G[m,f] * W2[f,o]
out Y
)";

TEST(CudaEmulationTest, GemmChainF32) {
  CheckSchedule(testing::kGemmChain, "m=32 / n=32 / C(k=16) E(h=16)");
  CheckSchedule(testing::kGemmChain, "m=64 h=32 / n=16 / -", 2);
  CheckSchedule(testing::kGemmChain, "m=16 / - / C(n=32 k=16) E(h=16 n=32)", 8);
}

TEST(CudaEmulationTest, AttentionOnlineAndPlainSoftmax) {
  CheckSchedule(kAttention, "b=1 m=16 / n=32 / -");   // online softmax along n
  CheckSchedule(kAttention, "b=1 m=32 / - / O(h=16)");  // plain softmax over the whole row
  CheckSchedule(testing::kMaskedF16Attention, "b=1 m=16 / n=16 / -");
  CheckSchedule(testing::kMaskedF16Attention, "b=1 / - / S(n=32) O(h=8)");
}

TEST(CudaEmulationTest, SpaceOfEachChainKind) {
  CheckSpace(testing::kGemmChain, 4);
  CheckSpace(kAttention, 4);
  CheckSpace(testing::kMaskedF16Attention, 4, "h100");
  CheckSpace(kBf16Chain, 4);
  CheckSpace(kFfn, 4);
  CheckSpace(testing::kConvChain, 3);
}

}  // namespace
}  // namespace fusor::codegen
