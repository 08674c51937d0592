// Emits fused kernels and baselines for real chains, compiles them with the
// system compiler and checks every output element against the float64
// reference: the codegen is only as good as what it computes.
#include "common/codegen/cpu/cpu_codegen.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

#include "common/ir/parse.h"
#include "common/space/loop_nest.h"
#include "common/space/schedule.h"
#include "common/space/space.h"
#include "common/space/split.h"
#include "tests/test_chains.h"
#include "worker/cpu/compiler.h"
#include "worker/cpu/measure.h"
#include "common/util/process.h"
#include "tests/test_targets.h"

namespace fusor::codegen {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

hw::TargetDesc TestTarget() { return testing::Avx2Target(); }

// Compiles `kernel` (for `march` instead of the build machine, when given)
// and validates it on `chain`; returns the validation.
worker::Validation CompileAndValidate(const ir::Chain& chain, const KernelSource& kernel,
                                      const std::string& march = "") {
  auto dir = TempDir::Create("/tmp", "fusor-codegen-test-");
  EXPECT_TRUE(dir.ok());
  KernelSource k = kernel;
  if (!march.empty()) std::replace(k.compile_flags.begin(), k.compile_flags.end(), std::string("-march=native"), march);
  worker::CompileOutcome compiled = worker::CompileKernel(k, dir->path(), "c++", 120);
  EXPECT_TRUE(compiled.ok) << compiled.error << "\n" << kernel.source;
  if (!compiled.ok) return {};
  auto loaded = worker::LoadedKernel::Open(compiled.so_path, kernel.entry_point);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  auto v = worker::ValidateKernel(*loaded, chain, 7, 2);
  EXPECT_TRUE(v.ok()) << v.status();
  return *v;
}

// The fused kernel of chain `text` under `schedule_text` on `target`;
// nullopt, with the failure recorded, when any step fails.
std::optional<KernelSource> EmitFused(const std::string& text, const std::string& schedule_text,
                                      const hw::TargetDesc& target) {
  auto chain = ir::ParseChainText(text);
  EXPECT_TRUE(chain.ok()) << chain.status();
  if (!chain.ok()) return std::nullopt;
  auto schedule = space::ParseSchedule(schedule_text, *chain);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  if (!schedule.ok()) return std::nullopt;
  auto nest = space::BuildLoopNest(*chain, *schedule, target);
  EXPECT_TRUE(nest.ok()) << nest.status();
  if (!nest.ok()) return std::nullopt;
  auto kernel = EmitCpuFusedKernel(*chain, *nest, schedule_text, "test");
  EXPECT_TRUE(kernel.ok()) << kernel.status();
  if (!kernel.ok()) return std::nullopt;
  return *std::move(kernel);
}

// Its source, or "" when it cannot be built.
std::string FusedSource(const std::string& text, const std::string& schedule_text, const hw::TargetDesc& target) {
  std::optional<KernelSource> kernel = EmitFused(text, schedule_text, target);
  return kernel ? kernel->source : std::string();
}

void CheckFused(const std::string& text, const std::string& schedule_text, const hw::TargetDesc& target,
                const std::string& march = "") {
  std::optional<KernelSource> kernel = EmitFused(text, schedule_text, target);
  if (!kernel) return;
  worker::Validation v = CompileAndValidate(*ir::ParseChainText(text), *kernel, march);
  EXPECT_TRUE(v.ok) << schedule_text << ": " << v.detail << "\n" << kernel->source;
}

bool CpuHas(const char* feature) {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str().find(feature) != std::string::npos;
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

TEST(CpuCodegenTest, AttentionUntiledInnerLoops) { CheckFused(kAttention, "b=1 m=16 / - / -", TestTarget()); }

TEST(CpuCodegenTest, AttentionEveryLoopTiledWithRemainders) {
  CheckFused(kAttention, "b=2 m=24 / - / S(n=16 k=16) O(h=16 n=16)", TestTarget());
}

TEST(CpuCodegenTest, AttentionWholeProblemInOneBlock) {
  CheckFused(kAttention, "- / - / -", TestTarget());
}

TEST(CpuCodegenTest, AttentionAvx512AndScalarMicroKernels) {
  const hw::TargetDesc wide = testing::Avx512Target();
  CheckFused(kAttention, "b=1 m=8 / - / S(n=32 k=16) O(n=32)", wide);
  hw::TargetDesc narrow = TestTarget();
  narrow.isa_features = {};
  narrow.vector_lanes_f32 = 4;
  CheckFused(kAttention, "b=1 m=8 / - / S(n=32 k=16) O(n=32)", narrow);
}

TEST(CpuCodegenTest, MaskedF16AttentionWithBothOutputs) {
  CheckFused(std::string(testing::kMaskedF16Attention) + "out P\n",
             "b=1 m=16 / - / S(n=16) O(n=16)", TestTarget());
}

// A bf16 MLP block with odd extents: padding, epilogues, conversions.
constexpr char kBf16Mlp[] = R"(
chain mlp
dtype bf16
dim m=37 c=48 f=80 o=24
in X[m,c] W1[c,f] B1[f] W2[f,o]
H[m,f] = sum(c) X[m,c] * W1[c,f]
G[m,f] = gelu(H[m,f] + B1[f])
Y[m,o] = sum(f) G[m,f] * W2[f,o]
out Y
)";

TEST(CpuCodegenTest, Bf16GemmChainWithEpilogues) {
  CheckFused(kBf16Mlp, "m=16 / - / H(f=32 c=16) Y(f=32)", TestTarget());
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
             "m=8 / - / C(n=16) E(h=16 n=16) G(h=16)", TestTarget());
}

TEST(CpuCodegenTest, ConvChainWithAffineIndices) {
  CheckFused(testing::kConvChain,
             "n=1 p=4 q=8 / - / T(c=4)", TestTarget());
}

// The stream loop: intermediates exist one tile at a time.
TEST(CpuCodegenTest, AttentionStreamedWithOnlineSoftmax) {
  CheckFused(kAttention, "b=1 m=16 / n=16 / S(k=16) O(h=16)", TestTarget());
  CheckFused(kAttention, "b=2 m=8 / n=32 / -", TestTarget());
  CheckFused(kAttention, "m=16 / n=24 / -", TestTarget());
}

// A causal softmax, with fewer rows than keys and an offset, under
// schedules that skip the keys past the diagonal (the rows a block loop:
// the keys' stream or own loops end at the row tile's last kept key, or
// untiled keys end at that key; the rows streamed: each step ends its ops'
// keys there, K and V packed once before the loop, whole) and schedules
// that only mask (the rows in no loop, P an output); f16 with a mask as
// well; for AVX-512 and haswell.
TEST(CpuCodegenTest, CausalAttentionSkipsTheKeysPastTheDiagonal) {
  auto causal = [](const std::string& chain, const std::string& condition) {
    std::string text = chain;
    text.replace(text.find("softmax(n)"), 10, "softmax(" + condition + ")");
    return text;
  };
  const hw::TargetDesc wide = testing::Avx512Target();
  for (const std::string& condition : {"n <= m", "n <= m + 13"}) {
    const std::string text = causal(kAttention, condition);
    for (const char* schedule : {"b=1 m=16 / n=16 / S(k=16) O(h=16)", "b=2 m=8 / n=24 / -",
                                 "b=1 m=16 / - / S(n=16 k=16) O(h=16 n=16)", "m=24 / - / S(n=16) O(n=16)",
                                 "b=1 m=16 / - / -", "b=1 / m=16 / -", "b=2 / m=8 / S(n=16) O(n=16)"}) {
      auto chain = ir::ParseChainText(text);
      auto nest = space::BuildLoopNest(*chain, *space::ParseSchedule(schedule, *chain), TestTarget());
      ASSERT_TRUE(nest.ok()) << nest.status();
      EXPECT_EQ(nest->causal_softmax, 1) << schedule;
      EXPECT_THAT(FusedSource(text, schedule, TestTarget()), HasSubstr("const long e_n = "));
      CheckFused(text, schedule, wide);
      if (condition == "n <= m") CheckFused(text, schedule, TestTarget(), "-march=haswell");
    }
    for (const char* schedule : {"b=1 / - / S(n=16) O(n=16)", "- / - / -"}) {
      EXPECT_THAT(FusedSource(text, schedule, TestTarget()), Not(HasSubstr("e_n")));
      CheckFused(text, schedule, TestTarget());
    }
    CheckFused(text + "out P\n", "b=1 m=16 / - / S(n=16) O(n=16)", TestTarget());
    const std::string f16 = causal(testing::kMaskedF16Attention, condition);
    CheckFused(f16, "b=1 m=16 / n=16 / O(h=16)", wide);
    CheckFused(f16, "b=1 / m=8 / -", TestTarget(), "-march=haswell");
  }
}

TEST(CpuCodegenTest, MaskedF16AttentionStreamed) {
  CheckFused(testing::kMaskedF16Attention, "b=1 m=16 / n=16 / O(h=16)", TestTarget());
}

TEST(CpuCodegenTest, GemmChainDeepAndFlatTilings) {
  // mhnk: C recomputed for every h block, E accumulated across n.
  CheckFused(testing::kGemmChain, "h=16 m=16 / n=16 / C(k=16)", TestTarget());
  // mn(k,h): C once per m block, E's h loop inside the n loop.
  CheckFused(testing::kGemmChain, "m=16 / n=16 / C(k=16) E(h=16)", TestTarget());
  // A GEMM with its own output loops in the other order.
  CheckFused(testing::kGemmChain, "- / - / C(n=16 m=32) E(m=32 n=16)", TestTarget());
}

// Regrouped chains run the other association order and are checked
// against the chain as written.
TEST(CpuCodegenTest, RegroupedGemmChains) {
  CheckFused(testing::kGemmChain, "{E=A*(B*D)} - / - / -", TestTarget());
  CheckFused(testing::kGemmChain, "{E=A*(B*D)} m=16 / k=16 / B_D(n=16)", TestTarget());
  CheckFused(testing::kGemmChain, "{E=A*(B*D)} m=16 / - / B_D(n=32) E(k=16)", TestTarget());
  CheckFused(R"(
dim b=2 m=37 k=20 n=45 h=12
in A[b,m,k] B[b,n,k] D[b,h,n]
C[b,m,n] = sum(k) A[b,m,k] * B[b,n,k] * 0.5
E[b,m,h] = sum(n) C[b,m,n] * D[b,h,n]
out E
)",
             "{E=A*(B*D)} b=1 / - / B_D(n=16)", TestTarget());
}

// The AVX2 target's kernels as an AVX2-only machine builds them
// (-march=haswell: 8-lane helpers, F16C conversions, the 6x16 micro-kernel).
TEST(CpuCodegenTest, Avx2BuildsOfEveryKind) {
  if (!CpuHas(" avx2") || !CpuHas(" f16c")) GTEST_SKIP() << "this CPU has no AVX2 and F16C";
  const std::string haswell = "-march=haswell";
  CheckFused(kAttention, "b=1 / m=16 / -", TestTarget(), haswell);
  CheckFused(kAttention, "b=1 m=16 / n=16 / S(k=16) O(h=16)", TestTarget(), haswell);
  CheckFused(testing::kMaskedF16Attention, "b=1 m=16 / n=16 / O(h=16)", TestTarget(), haswell);
  CheckFused(testing::kGemmChain, "{E=A*(B*D)} m=16 / - / B_D(n=32)", TestTarget(), haswell);
  CheckFused(testing::kConvChain, "n=1 p=4 q=8 / - / T(c=4)", TestTarget(), haswell);
  CheckFused(kBf16Mlp, "m=16 / f=32 / H(c=16)", TestTarget(), haswell);
}

// A stream loop split among blocks: partial sums per part, added up after
// every block; uneven parts, an empty part, f16 and bf16 outputs.
TEST(CpuCodegenTest, SplitStreamLoops) {
  const std::string mlp = R"(
dim m=37 c=48 f=80 o=24
in X[m,c] W1[c,f] B1[f] W2[f,o]
H[m,f] = sum(c) X[m,c] * W1[c,f]
G[m,f] = gelu(H[m,f] + B1[f])
Y[m,o] = sum(f) G[m,f] * W2[f,o]
out Y
)";
  CheckFused(mlp, "- / f=16x2 / -", TestTarget());
  CheckFused(mlp, "m=16 / f=16x4 / H(c=16)", TestTarget());  // 5 steps over 4 parts: one part empty
  CheckFused(mlp, "- / f=32x2 / -", TestTarget());  // 3 steps over 2 parts
  CheckFused("dtype f16\n" + mlp, "m=16 / f=16x2 / -", TestTarget());
  CheckFused("dtype bf16\n" + mlp, "- / f=16x2 / -", TestTarget());
  CheckFused(testing::kGemmChain, "m=16 / n=16x2 / C(k=16)", TestTarget());
}

// Constant inputs packed once by fusor_prepare, for every visit of every
// block: packs inside own loops, hoisted out of the stream loop, per point of
// a convolution's window, on the A side of a swapped mapping, shared by
// blocks along dims they do not read, in split stream loops, with the
// constant side converted from f16. ValidateKernel checks fusor_run and the
// prepared run both.
TEST(CpuCodegenTest, ConstantInputsPackedOnce) {
  const std::string mlp = testing::kConstFfn;
  for (const char* schedule : {"m=16 / f=16 / H(c=16) Y(o=8)", "- / f=16x2 / -", "m=16 / f=16x4 / H(c=16)",
                               "- / - / H(f=32 c=16) Y(f=32)", "m=8 / - / H(f=32 c=16) Y(o=16 f=32)"}) {
    CheckFused(mlp, schedule, TestTarget());
  }
  CheckFused("dtype f16\n" + mlp, "m=16 / f=16x2 / -", TestTarget());
  // The weights on the A side: Y[o, m] = W[o, c] X[c, m].
  CheckFused(R"(
dim m=40 c=24 o=36
in W[o,c] X[c,m]
const W
Y[o,m] = sum(c) W[o,c] * X[c,m]
out Y
)",
             "o=8 / - / Y(c=8)", TestTarget());
  std::string conv = testing::kConvChain;
  conv.insert(conv.find("\nT["), "\nconst W1 W2");
  CheckFused(conv, "n=1 p=4 q=8 / - / T(c=4)", TestTarget());
  CheckFused(conv, "- / - / -", TestTarget());
  // The source says what it packs.
  std::optional<KernelSource> kernel = EmitFused(mlp, "- / f=16 / -", TestTarget());
  ASSERT_TRUE(kernel);
  EXPECT_NE(kernel->source.find("extern \"C\" void* fusor_prepare("), std::string::npos);
  EXPECT_NE(kernel->metadata_json.find("W1 (B side of H)"), std::string::npos) << kernel->metadata_json;
  // A pack under a loop over a dim it does not read (the rows) would be kept once per trip: packed per
  // call instead. Here the stream loop over m encloses W1's and W2's packs.
  const std::string rows = "- / m=16 / H(f=16 c=16) Y(o=8 f=16)";
  const std::string source = FusedSource(mlp, rows, TestTarget());
  ASSERT_FALSE(source.empty());
  EXPECT_EQ(source.find("fusor_prepare"), std::string::npos);
  CheckFused(mlp, rows, TestTarget());
}

TEST(CpuCodegenTest, EpilogueAfterTheStreamLoop) {
  CheckFused(R"(
dim m=40 n=56 k=24 h=20
in A[m,k] B[k,n] D[n,h] Z[h]
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
G[m,h] = gelu(E[m,h] + Z[h])
out G E
)",
             "m=16 / n=16 / -", TestTarget());
}

// A GEMM's epilogue applied by its micro-kernels to each register tile as
// the tile's sum completes: whole in one call, or at the last of its k
// chunks (c = 40 in chunks of 16); rows past a whole micro-kernel; inside
// the stream loop and before it; vectors of the compiler's width (AVX-512)
// and lane by lane (an AVX2 kernel built for this machine). A bias, a
// scaled residual and a ReLU fold; a GELU keeps its pass over the block.
TEST(CpuCodegenTest, CheapEpiloguesOnRegisterTiles) {
  const std::string relu = R"(
chain linear_relu
dtype f32
dim m=37 c=40 f=64 o=48
in X[m,c] W[c,f] B[f] R[m,f] S[m] W2[f,o]
H[m,f] = sum(c) X[m,c] * W[c,f]
G[m,f] = relu(H[m,f] + B[f] - R[m,f] * S[m])
Y[m,o] = sum(f) G[m,f] * W2[f,o]
out Y
)";
  std::string gelu = relu;
  gelu.replace(gelu.find("relu("), 5, "gelu(");
  const hw::TargetDesc wide = testing::Avx512Target();
  auto folded = [](const std::string& text, const std::string& schedule, const hw::TargetDesc& target) {
    return FusedSource(text, schedule, target).find("applied by the micro-kernels") != std::string::npos;
  };
  for (const std::string schedule : {"m=16 / - / -", "m=16 / - / H(c=16)", "m=16 / f=32 / H(c=16)"}) {
    SCOPED_TRACE(schedule);
    for (const hw::TargetDesc& target : {wide, TestTarget()}) {
      EXPECT_TRUE(folded(relu, schedule, target));
      CheckFused(relu, schedule, target);
      EXPECT_FALSE(folded(gelu, schedule, target));
    }
  }
}

// Large scores and masked rows (every column masked in some rows, some
// columns in others): the online softmax and the plain one both match the
// float64 reference.
TEST(CpuCodegenTest, OnlineAndPlainSoftmaxOnLargeAndMaskedInputs) {
  auto chain = ir::ParseChainText(R"(
dim b=2 m=20 n=70 k=16 h=8
in Q[b,m,k] K[b,n,k] V[b,n,h] M[m,n]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k]
P[b,m,n] = softmax(n) S[b,m,n] + M[m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)");
  ASSERT_TRUE(chain.ok());
  std::vector<std::vector<double>> inputs(4);
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int i = 0; i < 3; ++i) {
    inputs[i].resize(chain->tensors[chain->inputs[i]].NumElements());
    for (double& x : inputs[i]) x = (i < 2 ? 30 : 1) * u(rng);  // scores up to ~14000
  }
  inputs[3].assign(20 * 70, 0.0);
  for (int m = 0; m < 20; ++m) {
    for (int n = 0; n < 70; ++n) {
      bool masked = m % 5 == 0 || (n * 7 + m) % 3 == 0;  // rows 0, 5, 10, 15 fully masked
      inputs[3][m * 70 + n] = masked ? -1e30 : 0.0;
    }
  }
  for (const char* schedule : {"b=1 m=8 / n=16 / -", "b=1 m=8 / n=32 / O(h=8)", "b=1 m=8 / - / S(n=16) O(n=16)"}) {
    auto s = space::ParseSchedule(schedule, *chain);
    auto nest = space::BuildLoopNest(*chain, *s, TestTarget());
    ASSERT_TRUE(nest.ok()) << nest.status();
    auto kernel = EmitCpuFusedKernel(*chain, *nest, schedule, "test");
    auto dir = TempDir::Create("/tmp", "fusor-softmax-");
    worker::CompileOutcome c = worker::CompileKernel(*kernel, dir->path(), "c++", 120);
    ASSERT_TRUE(c.ok) << c.error;
    auto loaded = worker::LoadedKernel::Open(c.so_path, kernel->entry_point);
    auto v = worker::ValidateKernelOn(*loaded, *chain, inputs, 2);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_TRUE(v->ok) << schedule << ": " << v->detail;
  }
}

// A model's FFN at batch 1: its rows are a0.a1 with a0 of extent 1, so the
// micro-kernels read X and the intermediate in place and write H and Y in
// place, with the ReLU (and bias) applied to H's register tiles.
TEST(CpuCodegenTest, RowsBehindABatchOfOneReadAndWrittenInPlace) {
  const std::string ffn = R"(
chain ffn_batch1
dtype f32
dim a0=1 a1=37 c=24 f=80 o=40
in X[a0,a1,c] W1[c,f] B1[f] W2[f,o]
const W1 B1 W2
H[a0,a1,f] = sum(c) X[a0,a1,c] * W1[c,f]
A[a0,a1,f] = relu(H[a0,a1,f] + B1[f])
Y[a0,a1,o] = sum(f) A[a0,a1,f] * W2[f,o]
out Y
)";
  const hw::TargetDesc wide = testing::Avx512Target();
  for (const std::string schedule : {"a1=16 / - / -", "- / - / H(f=32) Y(o=32 f=32)", "a1=8 / f=32 / -"}) {
    SCOPED_TRACE(schedule);
    const std::string source = FusedSource(ffn, schedule, wide);
    EXPECT_NE(source.find("// H: fma.avx512.8x32, A read in place"), std::string::npos) << source;
    EXPECT_NE(source.find("// Y: fma.avx512.8x32, A read in place"), std::string::npos);
    CheckFused(ffn, schedule, wide);
    CheckFused(ffn, schedule, wide, "-march=haswell");
    CheckFused(ffn, schedule, TestTarget());
  }
}

// A plain softmax whose one reader is the product P * V leaves its rows
// unnormalized, and the product's stores divide them by the row sums: C
// written in place along h (a pass over the tile), or along m under a
// swapped mapping (the sums loaded as vectors); through the accumulator into
// an f16 output; with remainder tiles and the product's reduction in
// chunks; with the softmax's axis not P's last (its rows stored from
// scratch, unnormalized). A softmax whose result is also an output divides
// its own rows, and of two softmaxes read by one product only one leaves
// its rows to it.
TEST(CpuCodegenTest, SoftmaxRowsDividedWhereTheirProductIsStored) {
  const hw::TargetDesc wide = testing::Avx512Target();
  const std::string f16 = testing::kMaskedF16Attention;
  const std::string axis_first = R"(
dim b=3 m=40 n=56 k=24 h=20
in Q[b,m,k] K[b,n,k] V[b,n,h]
S[b,n,m] = sum(k) Q[b,m,k] * K[b,n,k] * 0.125
P[b,n,m] = softmax(n) S[b,n,m]
O[b,m,h] = sum(n) P[b,n,m] * V[b,n,h]
out O
)";
  const std::string two = R"(
dim b=3 m=40 n=56 k=24 h=20
in Q[b,m,k] K[b,n,k] V[b,n,h]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.125
P[b,m,n] = softmax(n) S[b,m,n]
R[b,m,n] = softmax(n) S[b,m,n] * 0.5
O[b,m,h] = sum(n) P[b,m,n] * R[b,m,n] * V[b,n,h]
out O
)";
  struct Case {
    std::string chain, schedule;
    int divided;            // softmaxes whose rows the product divides
    std::string also;       // and a line that says how
  };
  for (const Case& c : {Case{kAttention, "b=1 m=16 / - / -", 1, "divided by the softmax's row sums"},
                        Case{kAttention, "b=2 m=24 / - / S(n=16 k=16) O(h=16 n=16)", 1, ""},
                        Case{kAttention, "b=1 m=16 / - / O(n=16) / O=fma.avx512.8x32[i=h j=m k=n swap]", 1,
                             "fusor_vload(&sinv"},
                        Case{f16, "b=1 m=16 / - / S(n=16) O(n=16)", 1, ""},
                        Case{f16 + "out P\n", "b=1 m=16 / - / S(n=16) O(n=16)", 0, ""},
                        Case{axis_first, "b=1 m=16 / - / -", 1, ""},
                        Case{two, "b=1 m=16 / - / -", 1, ""}}) {
    SCOPED_TRACE(c.schedule);
    const std::string source = FusedSource(c.chain, c.schedule, wide);
    size_t divided = 0;
    for (size_t at = source.find("the consumer divides"); at != std::string::npos;
         at = source.find("the consumer divides", at + 1)) {
      ++divided;
    }
    EXPECT_EQ(divided, static_cast<size_t>(c.divided)) << source;
    if (!c.also.empty()) EXPECT_NE(source.find(c.also), std::string::npos) << source;
    CheckFused(c.chain, c.schedule, wide);
    CheckFused(c.chain, c.schedule, wide, "-march=haswell");
  }
}

// A stride-1 convolution (odd sizes, remainder tiles, a bias and ReLU):
// one window of B packed per point of s for every r, the sum over r and s
// in the micro-kernel's registers, C written in place along whole rows of
// q with a last panel of fewer columns, and the 1x1 convolution reading the
// ReLU's block-local result in place. Each schedule is checked against the
// float64 reference, built for AVX-512 and AVX2 micro-kernels, and for a
// CPU without AVX-512 (8-lane vectors under the 16-lane kernel).
TEST(CpuCodegenTest, ConvolutionWindowsInRegisters) {
  const std::string conv = R"(
chain conv_s1
dtype f32
dim n=2 c=8 k=20 p=9 q=11 r=3 s=3 j=12 y=11 x=13
in I[n,c,y,x] W1[k,c,r,s] B[k] W2[j,k]
T[n,k,p,q] = sum(c,r,s) I[n,c,p+r,q+s] * W1[k,c,r,s]
U[n,k,p,q] = relu(T[n,k,p,q] + B[k])
O[n,j,p,q] = sum(k) U[n,k,p,q] * W2[j,k]
out O
)";
  const hw::TargetDesc wide = testing::Avx512Target();
  const std::string rows = FusedSource(conv, "n=1 p=4 / - / -", wide);
  EXPECT_NE(rows.find("// T: fma.avx512.8x32, A read in place, B a window"), std::string::npos) << rows;
  EXPECT_NE(rows.find("// O: fma.avx512.8x32, A read in place, B read in place"), std::string::npos) << rows;
  EXPECT_NE(rows.find("aoff[pt]"), std::string::npos);
  EXPECT_NE(rows.find("long nc, const long* __restrict aoff"), std::string::npos);
  EXPECT_NE(rows.find("applied by the micro-kernels"), std::string::npos);
  for (const std::string schedule : {"n=1 p=4 / - / -", "n=1 q=4 / - / -", "- / - / -", "n=1 p=4 / k=8 / -",
                                     "n=1 p=2 / - / T(c=4)"}) {
    SCOPED_TRACE(schedule);
    for (const hw::TargetDesc& target : {wide, TestTarget()}) CheckFused(conv, schedule, target);
    CheckFused(conv, schedule, wide, "-march=haswell");
  }
  // A one-lane micro-kernel writes whole panels only: no tail, no epilogue.
  CheckFused(conv, "n=1 p=4 / - / - / T=scalar.4x4[i=k j=n.p.q k=c swap]", wide);
  std::string constant = conv;
  constant.insert(constant.find("\nT["), "\nconst W1 B W2");
  CheckFused(constant, "n=1 p=4 / - / -", wide);
}

// Mappings other than the default: batch dims and unmapped reduced dims
// outside the intrinsic (packed per point), narrower units, and mixed
// intrinsics in one kernel.
TEST(CpuCodegenTest, ConvChainUnderExplicitMappings) {
  CheckFused(testing::kConvChain,
             "n=1 p=4 / - / T(c=4) / T=fma.avx2.6x16[i=p j=k k=c.s] O=simd4.4x8[i=q j=j k=k]", TestTarget());
  CheckFused(testing::kConvChain, "- / k=8 / - / T=scalar.4x4[i=n.p.q j=k k=c] O=fma.avx2.6x16[i=p.q j=j k=k]",
             TestTarget());
}

TEST(CpuCodegenTest, GemvUsesADegenerateSwappedMapping) {
  const char* gemv = R"(
dim m=100 k=70
in A[m,k] x[k]
y[m] = sum(k) A[m,k] * x[k]
z[m] = relu(y[m])
out z
)";
  auto chain = ir::ParseChainText(gemv);
  auto nest = space::BuildLoopNest(*chain, space::UntiledSchedule(*chain), TestTarget());
  ASSERT_TRUE(nest.ok());
  EXPECT_EQ(space::DescribeMappings(*chain, *nest), "y=fma.avx2.6x16[i=- j=m k=k swap]");
  CheckFused(gemv, "m=32 / - / y(k=32)", TestTarget());
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
             "m=8 n=16 / - / D(k=8)", TestTarget());
}

// Through OpenBLAS and through oneDNN.
void CheckBaseline(const std::string& text) {
  auto chain = ir::ParseChainText(text);
  ASSERT_TRUE(chain.ok()) << chain.status();
  for (CpuBlas blas : {CpuBlas::kOpenBlas, CpuBlas::kOneDnn}) {
    auto kernel = EmitCpuUnfusedBaseline(*chain, blas);
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    worker::Validation v = CompileAndValidate(*chain, *kernel);
    EXPECT_TRUE(v.ok) << CpuBlasName(blas) << ": " << v.detail << "\n" << kernel->source;
  }
}

TEST(CpuCodegenTest, BaselineAttentionUsesDirectSgemm) {
  auto chain = ir::ParseChainText(kAttention);
  ASSERT_TRUE(chain.ok());
  auto kernel = EmitCpuUnfusedBaseline(*chain);
  ASSERT_TRUE(kernel.ok());
  EXPECT_NE(kernel->source.find("CblasTrans"), std::string::npos);  // K read transposed in place
  auto onednn = EmitCpuUnfusedBaseline(*chain, CpuBlas::kOneDnn);
  ASSERT_TRUE(onednn.ok());
  EXPECT_NE(onednn->source.find("dnnl_sgemm('N', 'T'"), std::string::npos);
  CheckBaseline(kAttention);
}

TEST(CpuCodegenTest, BaselinesOfF16AndConvChains) {
  CheckBaseline(testing::kMaskedF16Attention);
  CheckBaseline(testing::kConvChain);
}

TEST(CpuCodegenTest, BaselinesOfGemmChainsWithEpilogues) {
  CheckBaseline(testing::kGemmChain);
  CheckBaseline(kBf16Mlp);
}

// A split kernel of `text` after `boundary`, each part fused (under its
// space's best-ranked schedule) or unfused as `fused` says, validated
// against the whole chain's reference (fusor_run and, with constants, the
// prepared run).
void CheckSplit(const std::string& text, const std::string& boundary, std::array<bool, 2> fused) {
  SCOPED_TRACE(absl::StrCat("split after ", boundary, ": head ", fused[0] ? "fused" : "unfused", ", tail ",
                            fused[1] ? "fused" : "unfused"));
  auto chain = ir::ParseChainText(text);
  ASSERT_TRUE(chain.ok()) << chain.status();
  auto parts = space::SplitChain(*chain, chain->FindTensor(boundary));
  ASSERT_TRUE(parts.ok()) << parts.status();
  std::array<std::string, 2> texts;
  for (int p = 0; p < 2; ++p) {
    texts[p] = "unfused onednn";
    if (!fused[p]) continue;
    auto space = space::BuildSpace(parts->parts[p], TestTarget());
    ASSERT_TRUE(space.ok() && !space->ranked.empty()) << space.status();
    texts[p] = space::ScheduleToText(space->ranked[0].schedule, parts->parts[p]);
  }
  const std::string schedule = space::SplitToText(*chain, chain->FindTensor(boundary), texts);
  auto kernel = EmitCpuSplitKernel(*chain, schedule, TestTarget());
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_NE(kernel->source.find("namespace fusor_head {"), std::string::npos);
  EXPECT_NE(kernel->source.find("namespace fusor_tail {"), std::string::npos);
  const nlohmann::json meta = nlohmann::json::parse(kernel->metadata_json);
  EXPECT_EQ(meta["schedule"], schedule);
  EXPECT_EQ(meta["parts"].size(), 2u);
  EXPECT_EQ(meta.contains("link_libs"), !fused[0] || !fused[1]);
  bool constants = false;
  for (int p = 0; p < 2; ++p) {
    for (int t : parts->parts[p].inputs) constants = constants || (fused[p] && parts->parts[p].tensors[t].constant);
  }
  EXPECT_EQ(meta.contains("prepare"), constants) << meta.dump();
  worker::Validation v = CompileAndValidate(*chain, *kernel);
  EXPECT_TRUE(v.ok) << schedule << ": " << v.detail << "\n" << kernel->source;
}

TEST(CpuCodegenTest, SplitKernelsOfEveryKind) {
  // The FFN with constant weights: a fused part packs them once.
  CheckSplit(testing::kConstFfn, "G", {true, false});
  CheckSplit(testing::kConstFfn, "G", {false, true});
  CheckSplit(testing::kConstFfn, "H", {true, true});  // the bias and GELU fused into the second GEMM's prologue
  CheckSplit(kAttention, "S", {false, true});          // the scores handed on, the softmax with the second GEMM
  CheckSplit(testing::kConvChain, "U", {true, false});
}

}  // namespace
}  // namespace fusor::codegen
