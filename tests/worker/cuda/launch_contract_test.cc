// The launch contract (gpu_runtime.h): every kernel fusor launches takes
// exactly one parameter, a struct of the size the runtime passes. The
// driver reads one pointer per declared parameter from kernelParams, so a
// kernel with more parameters than that would read past the array. Checked
// without a GPU: each kernel is compiled to PTX by NVRTC and its entry's
// parameter list read back.
#include <gtest/gtest.h>

#include "common/codegen/cuda/cuda_codegen.h"
#include "common/codegen/cuda/nvrtc.h"
#include "common/hw/devices.h"
#include "common/ir/parse.h"
#include "common/space/loop_nest.h"
#include "common/space/space.h"
#include "tests/test_chains.h"
#include "worker/cuda/gpu_runtime.h"

namespace fusor {
namespace {

class LaunchContractTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    nvrtc_ = codegen::Nvrtc::Get(&why);
    if (nvrtc_ == nullptr) GTEST_SKIP() << why;
  }
  // The parameter sizes of `name` in `source` as compiled.
  std::vector<int64_t> Params(const std::string& source, const std::string& name) {
    codegen::NvrtcOutput out =
        nvrtc_->Compile(source, "compute_90", {{"fusor_device.h", std::string(codegen::CudaDeviceHeader())}});
    EXPECT_TRUE(out.ok) << out.log;
    return codegen::PtxEntryParamBytes(out.ptx, name);
  }
  // Every kernel step of `program` takes one struct of its buffers' addresses.
  void ExpectOneStructPerKernel(const codegen::Program& program) {
    for (const codegen::ProgramStep& step : program.steps) {
      if (step.is_gemm) continue;
      const codegen::KernelStep& k = step.kernel;
      EXPECT_EQ(Params(k.source, k.name),
                std::vector<int64_t>{static_cast<int64_t>(k.args.size() * sizeof(gpu::DevicePtr))})
          << step.what;
    }
  }
  const codegen::Nvrtc* nvrtc_ = nullptr;
};

TEST_F(LaunchContractTest, ReadsEachParameterOfAnEntry) {
  // The shape of the calibration copy before the contract: three parameters.
  const char source[] = R"(
extern "C" __global__ void three(const float4* __restrict__ in, float4* out, long n) { if (n) out[0] = in[0]; }
struct Two { void* p; int n; };
extern "C" __global__ void one(const Two t) { if (t.n) ((int*)t.p)[0] = 1; }
extern "C" __global__ void none() {}
)";
  EXPECT_EQ(Params(source, "three"), (std::vector<int64_t>{8, 8, 8}));
  EXPECT_EQ(Params(source, "one"), std::vector<int64_t>{16});
  EXPECT_EQ(Params(source, "none"), std::vector<int64_t>{});
  EXPECT_EQ(Params(source, "absent"), std::vector<int64_t>{-1});
}

TEST_F(LaunchContractTest, TheCalibrationKernelsTakeTheStructTheRuntimePasses) {
  const std::vector<gpu::BuiltinKernel> kernels = gpu::BuiltinKernels();
  ASSERT_EQ(kernels.size(), 2u);
  for (const gpu::BuiltinKernel& k : kernels) {
    EXPECT_EQ(Params(k.source, k.name), std::vector<int64_t>{static_cast<int64_t>(k.args_bytes)}) << k.name;
  }
}

TEST_F(LaunchContractTest, FusedBaselineAndReferenceKernelsTakeOneStruct) {
  const hw::TargetDesc target = *hw::LookupDevice("h200");
  for (const char* text : {testing::kMaskedF16Attention, testing::kGemmChain, testing::kConvChain}) {
    auto chain = ir::ParseChainText(text);
    ASSERT_TRUE(chain.ok()) << chain.status();
    auto space = space::BuildSpace(*chain, target);
    ASSERT_TRUE(space.ok()) << space.status();
    ASSERT_FALSE(space->ranked.empty());
    std::vector<space::Schedule> schedules = {space->ranked[0].schedule};
    if (auto r = space::RegisterResidentVariant(*chain, schedules[0], target)) {
      schedules.push_back(*r);
      schedules.push_back(*r);  // its stream loop split in two: the workspace is one more pointer
      schedules.back().split = 2;
    }
    for (const space::Schedule& schedule : schedules) {
      auto nest = space::BuildLoopNest(*chain, schedule, target);
      ASSERT_TRUE(nest.ok()) << nest.status();
      auto kernel = codegen::EmitCudaFusedKernel(*chain, *nest, "s", "m");
      ASSERT_TRUE(kernel.ok()) << kernel.status();
      ExpectOneStructPerKernel(codegen::FusedProgram(*chain, *kernel));
    }
    auto baseline = codegen::EmitCudaUnfusedBaseline(*chain, target);
    ASSERT_TRUE(baseline.ok()) << baseline.status();
    ExpectOneStructPerKernel(*baseline);
    ExpectOneStructPerKernel(codegen::EmitCudaReference(*chain));
  }
}

}  // namespace
}  // namespace fusor
