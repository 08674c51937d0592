// The compile half of a CUDA job needs NVRTC but no GPU: the worker runs
// it for the next candidates while the device measures this one. Here it
// writes what the measuring child loads, records ptxas's report, and
// rejects a kernel that does not fit the device before anything runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>

#include "common/codegen/cuda/nvrtc.h"
#include "common/codegen/cuda/program.h"
#include "common/hw/devices.h"
#include "common/ir/parse.h"
#include "common/util/files.h"
#include "tests/test_chains.h"
#include "worker/cuda/gpu_job.h"
#include "common/util/process.h"

namespace fusor::worker {
namespace {

using ::testing::HasSubstr;

class GpuCompileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (codegen::Nvrtc::Get(&why) == nullptr) GTEST_SKIP() << why;
    auto dir = TempDir::Create("/tmp", "fusor-gpu-compile-");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(*dir));
  }
  JobSpec Spec(JobKind kind, const ir::Chain& chain, const std::string& schedule) {
    JobSpec spec;
    spec.kind = kind;
    spec.phase = JobPhase::kCompile;
    spec.chain_json = ir::ChainToJson(chain);
    spec.schedule_text = schedule;
    spec.target = *hw::LookupDevice("h200");
    return spec;
  }
  std::optional<TempDir> dir_;
};

TEST_F(GpuCompileTest, WritesTheProgramAndItsCubins) {
  auto chain = ir::ParseChainText(testing::kMaskedF16Attention);
  ASSERT_TRUE(chain.ok());
  JobOutcome out = CompileCudaJob(Spec(JobKind::kCandidate, *chain, "b=1 m=16 / n=16 / -"), *chain, dir_->path());
  ASSERT_EQ(out.status, OutcomeStatus::kOk) << out.error;
  EXPECT_GT(out.compile_s, 0);
  EXPECT_GT(out.code_bytes, 0);
  EXPECT_THAT(out.compile_flags, HasSubstr("sm_90"));
  auto resources = nlohmann::json::parse(out.resources_json);
  ASSERT_EQ(resources.size(), 1u);
  EXPECT_GT(resources[0]["registers"].get<int>(), 0);
  EXPECT_EQ(resources[0]["spill_store_bytes"].get<int>(), 0);

  auto text = ReadFile(dir_->path() + "/program.txt");
  ASSERT_TRUE(text.ok());
  codegen::Program program;
  std::string why;
  ASSERT_TRUE(codegen::ProgramFromText(*text, &program, &why)) << why;
  ASSERT_EQ(program.steps.size(), 1u);
  EXPECT_EQ(std::filesystem::file_size(dir_->path() + "/program.step0.cubin"), static_cast<uintmax_t>(out.code_bytes));
  // The f32 validation reference, compiled with it.
  codegen::Program reference;
  ASSERT_TRUE(codegen::ProgramFromText(*ReadFile(dir_->path() + "/reference.txt"), &reference, &why)) << why;
  for (size_t i = 0; i < reference.steps.size(); ++i) {
    EXPECT_EQ(std::filesystem::exists(dir_->path() + "/reference.step" + std::to_string(i) + ".cubin"),
              !reference.steps[i].is_gemm);
  }
}

TEST_F(GpuCompileTest, TheBaselineCompilesItsKernelsAndKeepsItsGemms) {
  auto chain = ir::ParseChainText(testing::kMaskedF16Attention);
  ASSERT_TRUE(chain.ok());
  JobOutcome out = CompileCudaJob(Spec(JobKind::kBaseline, *chain, ""), *chain, dir_->path());
  ASSERT_EQ(out.status, OutcomeStatus::kOk) << out.error;
  codegen::Program program;
  std::string why;
  ASSERT_TRUE(codegen::ProgramFromText(*ReadFile(dir_->path() + "/program.txt"), &program, &why)) << why;
  int gemms = 0;
  for (size_t i = 0; i < program.steps.size(); ++i) {
    SCOPED_TRACE(program.steps[i].what);
    gemms += program.steps[i].is_gemm;
    EXPECT_EQ(std::filesystem::exists(dir_->path() + "/program.step" + std::to_string(i) + ".cubin"),
              !program.steps[i].is_gemm);
  }
  EXPECT_EQ(gemms, 2);  // Q·K and P·V through cuBLAS; softmax is a kernel
  EXPECT_EQ(program.steps.size(), 3u);
}

TEST_F(GpuCompileTest, AKernelThatDoesNotFitIsRejectedWithTheReason) {
  // 128 rows of S over n = 4096 in shared memory (f32): 2 MiB per block.
  auto chain = ir::ParseChainText(R"(
chain wide
dtype f16
dim m=256 n=4096 k=64 h=64
in Q[m,k] K[n,k] V[n,h]
S[m,n] = sum(k) Q[m,k] * K[n,k]
P[m,n] = softmax(n) S[m,n]
O[m,h] = sum(n) P[m,n] * V[n,h]
out O
)");
  ASSERT_TRUE(chain.ok());
  JobOutcome out = CompileCudaJob(Spec(JobKind::kCandidate, *chain, "m=128 / - / -"), *chain, dir_->path());
  EXPECT_EQ(out.status, OutcomeStatus::kCompileError);
  EXPECT_THAT(out.error, HasSubstr("rejected before running"));
  EXPECT_THAT(out.error, HasSubstr("shared memory"));
  EXPECT_FALSE(std::filesystem::exists(dir_->path() + "/program.txt"));
}

// The examples' attention with its intermediates in registers
// (FlashAttention's layout) fits an H200 without spilling.
TEST_F(GpuCompileTest, RegisterResidentAttentionCompilesWithoutSpills) {
  for (const char* file : {"bert_large_attention_f16.fusor", "bert_base_attention.fusor"}) {
    for (const char* schedule : {"b=1 m=64 / n=64 / - / cuda registers", "b=1 m=128 / n=64 / - / cuda warps=8 registers",
                                 "b=1 m=64 / n=32 / - / cuda stages=1 registers"}) {
      SCOPED_TRACE(std::string(file) + ": " + schedule);
      auto text = ReadFile(std::string(FUSOR_SOURCE_DIR) + "/examples/" + file);
      ASSERT_TRUE(text.ok());
      auto chain = ir::ParseChainText(*text);
      ASSERT_TRUE(chain.ok()) << chain.status();
      JobOutcome out = CompileCudaJob(Spec(JobKind::kCandidate, *chain, schedule), *chain, dir_->path());
      ASSERT_EQ(out.status, OutcomeStatus::kOk) << out.error;
      auto resources = nlohmann::json::parse(out.resources_json);
      EXPECT_EQ(resources[0]["spill_store_bytes"].get<int>(), 0);
      EXPECT_LE(resources[0]["registers"].get<int>(), 255);
      std::cout << file << " " << schedule << ": " << resources[0]["registers"] << " registers, "
                << resources[0]["dynamic_shared_bytes"] << " bytes of shared memory\n";
    }
  }
}

TEST_F(GpuCompileTest, MeasuringWithoutCompiledCodeSaysWhatIsMissing) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  ASSERT_TRUE(chain.ok());
  JobSpec spec = Spec(JobKind::kCandidate, *chain, "m=16 / n=16 / -");
  spec.phase = JobPhase::kMeasure;
  JobOutcome out = MeasureCudaJob(spec, *chain, dir_->path());
  EXPECT_EQ(out.status, OutcomeStatus::kRuntimeError);
  EXPECT_THAT(out.error, HasSubstr("program.txt"));
}

}  // namespace
}  // namespace fusor::worker
