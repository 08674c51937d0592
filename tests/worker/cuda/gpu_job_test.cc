// The worker's CUDA path on a real GPU (label gpu: run only where one is
// present; skipped otherwise): description, calibration, a fused candidate
// and the unfused cuBLAS baseline, each validated against the on-device
// f32 reference.
#include "worker/cuda/gpu_job.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/ir/parse.h"
#include "common/space/space.h"
#include "tests/test_chains.h"
#include "common/util/process.h"

namespace fusor::worker {
namespace {

class GpuJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto target = DescribeGpuTarget(0);
    if (!target.ok()) GTEST_SKIP() << target.status();
    target_ = *target;
  }
  JobSpec Spec(JobKind kind, const ir::Chain& chain) {
    JobSpec spec;
    spec.kind = kind;
    spec.chain_json = ir::ChainToJson(chain);
    spec.target = target_;
    spec.timing.time_budget_s = 0.05;
    return spec;
  }
  // Compiles into a fresh directory, then validates and times there.
  JobOutcome CompileAndMeasure(const JobSpec& spec, const ir::Chain& chain) {
    auto dir = TempDir::Create("/tmp", "fusor-gpu-test-");
    if (!dir.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(dir.status().message()));
    JobOutcome compiled = CompileCudaJob(spec, chain, dir->path());
    if (compiled.status != OutcomeStatus::kOk) return compiled;
    JobOutcome out = MeasureCudaJob(spec, chain, dir->path());
    MergeCompileRecord(compiled, out);
    return out;
  }
  hw::TargetDesc target_;
};

TEST_F(GpuJobTest, DescribesAndCalibrates) {
  EXPECT_EQ(target_.backend, hw::Backend::kCuda);
  EXPECT_GT(target_.compute_units, 0);
  EXPECT_EQ(target_.arch.rfind("sm_", 0), 0u);
  JobOutcome out = CalibrateCudaJob(Spec(JobKind::kCalibrate, ir::Chain()));
  ASSERT_EQ(out.status, OutcomeStatus::kOk) << out.error;
  EXPECT_GT(out.bandwidth_bytes_per_s, 1e11);
  EXPECT_GT(out.peak_flops, 1e13);
}

TEST_F(GpuJobTest, MeasuresCandidatesAndTheBaseline) {
  for (const char* text : {testing::kGemmChain, testing::kMaskedF16Attention, testing::kConvChain}) {
    auto chain = ir::ParseChainText(text);
    ASSERT_TRUE(chain.ok());
    SCOPED_TRACE(chain->name);
    auto space = space::BuildSpace(*chain, target_);
    ASSERT_TRUE(space.ok());
    JobSpec spec = Spec(JobKind::kCandidate, *chain);
    spec.schedule_text = space::ScheduleToText(space->ranked[0].schedule, *chain);
    JobOutcome fused = CompileAndMeasure(spec, *chain);
    ASSERT_EQ(fused.status, OutcomeStatus::kOk) << fused.error;
    EXPECT_GT(fused.median_s, 0);
    EXPECT_GE(fused.samples_s.size(), 5u);
    EXPECT_GT(nlohmann::json::parse(fused.resources_json)[0]["registers"].get<int>(), 0);
    JobOutcome baseline = CompileAndMeasure(Spec(JobKind::kBaseline, *chain), *chain);
    ASSERT_EQ(baseline.status, OutcomeStatus::kOk) << baseline.error;
    EXPECT_GT(baseline.median_s, 0);
  }
}

}  // namespace
}  // namespace fusor::worker
