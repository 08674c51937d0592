// Emits fused kernels and baselines for real chains, compiles them with the
// system compiler and checks every output element against the float64
// reference: the codegen is only as good as what it computes.
#include "common/codegen/cpu/cpu_codegen.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "common/ir/parse.h"
#include "common/space/loop_nest.h"
#include "common/space/schedule.h"
#include "tests/test_chains.h"
#include "worker/cpu/compiler.h"
#include "worker/cpu/measure.h"
#include "worker/process.h"

namespace fusor::codegen {
namespace {

hw::TargetDesc TestTarget() {
  hw::TargetDesc t;
  t.compute_units = 2;
  t.vector_lanes_f32 = 8;
  t.isa_features = {"avx2", "fma"};
  return t;
}

// Compiles `kernel` and validates it on `chain`; returns the validation.
worker::Validation CompileAndValidate(const ir::Chain& chain, const KernelSource& kernel) {
  auto dir = worker::TempDir::Create("/tmp", "fusor-codegen-test-");
  EXPECT_TRUE(dir.ok());
  worker::CompileOutcome compiled = worker::CompileKernel(kernel, dir->path(), "c++", 120);
  EXPECT_TRUE(compiled.ok) << compiled.error << "\n" << kernel.source;
  if (!compiled.ok) return {};
  auto loaded = worker::LoadedKernel::Open(compiled.so_path, kernel.entry_point);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  auto v = worker::ValidateKernel(*loaded, chain, 7, 2);
  EXPECT_TRUE(v.ok()) << v.status();
  return *v;
}

void CheckFused(const std::string& text, const std::string& schedule_text, const hw::TargetDesc& target) {
  auto chain = ir::ParseChainText(text);
  ASSERT_TRUE(chain.ok()) << chain.status();
  auto schedule = space::ParseSchedule(schedule_text, *chain);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  auto nest = space::BuildLoopNest(*chain, *schedule, hw::SelectCpuMicroKernel(target));
  ASSERT_TRUE(nest.ok()) << nest.status();
  auto kernel = EmitCpuFusedKernel(*chain, *nest, schedule_text, "test");
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  worker::Validation v = CompileAndValidate(*chain, *kernel);
  EXPECT_TRUE(v.ok) << schedule_text << ": " << v.detail << "\n" << kernel->source;
}

const char kAttention[] = R"(
chain attn
dtype f32
dim b=3 m=40 n=56 k=24 h=20
in Q[b,m,k] K[b,n,k] V[b,n,h]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.125
P[b,m,n] = softmax(n) S[b,m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)";

TEST(CpuCodegenTest, AttentionUntiledInnerLoops) { CheckFused(kAttention, "block[b=1,m=16]", TestTarget()); }

TEST(CpuCodegenTest, AttentionEveryLoopTiledWithRemainders) {
  CheckFused(kAttention, "block[b=2,m=24] n=16 k=16 h=16", TestTarget());
}

TEST(CpuCodegenTest, AttentionWholeProblemInOneBlock) {
  CheckFused(kAttention, "block[b=3,m=40]", TestTarget());
}

TEST(CpuCodegenTest, AttentionAvx512AndScalarMicroKernels) {
  hw::TargetDesc wide = TestTarget();
  wide.isa_features = {"avx512f"};
  wide.vector_lanes_f32 = 16;
  CheckFused(kAttention, "block[b=1,m=8] n=32 k=16", wide);
  hw::TargetDesc narrow = TestTarget();
  narrow.isa_features = {};
  narrow.vector_lanes_f32 = 4;
  CheckFused(kAttention, "block[b=1,m=8] n=32 k=16", narrow);
}

TEST(CpuCodegenTest, MaskedF16AttentionWithBothOutputs) {
  CheckFused(std::string(testing::kMaskedF16Attention) + "out P\n",
             "block[b=1,m=16] n=16", TestTarget());
}

TEST(CpuCodegenTest, Bf16GemmChainWithEpilogues) {
  CheckFused(R"(
chain mlp
dtype bf16
dim m=37 c=48 f=80 o=24
in X[m,c] W1[c,f] B1[f] W2[f,o]
H[m,f] = sum(c) X[m,c] * W1[c,f]
G[m,f] = gelu(H[m,f] + B1[f])
Y[m,o] = sum(f) G[m,f] * W2[f,o]
out Y
)",
             "block[m=16] f=32 c=16", TestTarget());
}

TEST(CpuCodegenTest, TransposedOperandsAndThreeGemms) {
  CheckFused(R"(
chain three
dtype f32
dim m=50 k=20 n=36 h=28 g=12
in A[k,m] B[n,k] D[n,h] F[g,h]
C[m,n] = sum(k) A[k,m] * B[n,k]
E[m,h] = sum(n) C[m,n] * D[n,h]
G[m,g] = sum(h) E[m,h] * F[g,h]
out G E
)",
             "block[m=8] n=16 h=16", TestTarget());
}

TEST(CpuCodegenTest, ConvChainWithAffineIndices) {
  CheckFused(testing::kConvChain,
             "block[n=1,p=4,q=8] c=4", TestTarget());
}

TEST(CpuCodegenTest, NonProductBodyTakesTheGenericPath) {
  CheckFused(R"(
chain sqdist
dtype f32
dim m=19 n=21 k=13
in A[m,k] B[n,k]
D[m,n] = sum(k) (A[m,k] - B[n,k]) * (A[m,k] - B[n,k])
out D
)",
             "block[m=8,n=16] k=8", TestTarget());
}

void CheckBaseline(const std::string& text) {
  auto chain = ir::ParseChainText(text);
  ASSERT_TRUE(chain.ok()) << chain.status();
  auto kernel = EmitCpuUnfusedBaseline(*chain);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  worker::Validation v = CompileAndValidate(*chain, *kernel);
  EXPECT_TRUE(v.ok) << v.detail << "\n" << kernel->source;
}

TEST(CpuCodegenTest, BaselineAttentionUsesDirectSgemm) {
  auto chain = ir::ParseChainText(kAttention);
  ASSERT_TRUE(chain.ok());
  auto kernel = EmitCpuUnfusedBaseline(*chain);
  ASSERT_TRUE(kernel.ok());
  EXPECT_NE(kernel->source.find("CblasTrans"), std::string::npos);  // K read transposed in place
  CheckBaseline(kAttention);
}

TEST(CpuCodegenTest, BaselinesOfF16AndConvChains) {
  CheckBaseline(testing::kMaskedF16Attention);
  CheckBaseline(testing::kConvChain);
}

}  // namespace
}  // namespace fusor::codegen
