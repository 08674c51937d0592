// The parts of the GPU device check (bench/gpu) that run without a GPU:
// preparing candidates, baselines and references; building the runner from
// its plain C++ sources as run.sh does on the GPU machine; the runner's
// clean refusal without a driver, and its dry run (every candidate
// compiled, every child supervised), or with a driver a full pass; the table.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/util/files.h"
#include "common/codegen/cuda/nvrtc.h"
#include "common/codegen/cuda/program.h"
#include "common/util/process.h"

namespace fusor {
namespace {

std::string Read(const std::string& path) { return ReadFile(path).value_or(""); }

TEST(GpuCheckTest, PreparesBuildsAndSummarizes) {
  auto dir = TempDir::Create("/tmp", "fusor-gpu-check-test-");
  ASSERT_TRUE(dir.ok());
  const std::string src = FUSOR_SOURCE_DIR, prep = dir->path() + "/prep", log = dir->path() + "/log";
  auto run = RunProcess({std::string(FUSOR_BINARY_DIR) + "/bench/fusor-bench-gpu-prep", prep, "h200", "2",
                                 src + "/examples/conv1x1_chain.fusor"},
                                log, 300);
  ASSERT_TRUE(run.ok());
  ASSERT_EQ(run->exit_code, 0) << ReadTail(log, 4000);
  const std::string chain = prep + "/conv1x1_relu_conv1x1";
  EXPECT_NE(Read(chain + "/manifest.txt").find("dtype f32"), std::string::npos);
  // 1 x 64 x 28 x 28 f32 outputs.
  EXPECT_EQ(Read(chain + "/expected.f32").size(), 64u * 28 * 28 * 4);
  for (const char* name : {"candidate_0.prog", "candidate_1.prog", "baseline.prog"}) {
    codegen::Program program;
    std::string why;
    EXPECT_TRUE(codegen::ProgramFromText(Read(chain + "/" + name), &program, &why)) << name << ": " << why;
  }

  // The runner builds as run.sh builds it on the GPU machine: no CUDA
  // headers or libraries, no project libraries.
  const std::string runner = dir->path() + "/fusor-gpu-check";
  run = RunProcess({"c++", "-O1", "-std=c++17", "-I" + src, src + "/bench/gpu/runner.cc", src + "/bench/gpu/supervise.cc",
                    src + "/worker/cuda/gpu_runtime.cc", src + "/common/codegen/cuda/nvrtc.cc",
                    src + "/common/codegen/cuda/program.cc", "-ldl", "-lpthread", "-o", runner},
                   log, 300);
  ASSERT_TRUE(run.ok());
  ASSERT_EQ(run->exit_code, 0) << ReadTail(log, 4000);
  for (bool dry_run : {false, true}) {
    std::vector<std::string> argv = {runner, prep, src + "/common/codegen/cuda/device/fusor_device.h", "--seconds",
                                      "0.05", "--deadline", "120"};
    // Compiles every candidate for sm_90 (where NVRTC is) and supervises
    // the children, which find no device.
    if (dry_run) argv.insert(argv.end(), {"--dry-run-arch", "sm_90"});
    run = RunProcess(argv, log, 600);
    ASSERT_TRUE(run.ok());
    if (run->exit_code == 3) {
      EXPECT_NE(Read(log).find("no GPU"), std::string::npos) << Read(log);
      EXPECT_EQ(Read(log).find("MEASURE conv1x1_relu_conv1x1 baseline FAIL") != std::string::npos, dry_run)
          << Read(log);
      // Where NVRTC is, the dry run compiled every prepared program.
      if (dry_run && codegen::Nvrtc::Get() != nullptr) {
        EXPECT_EQ(Read(log).find("rejected"), std::string::npos) << Read(log);
      }
    } else {
      EXPECT_EQ(run->exit_code, 0) << Read(log);  // a GPU: every chain measured and valid
      EXPECT_NE(Read(log).find("RESULT chain=conv1x1_relu_conv1x1"), std::string::npos);
    }
  }

  const std::string fake = dir->path() + "/fake.log";
  std::ofstream(fake) << "DEVICE NVIDIA H200 sm_90 SMs=132\nCEILING copy_TBps=4.000 mma_f16_TFLOPs=600.0\n"
                      << "RESULT chain=c fused_us=10.000 baseline_us=25.000 flops=1e9 min_bytes=2e7 copy_Bps=4e12 "
                         "mma_flops=6e14 best=candidate_0\n"
                      << "TORCH chain=c matmul_us=30.000 sdpa_us=-1.000 sdpa=- torch=2.5\n";
  run = RunProcess({"python3", src + "/bench/gpu/table.py", fake}, log, 60);
  ASSERT_TRUE(run.ok());
  ASSERT_EQ(run->exit_code, 0) << Read(log);
  // 2e7 bytes in 10 us is 2 TB/s, half the copy bandwidth; 1e9 FLOP is 100 TFLOP/s.
  EXPECT_NE(Read(log).find("| c | 10.0 | 25.0 | 2.50x | 30.0 | - | 3.00x | 2.00 | 50% | 100.0 | 17% |"),
            std::string::npos)
      << Read(log);
}

}  // namespace
}  // namespace fusor
