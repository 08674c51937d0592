// NVRTC loading, compilation, the resource report and the launch checks.
#include "common/codegen/cuda/nvrtc.h"

#include <gtest/gtest.h>

#include "common/codegen/cuda/cuda_codegen.h"

namespace fusor::codegen {
namespace {

TEST(PtxasReportTest, ParsesEveryFigure) {
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'fusor_fused' for 'sm_90'\n"
      "ptxas info    : Function properties for fusor_fused\n"
      "ptxas         .     32 bytes stack frame, 28 bytes spill stores, 40 bytes spill loads\n"
      "ptxas info    : Used 56 registers, used 1 barriers, 1024 bytes smem, 384 bytes cmem[0]\n";
  ResourceUsage u = ParsePtxasReport(log);
  EXPECT_EQ(u.registers, 56);
  EXPECT_EQ(u.stack_bytes, 32);
  EXPECT_EQ(u.spill_store_bytes, 28);
  EXPECT_EQ(u.spill_load_bytes, 40);
  EXPECT_EQ(u.static_shared_bytes, 1024);
  EXPECT_EQ(ParsePtxasReport("").registers, -1);
}

TEST(PtxasReportTest, ResourceChecksNameTheLimit) {
  ResourceUsage u;
  u.registers = 128;
  u.spill_store_bytes = u.spill_load_bytes = 0;
  const DeviceLimits h100 = LimitsForArch("sm_90");
  EXPECT_EQ(CheckResources(u, 256, 200 << 10, h100), "");
  EXPECT_NE(CheckResources(u, 256, 230 << 10, h100).find("shared memory"), std::string::npos);
  EXPECT_NE(CheckResources(u, 256, 200 << 10, LimitsForArch("sm_80")), "");  // 163 KB there
  EXPECT_NE(CheckResources(u, 1024, 0, h100).find("registers"), std::string::npos);
  u.spill_store_bytes = 8;
  EXPECT_NE(CheckResources(u, 128, 0, h100).find("spills"), std::string::npos);
}

class NvrtcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    nvrtc_ = Nvrtc::Get(&why);
    if (nvrtc_ == nullptr) GTEST_SKIP() << why;
  }
  const Nvrtc* nvrtc_ = nullptr;
};

TEST_F(NvrtcTest, CompilesTheDeviceHeaderForEachArch) {
  // Every primitive of the device header, instantiated once.
  const std::string source = R"(
#include "fusor_device.h"
extern "C" __global__ void __launch_bounds__(32, 1) probe(float* out, const fusor_u16* in) {
  FUSOR_DYNAMIC_SMEM(smem);
  fusor_u16* tile = (fusor_u16*)smem;
  fusor_cp_async16(tile + 8 * fusor_lane(), in + 8 * fusor_lane(), 16);
  fusor_cp_async_commit();
  fusor_cp_async_wait<0>();
  __syncthreads();
  fusor_u32 a[4], b[2], t[2];
  fusor_ldmatrix_x4(a, tile + 8 * (fusor_lane() % 16));
  fusor_ldmatrix_x2(b, tile + 8 * (fusor_lane() % 16));
  fusor_ldmatrix_x2_trans(t, tile + 8 * (fusor_lane() % 16));
  fusor_ldmatrix_x4_trans(a, tile + 8 * (fusor_lane() % 16));
  float c[4] = {0, 0, 0, 0};
  fusor_mma_m16n8k16_f16(c, a, b);
  fusor_mma_m16n8k16_bf16(c, a, t);
  fusor_u32 x[4] = {fusor_bits(fusor_round_tf32(c[0])), a[1], a[2], a[3]};
  fusor_mma_m16n8k8_tf32(c, x, b);
  float v = fusor_shfl_xor(c[0] + c[1] + c[2] + c[3], 1);
  v += fusor_f16_to_f32(fusor_f32_to_f16(v)) + fusor_bf16_to_f32(fusor_f32_to_bf16(v));
  out[threadIdx.x] = fusor_gelu(v) + fusor_gelu_tanh(v) + fusor_relu(v) + fusor_sigmoid(v) + (v < -FUSOR_INFINITY ? 1.0f : 0.0f);
}
)";
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90"}) {
    NvrtcOutput out = nvrtc_->Compile(source, arch, {{"fusor_device.h", std::string(CudaDeviceHeader())}});
    ASSERT_TRUE(out.ok) << arch << ": " << out.log;
    EXPECT_GT(out.cubin.size(), 1000u);
    EXPECT_GT(out.usage.registers, 0) << out.log;
    EXPECT_EQ(out.usage.spill_store_bytes, 0) << out.log;
    EXPECT_EQ(out.arch, arch);
  }
  EXPECT_EQ(nvrtc_->Version().rfind("NVRTC ", 0), 0u);
}

TEST_F(NvrtcTest, ReportsCompileErrorsInTheOutcome) {
  NvrtcOutput out = nvrtc_->Compile("extern \"C\" __global__ void k() { undeclared = 1; }", "sm_80", {});
  EXPECT_FALSE(out.ok);
  EXPECT_TRUE(out.cubin.empty());
  EXPECT_NE(out.log.find("undeclared"), std::string::npos) << out.log;
}

}  // namespace
}  // namespace fusor::codegen
