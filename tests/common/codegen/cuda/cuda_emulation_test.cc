// The emitted CUDA, run through the host emulation (fusor_device.h's
// emulation twin) and checked element by element against the float64
// reference: schedules drawn from the search space of each chain kind
// (GEMM chains, attention with and without a mask, epilogues, conv chains,
// extents no tile divides), in f32 (tf32 mma), f16 and bf16.
#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include <gtest/gtest.h>

#include "common/codegen/cuda/cuda_codegen.h"
#include "common/codegen/cpu/prelude.h"
#include "common/codegen/cuda/nvrtc.h"
#include "common/hw/devices.h"
#include "common/ir/parse.h"
#include "common/ir/reference.h"
#include "common/space/loop_nest.h"
#include "common/space/space.h"
#include "tests/test_chains.h"
#include "worker/cpu/compiler.h"
#include "worker/cpu/measure.h"
#include "common/util/process.h"

namespace fusor::codegen {
namespace {

hw::TargetDesc Gpu(const char* name = "a100") { return *hw::LookupDevice(name); }

// Compiles the kernel with NVRTC for sm_80 and sm_90 and checks its
// resource report; "" or what failed. Without NVRTC (no CUDA toolkit on
// this machine) only the emulation runs, and the test says so once.
std::string CompileWithNvrtc(const KernelStep& kernel) {
  std::string why;
  const Nvrtc* nvrtc = Nvrtc::Get(&why);
  if (nvrtc == nullptr) {
    static bool said = false;
    if (!said) std::fprintf(stderr, "NOTE: %s; NVRTC checks skipped\n", why.c_str());
    said = true;
    return "";
  }
  for (const char* arch : {"sm_80", "sm_90"}) {
    NvrtcOutput out = nvrtc->Compile(kernel.source, arch, {{"fusor_device.h", std::string(CudaDeviceHeader())}});
    if (!out.ok) return absl::StrCat(arch, ": NVRTC failed: ", out.log);
    std::string fits = CheckResources(out.usage, kernel.threads, kernel.shared_bytes, LimitsForArch(arch));
    if (!fits.empty()) return absl::StrCat(arch, ": ", fits, "\n", out.log, "\n", kernel.source);
  }
  return "";
}

// Compiles `kernel` for the emulation and validates it; "" or what failed.
// A kernel with a workspace runs on a second input set too, with the
// workspace the first run left.
std::string RunKernelEmulated(const ir::Chain& chain, const CudaKernel& kernel) {
  auto dir = TempDir::Create("/tmp", "fusor-cuda-emu-test-");
  if (!dir.ok()) return dir.status().ToString();
  worker::CompileOutcome compiled = worker::CompileKernel(ProgramEmulationHarness(FusedProgram(chain, kernel)), dir->path(), "c++", 120);
  if (!compiled.ok) return absl::StrCat("compile failed: ", compiled.error, "\n", kernel.source);
  auto loaded = worker::LoadedKernel::Open(compiled.so_path, "fusor_run");
  if (!loaded.ok()) return loaded.status().ToString();
  for (uint64_t seed : {11, 12}) {
    if (seed == 12 && kernel.workspace_bytes == 0) break;
    auto v = worker::ValidateKernel(*loaded, chain, seed, 2, CudaTolerance(chain.dtype));
    if (!v.ok()) return absl::StrCat(v.status().ToString(), "\n", kernel.source);
    if (!v->ok) return absl::StrCat("input set ", seed, ": ", v->detail, "\n", kernel.source);
  }
  return "";
}

absl::StatusOr<CudaKernel> Emit(const ir::Chain& chain, const space::Schedule& schedule,
                                const hw::TargetDesc& target) {
  const std::string text = space::ScheduleToText(schedule, chain);
  auto nest = space::BuildLoopNest(chain, schedule, target);
  if (!nest.ok()) return nest.status();
  return EmitCudaFusedKernel(chain, *nest, text, space::DescribeMappings(chain, *nest));
}

// Emits, compiles with NVRTC and for the emulation, validates; "" or what failed.
std::string RunEmulated(const ir::Chain& chain, const space::Schedule& schedule, const hw::TargetDesc& target) {
  const std::string text = space::ScheduleToText(schedule, chain);
  auto kernel = Emit(chain, schedule, target);
  if (!kernel.ok()) return absl::StrCat(text, ": ", kernel.status().ToString());
  if (std::string nvrtc = CompileWithNvrtc(FusedProgram(chain, *kernel).steps[0].kernel); !nvrtc.empty()) {
    return absl::StrCat(text, ": ", nvrtc);
  }
  std::string run = RunKernelEmulated(chain, *kernel);
  return run.empty() ? "" : absl::StrCat(text, ": ", run);
}

// Compiles a hand-written kernel source (with its fusor_run entry) against
// the emulation header.
absl::StatusOr<std::unique_ptr<worker::LoadedKernel>> BuildEmulated(const std::string& source, TempDir& dir) {
  KernelSource k;
  k.source = source;
  k.extra_files = {{"fusor_device.h", std::string(CudaEmulationHeader())},
                   {"fusor_prelude.inc", std::string(CpuPreludeSource())}};
  k.compile_flags = {"-O1", "-std=gnu++17", "-fopenmp", "-w"};
  worker::CompileOutcome compiled = worker::CompileKernel(k, dir.path(), "c++", 120);
  if (!compiled.ok) return absl::InternalError(compiled.error);
  auto loaded = worker::LoadedKernel::Open(compiled.so_path, "fusor_run");
  if (!loaded.ok()) return loaded.status();
  return std::make_unique<worker::LoadedKernel>(std::move(*loaded));
}

// The unfused baseline program through the emulation (GEMM steps as host
// loops), validated like a fused kernel; "" or what failed.
std::string RunBaselineEmulated(const ir::Chain& chain, const Program& program) {
  for (const ProgramStep& step : program.steps) {
    if (step.is_gemm) continue;
    if (std::string nvrtc = CompileWithNvrtc(step.kernel); !nvrtc.empty()) return step.what + ": " + nvrtc;
  }
  auto dir = TempDir::Create("/tmp", "fusor-cuda-emu-test-");
  if (!dir.ok()) return dir.status().ToString();
  worker::CompileOutcome compiled = worker::CompileKernel(ProgramEmulationHarness(program), dir->path(), "c++", 120);
  if (!compiled.ok) return "compile failed: " + compiled.error;
  auto loaded = worker::LoadedKernel::Open(compiled.so_path, "fusor_run");
  if (!loaded.ok()) return loaded.status().ToString();
  auto v = worker::ValidateKernel(*loaded, chain, 13, 2, CudaTolerance(chain.dtype));
  if (!v.ok()) return v.status().ToString();
  return v->ok ? "" : v->detail;
}

ir::Chain Parse(const std::string& text) {
  auto chain = ir::ParseChainText(text);
  EXPECT_TRUE(chain.ok()) << chain.status();
  return *chain;
}

void CheckSchedule(const std::string& chain_text, const std::string& schedule_text) {
  ir::Chain chain = Parse(chain_text);
  auto schedule = space::ParseSchedule(schedule_text, chain);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_EQ(RunEmulated(chain, *schedule, Gpu()), "");
}

// `count` schedules spread over the ranked space (the best, then evenly),
// the others with launches the search would try (warps, stages, every
// other one with intermediates in registers where that applies).
void CheckSpace(const std::string& chain_text, int count, const char* device = "a100") {
  ir::Chain chain = Parse(chain_text);
  auto space = space::BuildSpace(chain, Gpu(device));
  ASSERT_TRUE(space.ok()) << space.status();
  ASSERT_FALSE(space->ranked.empty());
  std::mt19937 rng(5);
  std::vector<size_t> picks = {0};
  std::uniform_int_distribution<size_t> pick(0, space->ranked.size() - 1);
  while (static_cast<int>(picks.size()) < std::min<int>(count, space->ranked.size())) picks.push_back(pick(rng));
  for (size_t p = 0; p < picks.size(); ++p) {
    space::Schedule schedule = space->ranked[picks[p]].schedule;
    if (p > 0) {
      schedule.warps = 1 << (rng() % 4);
      schedule.stages = 1 + static_cast<int>(rng() % 2);
      // Every other one with its intermediates in registers where it can.
      if (p % 2 == 0) schedule = space::RegisterResidentVariant(chain, schedule, Gpu(device)).value_or(schedule);
    }
    SCOPED_TRACE(space::ScheduleToText(schedule, chain));
    EXPECT_EQ(RunEmulated(chain, schedule, Gpu(device)), "");
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

// ldmatrix (plain and .trans) and mma.sync in each dtype against a direct
// product: A (16 x 16, or 16 x 8 for tf32) staged row-major and
// transposed, B (16 x 8) staged [n][k] and [k][n]; every variant must give
// the same C = A B.
TEST(CudaEmulationTest, FragmentLayoutsFollowThePtxIsa) {
  const char* source = R"(
#include "fusor_device.h"
struct Args { const float* a; const float* b; float* c; int kind; };
__global__ void probe(Args args) {
  FUSOR_DYNAMIC_SMEM(smem);
  fusor_u16* a_rm = (fusor_u16*)smem;   // [16][16] row-major: A[m][k]
  fusor_u16* a_km = a_rm + 256;         // [16][16]: A[m][k] at [k][m]
  fusor_u16* b_nk = a_km + 256;         // [8][16]: B[k][n] at [n][k]
  fusor_u16* b_kn = b_nk + 128;         // [16][8]: B[k][n] at [k][n]
  float* a32 = (float*)(b_kn + 128);    // [16][8] A for tf32
  float* b32 = a32 + 128;               // [8][8]: B[k][n] at [n][k]
  const int lane = fusor_lane(), g = lane / 4, t = lane % 4;
  for (int i = lane; i < 256; i += 32) {
    const int m = i / 16, k = i % 16;
    const float v = args.a[i];
    const fusor_u16 h = args.kind == 0 ? fusor_f32_to_f16(v) : fusor_f32_to_bf16(v);
    a_rm[m * 16 + k] = h;
    a_km[k * 16 + m] = h;
  }
  for (int i = lane; i < 128; i += 32) {
    const int k = i / 8, n = i % 8;
    const float v = args.b[i];
    const fusor_u16 h = args.kind == 0 ? fusor_f32_to_f16(v) : fusor_f32_to_bf16(v);
    b_nk[n * 16 + k] = h;
    b_kn[k * 8 + n] = h;
    a32[i] = fusor_round_tf32(args.a[(i / 8) * 16 + i % 8]);
    if (k < 8) b32[n * 8 + k] = fusor_round_tf32(v);
  }
  __syncthreads();
  float c[3][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}};
  fusor_u32 a[4], at[4], b[2], bt[2];
  fusor_ldmatrix_x4(a, a_rm + (lane % 16) * 16 + lane / 16 * 8);
  fusor_ldmatrix_x4_trans(at, a_km + (lane / 16 * 8 + lane % 8) * 16 + (lane / 8) % 2 * 8);
  fusor_ldmatrix_x2(b, b_nk + (lane % 8) * 16 + (lane / 8) % 2 * 8);
  fusor_ldmatrix_x2_trans(bt, b_kn + ((lane / 8) % 2 * 8 + lane % 8) * 8);
  if (args.kind == 0) {
    fusor_mma_m16n8k16_f16(c[0], a, b);
    fusor_mma_m16n8k16_f16(c[1], at, bt);
  } else {
    fusor_mma_m16n8k16_bf16(c[0], a, b);
    fusor_mma_m16n8k16_bf16(c[1], at, bt);
  }
  fusor_u32 a2[4], b2[2];
  for (int i = 0; i < 4; ++i) a2[i] = fusor_bits(a32[(g + 8 * (i % 2)) * 8 + t + 4 * (i / 2)]);
  for (int i = 0; i < 2; ++i) b2[i] = fusor_bits(b32[g * 8 + t + 4 * i]);
  fusor_mma_m16n8k8_tf32(c[2], a2, b2);
  for (int v = 0; v < 3; ++v) {
    for (int i = 0; i < 4; ++i) args.c[v * 128 + (g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = c[v][i];
  }
}
extern "C" int fusor_run(const void* const* in, void* const* out, int kind) {
  Args args{(const float*)in[0], (const float*)in[1], (float*)out[0], kind};
  return fusor_emu::Launch(probe, dim3{1, 1, 1}, dim3{32, 1, 1}, 4096, args, 1);
}
)";
  auto dir = TempDir::Create("/tmp", "fusor-cuda-emu-test-");
  ASSERT_TRUE(dir.ok());
  auto kernel = BuildEmulated(source, *dir);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> small(-8, 8);  // exact in every dtype
  std::vector<float> a(256), b(128), c(384);
  for (float& x : a) x = small(rng) / 4.0f;
  for (float& x : b) x = small(rng) / 4.0f;
  for (int kind : {0, 1}) {
    const void* in[] = {a.data(), b.data()};
    void* out[] = {c.data()};
    ASSERT_EQ((*kernel)->entry()(in, out, kind), 0);
    for (int m = 0; m < 16; ++m) {
      for (int n = 0; n < 8; ++n) {
        float full = 0, half = 0;
        for (int k = 0; k < 16; ++k) full += a[m * 16 + k] * b[k * 8 + n];
        for (int k = 0; k < 8; ++k) half += a[m * 16 + k] * b[k * 8 + n];
        EXPECT_EQ(c[m * 8 + n], full) << "kind " << kind << " m " << m << " n " << n;
        EXPECT_EQ(c[128 + m * 8 + n], full) << "trans, kind " << kind << " m " << m << " n " << n;
        EXPECT_EQ(c[256 + m * 8 + n], half) << "tf32 m " << m << " n " << n;
      }
    }
  }
}

// A thread that skips __syncthreads is a deadlock and a misaligned
// cp.async a fault, both reported as errors; shared memory written by
// cp.async is stale until the group is waited on.
TEST(CudaEmulationTest, ReportsDeadlocksAndUnwaitedCopies) {
  const char* source = R"(
#include "fusor_device.h"
struct Args { const float* in; float* out; int mode; };
__global__ void probe(Args args) {
  FUSOR_DYNAMIC_SMEM(smem);
  float* tile = (float*)smem;
  if (args.mode == 0) {
    if (threadIdx.x >= 16) __syncthreads();
    return;
  }
  if (args.mode == 3) {  // 4-byte aligned only: a fault on a GPU
    fusor_cp_async16(tile + 1, args.in, 16);
    return;
  }
  fusor_cp_async16(tile + 4 * threadIdx.x, args.in + 4 * threadIdx.x, 8);  // 2 floats, 2 zero-filled
  fusor_cp_async_commit();
  if (args.mode == 2) fusor_cp_async_wait<0>();
  __syncthreads();
  for (int i = 0; i < 4; ++i) args.out[4 * threadIdx.x + i] = tile[4 * threadIdx.x + i];
}
extern "C" int fusor_run(const void* const* in, void* const* out, int mode) {
  Args args{(const float*)in[0], (float*)out[0], mode};
  return fusor_emu::Launch(probe, dim3{2, 1, 1}, dim3{64, 1, 1}, 1024, args, 1);
}
)";
  auto dir = TempDir::Create("/tmp", "fusor-cuda-emu-test-");
  ASSERT_TRUE(dir.ok());
  auto kernel = BuildEmulated(source, *dir);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  std::vector<float> in(256), out(256);
  for (int i = 0; i < 256; ++i) in[i] = static_cast<float>(i + 1);
  const void* ins[] = {in.data()};
  void* outs[] = {out.data()};
  EXPECT_EQ((*kernel)->entry()(ins, outs, 0), 3);
  EXPECT_EQ((*kernel)->entry()(ins, outs, 3), 3);
  ASSERT_EQ((*kernel)->entry()(ins, outs, 1), 0);
  EXPECT_TRUE(std::isnan(out[0])) << "read before the wait must not see the copy";
  ASSERT_EQ((*kernel)->entry()(ins, outs, 2), 0);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(out[i], i % 4 < 2 ? in[i] : 0.0f) << i;
}

// bf16 attention with an additive mask (its probabilities an output too
// where "out P" is added), and a chain of every epilogue function between
// two GEMMs (f16).
constexpr char kBf16Attention[] = R"(
chain attn_bf16
dtype bf16
dim b=3 m=24 n=40 k=32 h=16
in Q[b,m,k] K[b,n,k] V[b,n,h] M[m,n]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.17
P[b,m,n] = softmax(n) S[b,m,n] + M[m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)";

constexpr char kEpilogues[] = R"(
chain epilogues
dtype f16
dim m=20 c=24 f=40 o=24
in X[m,c] W1[c,f] B1[f] W2[f,o] B2[o]
H[m,f] = sum(c) X[m,c] * W1[c,f]
G[m,f] = sigmoid(H[m,f] + B1[f]) * tanh(H[m,f]) - relu(-H[m,f]) / 2
Y[m,o] = sum(f) G[m,f] * W2[f,o]
Z[m,o] = gelu(Y[m,o] * 0.5 + B2[o])
out Z
)";

TEST(CudaEmulationTest, MaskedBf16AttentionAndEpilogues) {
  CheckSpace(std::string(kBf16Attention) + "out P\n", 3);
  CheckSpace(kEpilogues, 3);
  // Warps per block other than the default.
  CheckSchedule(kEpilogues, "m=16 / f=16 / - / cuda warps=1");
  CheckSchedule(kEpilogues, "- / - / H(f=8) Y(o=8) / cuda warps=8");
}

// Tiles that change with every step of the stream loop (or of the own
// loop they sit in) are prefetched one step ahead with cp.async into a
// second stage (two steps ahead into a third with stages=3, for the
// register-resident kernel). The emulation performs a copy only
// when a wait retires it, so a kernel that read the tile before waiting
// would fail: dropping the wait must be caught.
TEST(CudaEmulationTest, PipelinesStreamTilesAndCatchesAMissingWait) {
  ir::Chain chain = Parse(testing::kMaskedF16Attention);
  auto schedule = space::ParseSchedule("b=1 m=16 / n=16 / -", chain);
  ASSERT_TRUE(schedule.ok());
  auto kernel = Emit(chain, *schedule, Gpu());
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  ASSERT_NE(kernel->source.find("prefetch B of the n step 1 ahead"), std::string::npos) << kernel->source;
  EXPECT_EQ(RunKernelEmulated(chain, *kernel), "");
  CudaKernel unwaited = *kernel;
  const std::string wait = "fusor_cp_async_wait<1>();";
  unwaited.source.replace(unwaited.source.find(wait), wait.size(), "");
  EXPECT_NE(RunKernelEmulated(chain, unwaited), "");
  // Across an own loop too: V's tiles along h.
  auto own_loop = space::ParseSchedule("b=1 m=16 / n=16 / O(h=8)", chain);
  ASSERT_TRUE(own_loop.ok());
  auto by_h = Emit(chain, *own_loop, Gpu());
  ASSERT_TRUE(by_h.ok()) << by_h.status();
  const size_t at = by_h->source.find("prefetch B of the h step 1 ahead");
  ASSERT_NE(at, std::string::npos) << by_h->source;
  EXPECT_EQ(RunKernelEmulated(chain, *by_h), "");
  CudaKernel unwaited_h = *by_h;
  unwaited_h.source.replace(unwaited_h.source.find(wait, at), wait.size(), "");
  EXPECT_NE(RunKernelEmulated(chain, unwaited_h), "");
  space::Schedule one_stage = *schedule;
  one_stage.stages = 1;
  auto unpipelined = Emit(chain, one_stage, Gpu());
  ASSERT_TRUE(unpipelined.ok());
  EXPECT_EQ(unpipelined->source.find("prefetch"), std::string::npos);
  EXPECT_LT(unpipelined->shared_bytes, kernel->shared_bytes);
  EXPECT_EQ(RunKernelEmulated(chain, *unpipelined), "");
  // Three stages: two steps in flight, each its own commit group; the
  // wait keeps one pending, and dropping it is caught.
  for (const char* text : {"b=1 m=32 / n=16 / - / cuda warps=1 stages=3 registers",
                           "b=1 m=16 / n=24 / - / cuda stages=3 registers"}) {
    SCOPED_TRACE(text);
    auto three = Emit(chain, *space::ParseSchedule(text, chain), Gpu());
    ASSERT_TRUE(three.ok()) << three.status();
    EXPECT_NE(three->source.find("step 2 ahead"), std::string::npos);
    EXPECT_EQ(RunKernelEmulated(chain, *three), "");
    const std::string wait2 = "fusor_cp_async_wait<2>();";
    CudaKernel unwaited3 = *three;
    unwaited3.source.replace(unwaited3.source.find(wait2), wait2.size(), "");
    EXPECT_NE(RunKernelEmulated(chain, unwaited3), "");
  }
}

// FlashAttention's layout: S, the mask, the softmax and P in each warp's
// registers, O's accumulator too; non-divisible extents, a row tile short
// of the warps' rows, one and two row fragments per warp, B fragments in
// pairs and alone, 1 and 2 stages, f16, bf16 and f32; and extents the
// tiles divide (no bounds checks).
TEST(CudaEmulationTest, AttentionWithIntermediatesInRegisters) {
  for (const char* schedule : {"b=1 m=16 / n=16 / - / cuda registers", "b=1 m=24 / n=32 / - / cuda warps=2 registers",
                               "b=1 m=20 / n=16 / - / cuda stages=1 registers",
                               "b=1 m=16 / n=24 / - / cuda warps=1 registers"}) {
    SCOPED_TRACE(schedule);
    CheckSchedule(testing::kMaskedF16Attention, schedule);
    CheckSchedule(kBf16Attention, schedule);
    CheckSchedule(kAttention, schedule);  // f32: tf32 fragments, re-laid out by shuffles
  }
  // Two row fragments per warp, the last tile short.
  for (const char* schedule :
       {"b=1 m=32 / n=32 / - / cuda warps=1 registers", "b=1 m=32 / n=16 / - / cuda warps=1 stages=1 registers"}) {
    SCOPED_TRACE(schedule);
    CheckSchedule(testing::kMaskedF16Attention, schedule);
    CheckSchedule(kAttention, schedule);
  }
  CheckSchedule(kBf16Attention, "b=1 / n=16 / - / cuda warps=1 registers");
  constexpr char kDivisible[] = R"(
chain attn_tiles
dtype f16
dim b=2 m=128 n=128 k=32 h=32
in Q[b,m,k] K[b,n,k] V[b,n,h]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.125
P[b,m,n] = softmax(n) S[b,m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)";
  for (const char* schedule : {"b=1 m=64 / n=32 / - / cuda warps=2 registers", "b=1 m=32 / n=64 / - / cuda warps=2 registers"}) {
    SCOPED_TRACE(schedule);
    CheckSchedule(kDivisible, schedule);
    auto kernel = Emit(Parse(kDivisible), *space::ParseSchedule(schedule, Parse(kDivisible)), Gpu());
    ASSERT_TRUE(kernel.ok());
    EXPECT_EQ(kernel->source.find("float x = -FUSOR_INFINITY;"), std::string::npos) << "no bounds checks";
    EXPECT_NE(kernel->source.find("fusor_ldmatrix_x4("), std::string::npos) << "B fragments in pairs";
    EXPECT_NE(kernel->source.find("for (int it = 0; it < "), std::string::npos) << "full tiles: constant copies";
  }
  ir::Chain chain = Parse(testing::kMaskedF16Attention);
  auto schedule = space::ParseSchedule("b=1 m=16 / n=16 / - / cuda registers", chain);
  ASSERT_TRUE(schedule.ok());
  auto kernel = Emit(chain, *schedule, Gpu());
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_NE(kernel->source.find("intermediates in registers"), std::string::npos);
  EXPECT_EQ(kernel->source.find("acc0"), std::string::npos) << "no shared accumulator";
  auto shared = Emit(chain, *space::ParseSchedule("b=1 m=16 / n=16 / -", chain), Gpu());
  ASSERT_TRUE(shared.ok());
  EXPECT_LT(kernel->shared_bytes, shared->shared_bytes);
  // A dropped wait is caught here too: in the loop, or before A's
  // fragments are read (A's copies travel with the first step's tiles).
  for (const std::string wait : {"fusor_cp_async_wait<1>();", "fusor_cp_async_wait<0>();  // A and step 0's tiles"}) {
    CudaKernel unwaited = *kernel;
    ASSERT_NE(unwaited.source.find(wait), std::string::npos) << wait;
    unwaited.source.replace(unwaited.source.find(wait), wait.size(), "");
    EXPECT_NE(RunKernelEmulated(chain, unwaited), "") << wait;
  }
}

// Grouped-query attention in registers: each query head of a group a
// block of its own (r a block dim of tile 1), both GEMMs on the query
// rows m alone; the key/value heads are shared through the index.
TEST(CudaEmulationTest, GroupedQueryAttentionWithIntermediatesInRegisters) {
  constexpr char kGrouped[] = R"(
chain gqa
dtype f16
dim b=1 g=2 r=3 m=40 n=48 d=32 e=16
in Q[b,g,r,m,d] K[b,g,n,d] V[b,g,n,e]
S[b,g,r,m,n] = sum(d) Q[b,g,r,m,d] * K[b,g,n,d] * 0.17
P[b,g,r,m,n] = softmax(n) S[b,g,r,m,n]
O[b,g,r,m,e] = sum(n) P[b,g,r,m,n] * V[b,g,n,e]
out O
)";
  CheckSchedule(kGrouped,
                "g=1 r=1 m=32 / n=16 / - / S=mma.sync.m16n8k16.f16[i=m j=n k=d] O=mma.sync.m16n8k16.f16[i=m j=e k=n] "
                "/ cuda warps=1 registers");
  auto space = space::BuildSpace(Parse(kGrouped), Gpu("h200"));
  ASSERT_TRUE(space.ok()) << space.status();
  ASSERT_GT(space->stats.register_resident, 0);
  EXPECT_TRUE(space->ranked[0].schedule.registers);
  SCOPED_TRACE(space::ScheduleToText(space->ranked[0].schedule, Parse(kGrouped)));
  EXPECT_EQ(RunEmulated(Parse(kGrouped), space->ranked[0].schedule, Gpu("h200")), "");
}

// GEMM chains in registers too: the first GEMM's tile, through the
// elementwise ops (bias and GELU), is the second GEMM's A operand; no
// softmax, so nothing is rescaled.
TEST(CudaEmulationTest, GemmChainsWithIntermediatesInRegisters) {
  CheckSchedule(testing::kGemmChain, "m=32 / n=16 / - / cuda warps=1 registers");  // f32: tf32
  CheckSchedule(testing::kGemmChain, "m=16 / n=32 / - / cuda stages=1 registers");
  CheckSchedule(kFfn, "m=16 / f=16 / - / cuda registers");  // f16, extents no tile divides
  CheckSchedule(kFfn, "- / f=32 / - / cuda warps=1 registers");
  ir::Chain chain = Parse(kFfn);
  auto kernel = Emit(chain, *space::ParseSchedule("m=16 / f=16 / - / cuda registers", chain), Gpu());
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ(kernel->source.find("row_sum"), std::string::npos) << "no softmax state";
}

// The stream loop split among blocks: each writes its part to the
// workspace and the tile's last part combines them (rescaled by the parts'
// softmax row states after a softmax). Parts of unequal length, 2 and 3
// stages, f16, bf16 and f32 (tf32). The emulation harness keeps the
// workspace across runs as the device does, so a counter not reset for
// the next launch fails the second validation set.
TEST(CudaEmulationTest, SplitStreamLoopsCombineInTheKernel) {
  for (const char* schedule : {"b=1 m=16 / n=16x2 / - / cuda registers", "b=1 m=24 / n=16x3 / - / cuda warps=1 stages=3 registers"}) {
    SCOPED_TRACE(schedule);
    CheckSchedule(testing::kMaskedF16Attention, schedule);  // n=47: parts of 32 and 15, or 16, 16 and 15
    CheckSchedule(kBf16Attention, schedule);
  }
  CheckSchedule(kAttention, "b=1 m=16 h=24 / n=16x3 / - / cuda warps=1 registers");  // f32, n=72: 32, 32, 8
  CheckSchedule(testing::kGemmChain, "m=32 / n=16x4 / - / cuda warps=1 registers");
  CheckSchedule(kFfn, "m=16 / f=16x2 / - / cuda stages=3 registers");  // GELU between the GEMMs, f=72: 48 and 24
  // In shared memory, GEMM chains only: the parts' sums are added up.
  CheckSchedule(kFfn, "m=16 o=16 / f=16x3 / -");
  CheckSchedule(testing::kGemmChain, "m=32 / n=16x2 / - / cuda stages=1");
  CheckSchedule(kBf16Chain, "b=1 m=16 / n=16x2 / -");  // C is an output too, written by each part

  ir::Chain chain = Parse(testing::kMaskedF16Attention);
  auto kernel = Emit(chain, *space::ParseSchedule("b=1 m=16 / n=16x3 / - / cuda registers", chain), Gpu());
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ(kernel->grid, 2 * 3 * 3);  // b, m tiles, parts
  // Per tile and part: 16 rows x 24 columns of O, 16 rows of (max, sum); a counter per tile.
  EXPECT_EQ(kernel->workspace_bytes, (6 * 3 * 16 * 24 + 6 * 3 * 16 * 2) * 4 + 6 * 4);
  const Program program = FusedProgram(chain, *kernel);
  ASSERT_EQ(program.buffers.size(), 6u);  // Q, K, V, mask, O, then the workspace
  EXPECT_TRUE(program.buffers.back().zeroed);
  Program again;
  std::string why;
  ASSERT_TRUE(ProgramFromText(ProgramToText(program), &again, &why)) << why;
  EXPECT_TRUE(again.buffers.back().zeroed);
  EXPECT_EQ(program.steps[0].kernel.args.size(), 6u);
  // A counter left as the launch found it breaks the next launch.
  CudaKernel unreset = *kernel;
  const std::string reset = "if (tid == 0) arrivals[tile_id] = 0u;";
  ASSERT_NE(unreset.source.find(reset), std::string::npos);
  unreset.source.replace(unreset.source.find(reset), reset.size(), "");
  EXPECT_NE(RunKernelEmulated(chain, unreset), "");

  // In shared memory an online softmax does not split; no part is empty.
  auto shared = space::BuildLoopNest(chain, *space::ParseSchedule("b=1 m=16 / n=16x2 / -", chain), Gpu());
  ASSERT_FALSE(shared.ok());
  EXPECT_NE(shared.status().message().find("a softmax is online along it"), std::string::npos);
  ir::Chain f32 = Parse(kAttention);
  auto empty_part = space::BuildLoopNest(f32, *space::ParseSchedule("b=1 m=16 / n=16x4 / - / cuda registers", f32), Gpu());
  ASSERT_FALSE(empty_part.ok());
  EXPECT_NE(empty_part.status().message().find("a part would have no steps"), std::string::npos);
}

// A causal softmax (offset 5, fewer rows than keys): the blocks skip the
// stream tiles past their last row's kept key, in registers and in shared
// memory; masked on fragments, in rows, in the baseline and the reference.
TEST(CudaEmulationTest, CausalAttentionSkipsTheTilesPastTheDiagonal) {
  std::string bf16 = kBf16Attention, f32 = kAttention;
  for (std::string* text : {&bf16, &f32}) text->replace(text->find("softmax(n)"), 10, "softmax(n <= m + 5)");
  for (const char* schedule : {"b=1 m=16 / n=16 / - / cuda registers", "b=1 m=16 / n=16 / -"}) {
    SCOPED_TRACE(schedule);
    ir::Chain chain = Parse(bf16);
    auto nest = space::BuildLoopNest(chain, *space::ParseSchedule(schedule, chain), Gpu());
    ASSERT_TRUE(nest.ok()) << nest.status();
    EXPECT_EQ(nest->causal_softmax, 1);
    auto kernel = Emit(chain, *space::ParseSchedule(schedule, chain), Gpu());
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    EXPECT_NE(kernel->source.find("o_n < e_n; o_n += 16)"), std::string::npos) << "the key loop ends at the diagonal";
    CheckSchedule(bf16, schedule);
    CheckSchedule(f32, schedule);
  }
  CheckSchedule(f32, "b=1 m=32 / - / O(h=16)");  // a plain softmax over the whole row, masked
  for (const std::string& text : {bf16, f32}) {
    ir::Chain chain = Parse(text);
    auto program = EmitCudaUnfusedBaseline(chain, Gpu());
    ASSERT_TRUE(program.ok()) << program.status();
    EXPECT_EQ(RunBaselineEmulated(chain, *program), "");
  }
}

TEST(CudaEmulationTest, GemmChainF32) {
  CheckSchedule(testing::kGemmChain, "m=32 / n=32 / C(k=16) E(h=16)");
  CheckSchedule(testing::kGemmChain, "m=64 h=32 / n=16 / - / cuda warps=2 stages=1");
  CheckSchedule(testing::kGemmChain, "m=16 / - / C(n=32 k=16) E(h=16 n=32) / cuda warps=8");
}

TEST(CudaEmulationTest, AttentionOnlineAndPlainSoftmax) {
  CheckSchedule(kAttention, "b=1 m=16 / n=32 / -");   // online softmax along n
  CheckSchedule(kAttention, "b=1 m=32 / - / O(h=16)");  // plain softmax over the whole row
  CheckSchedule(testing::kMaskedF16Attention, "b=1 m=16 / n=16 / -");
  CheckSchedule(testing::kMaskedF16Attention, "b=1 / - / S(n=32) O(h=8)");
}

// The unfused baseline: GEMMs cuBLAS can read in place become GEMM steps,
// everything else kernels; the program survives its text form and
// computes the chain.
TEST(CudaEmulationTest, UnfusedBaselinePrograms) {
  struct Case {
    const char* text;
    int gemms, kernels;
  };
  for (const Case& c : {Case{testing::kGemmChain, 2, 0}, Case{kAttention, 2, 1},
                        Case{testing::kMaskedF16Attention, 2, 1}, Case{kBf16Chain, 2, 0}, Case{kFfn, 2, 1},
                        Case{testing::kConvChain, 1, 2}}) {  // conv: the 1x1 conv as a GEMM over (p, q)
    ir::Chain chain = Parse(c.text);
    SCOPED_TRACE(chain.name);
    auto program = EmitCudaUnfusedBaseline(chain, Gpu());
    ASSERT_TRUE(program.ok()) << program.status();
    int gemms = 0, kernels = 0;
    for (const ProgramStep& step : program->steps) (step.is_gemm ? gemms : kernels)++;
    EXPECT_EQ(gemms, c.gemms);
    EXPECT_EQ(kernels, c.kernels);
    Program again;
    std::string why;
    ASSERT_TRUE(ProgramFromText(ProgramToText(*program), &again, &why)) << why;
    EXPECT_EQ(ProgramToText(again), ProgramToText(*program));
    EXPECT_EQ(RunBaselineEmulated(chain, *program), "");
  }
  Program bad;
  std::string why;
  EXPECT_FALSE(ProgramFromText("fusor-program 2\n1 buffers\n16 0 -1 0\n1 steps\nkernel 1\nx\nk 1 32 0 1 5 0\n", &bad,
                               &why));
  EXPECT_NE(why.find("kernel argument"), std::string::npos) << why;
}

// The on-device validation reference (f32, cuBLAS without TF32 or one
// thread per point) agrees with the float64 interpreter far inside any
// candidate's tolerance, for every chain kind; its kernels compile.
TEST(CudaEmulationTest, ValidationReferenceProgram) {
  std::string causal = kAttention;
  causal.replace(causal.find("softmax(n)"), 10, "softmax(n <= m)");
  for (const std::string& text : {std::string(testing::kGemmChain), std::string(kAttention),
                                  std::string(testing::kMaskedF16Attention), std::string(kBf16Attention),
                                  std::string(kFfn), std::string(kEpilogues), std::string(testing::kConvChain), causal}) {
    ir::Chain chain = Parse(text);
    SCOPED_TRACE(chain.name);
    const Program reference = EmitCudaReference(chain);
    for (const ProgramStep& step : reference.steps) {
      if (!step.is_gemm) EXPECT_EQ(CompileWithNvrtc(step.kernel), "") << step.what;
    }
    auto dir = TempDir::Create("/tmp", "fusor-cuda-ref-test-");
    ASSERT_TRUE(dir.ok());
    worker::CompileOutcome compiled = worker::CompileKernel(ProgramEmulationHarness(reference), dir->path(), "c++", 120);
    ASSERT_TRUE(compiled.ok) << compiled.error;
    auto loaded = worker::LoadedKernel::Open(compiled.so_path, "fusor_run");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    // Inputs rounded to the chain's dtype, given in it; outputs in f32.
    std::vector<std::vector<double>> inputs = worker::RandomInputs(chain, 7);
    std::vector<std::vector<unsigned char>> given;
    for (size_t i = 0; i < inputs.size(); ++i) {
      given.emplace_back(inputs[i].size() * ir::DTypeBytes(chain.dtype));
      for (size_t e = 0; e < inputs[i].size(); ++e) {
        const float f = static_cast<float>(inputs[i][e]);
        if (chain.dtype == ir::DType::kF32) {
          std::memcpy(given[i].data() + 4 * e, &f, 4);
          inputs[i][e] = f;
          continue;
        }
        const uint16_t h = chain.dtype == ir::DType::kF16 ? rt::fusor_f32_to_f16(f) : rt::fusor_f32_to_bf16(f);
        std::memcpy(given[i].data() + 2 * e, &h, 2);
        inputs[i][e] = chain.dtype == ir::DType::kF16 ? rt::fusor_f16_to_f32(h) : rt::fusor_bf16_to_f32(h);
      }
    }
    std::vector<std::vector<float>> outputs;
    for (int t : chain.outputs) outputs.emplace_back(chain.tensors[t].NumElements(), 0.0f);
    std::vector<const void*> in;
    for (const auto& g : given) in.push_back(g.data());
    std::vector<void*> out;
    for (auto& o : outputs) out.push_back(o.data());
    ASSERT_EQ(loaded->entry()(in.data(), out.data(), 1), 0);
    auto expected = ir::EvaluateReference(chain, inputs);
    ASSERT_TRUE(expected.ok()) << expected.status();
    for (size_t o = 0; o < outputs.size(); ++o) {
      double sq = 0;
      for (double x : (*expected)[o]) sq += x * x;
      const double rms = std::sqrt(sq / static_cast<double>((*expected)[o].size()));
      for (size_t e = 0; e < outputs[o].size(); ++e) {
        const double want = (*expected)[o][e];
        ASSERT_LE(std::fabs(outputs[o][e] - want), 1e-5 * (std::fabs(want) + rms)) << "output " << o << " element " << e;
      }
    }
  }
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
