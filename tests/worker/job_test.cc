// Jobs in isolated children: a real candidate and the baseline are
// measured; a runner that crashes, hangs or vanishes is recorded as such.
#include "worker/job.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/ir/parse.h"
#include "common/util/process.h"

namespace fusor::worker {
namespace {

using ::testing::HasSubstr;

hw::TargetDesc Target() {
  hw::TargetDesc t;
  t.compute_units = 2;
  t.vector_lanes_f32 = 8;
  t.isa_features = {"avx2", "fma"};
  t.compiler = "test";
  return t;
}

constexpr char kChain[] = R"(
chain small
dim m=24 n=40 k=16
in A[m,k] B[n,k]
S[m,n] = sum(k) A[m,k] * B[n,k]
T[m,n] = softmax(n) S[m,n]
out T
)";

JobSpec Spec(JobKind kind, const std::string& schedule) {
  JobSpec spec;
  spec.kind = kind;
  spec.chain_json = ir::ChainToJson(*ir::ParseChainText(kChain));
  spec.schedule_text = schedule;
  spec.target = Target();
  spec.blas_dir = FUSOR_OPENBLAS_DIR;
  spec.timing.min_repeats = 3;
  spec.timing.max_repeats = 5;
  spec.timing.time_budget_s = 0.01;
  spec.timing.max_spread = 1e9;  // mechanics under a busy test machine; trusted_measurement_test checks the bound
  spec.compile_timeout_s = 60;
  spec.run_timeout_s = 30;
  return spec;
}

// A stand-in for the runner binary, to make children misbehave.
std::string FakeRunner(const std::string& dir, const std::string& body) {
  std::string path = dir + "/runner.sh";
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  chmod(path.c_str(), 0755);
  return path;
}

TEST(RunJobIsolatedTest, MeasuresARealCandidate) {
  JobOutcome out = RunJobIsolated(Spec(JobKind::kCandidate, "m=8 / - / S(n=32)"), CurrentExecutable(""), "/tmp");
  ASSERT_EQ(out.status, OutcomeStatus::kOk) << out.error;
  EXPECT_GE(out.samples_s.size(), 3u);
  EXPECT_GT(out.median_s, 0);
  EXPECT_LT(out.max_rel_error, 1e-4);
  EXPECT_GT(out.code_bytes, 0);
  EXPECT_THAT(out.compile_flags, HasSubstr("-O3"));
}

TEST(RunJobIsolatedTest, CompilesAndMeasuresInTwoChildren) {
  auto artifacts = TempDir::Create("/tmp", "fusor-artifacts-");
  ASSERT_TRUE(artifacts.ok());
  JobSpec spec = Spec(JobKind::kCandidate, "m=8 / - / S(n=32)");
  spec.phase = JobPhase::kCompile;
  spec.artifact_dir = artifacts->path();
  JobOutcome compiled = RunJobIsolated(spec, CurrentExecutable(""), "/tmp");
  ASSERT_EQ(compiled.status, OutcomeStatus::kOk) << compiled.error;
  EXPECT_GT(compiled.code_bytes, 0);
  EXPECT_TRUE(compiled.samples_s.empty());  // nothing ran

  spec.phase = JobPhase::kMeasure;
  JobOutcome out = RunJobIsolated(spec, CurrentExecutable(""), "/tmp");
  ASSERT_EQ(out.status, OutcomeStatus::kOk) << out.error;
  EXPECT_GE(out.samples_s.size(), 3u);
  EXPECT_LT(out.max_rel_error, 1e-4);
  MergeCompileRecord(compiled, out);
  EXPECT_THAT(out.compile_flags, HasSubstr("-O3"));
}

TEST(RunJobIsolatedTest, MeasuringWhatWasNeverCompiledIsAnError) {
  auto artifacts = TempDir::Create("/tmp", "fusor-artifacts-");
  ASSERT_TRUE(artifacts.ok());
  JobSpec spec = Spec(JobKind::kCandidate, "m=8 / - / S(n=32)");
  spec.phase = JobPhase::kMeasure;
  spec.artifact_dir = artifacts->path();
  JobOutcome out = RunJobIsolated(spec, CurrentExecutable(""), "/tmp");
  EXPECT_EQ(out.status, OutcomeStatus::kRuntimeError);
  EXPECT_THAT(out.error, HasSubstr("compiled.json"));
}

TEST(RunJobIsolatedTest, MeasuresTheBaseline) {
  JobOutcome out = RunJobIsolated(Spec(JobKind::kBaseline, ""), CurrentExecutable(""), "/tmp");
  ASSERT_EQ(out.status, OutcomeStatus::kOk) << out.error;
  EXPECT_THAT(out.compile_flags, HasSubstr("-lopenblas"));
  // Both BLAS were validated and timed; the faster one is the baseline.
  const nlohmann::json resources = nlohmann::json::parse(out.resources_json);
  const std::string kept = resources.at("baseline");
  EXPECT_TRUE(kept == "openblas" || kept == "onednn") << out.resources_json;
  ASSERT_TRUE(resources.at("variants").contains("openblas")) << out.resources_json;
  ASSERT_TRUE(resources.at("variants").contains("onednn")) << out.resources_json;
  for (const auto& [name, v] : resources.at("variants").items()) {
    EXPECT_GE(v.at("median_s").get<double>(), out.median_s) << name;
  }
}

TEST(RunJobIsolatedTest, AConfirmationTimesTheBaselineBesideTheCandidate) {
  JobOutcome out = RunJobIsolated(Spec(JobKind::kConfirm, "m=8 / - / -"), CurrentExecutable(""), "/tmp");
  ASSERT_EQ(out.status, OutcomeStatus::kOk) << out.error;
  EXPECT_GE(out.samples_s.size(), 10u);
  // The candidate's own compile record, not a BLAS one.
  EXPECT_THAT(out.compile_flags, ::testing::Not(HasSubstr("-lopenblas")));
  const nlohmann::json resources = nlohmann::json::parse(out.resources_json);
  const nlohmann::json& beside = resources.at("beside");
  const std::string kept = beside.at("baseline");
  EXPECT_TRUE(kept == "openblas" || kept == "onednn") << out.resources_json;
  EXPECT_EQ(beside.at("status"), "ok");
  // Timed in as many samples as the candidate, slice by slice.
  EXPECT_EQ(beside.at("samples_s").size(), out.samples_s.size());
  EXPECT_GT(beside.at("median_s").get<double>(), 0);
  EXPECT_TRUE(resources.at("variants").contains("openblas")) << out.resources_json;
}

TEST(RunJobIsolatedTest, ABadScheduleIsACompileError) {
  JobOutcome out = RunJobIsolated(Spec(JobKind::kCandidate, "k=8 / - / -"), CurrentExecutable(""), "/tmp");
  EXPECT_EQ(out.status, OutcomeStatus::kCompileError);
  EXPECT_THAT(out.error, HasSubstr("cannot be a block loop"));
}

TEST(RunJobIsolatedTest, ACrashingRunnerIsRecordedAsACrash) {
  auto dir = TempDir::Create("/tmp", "fusor-fake-");
  JobOutcome out = RunJobIsolated(Spec(JobKind::kCandidate, "m=8 / - / -"), FakeRunner(dir->path(), "kill -SEGV $$"),
                                  "/tmp");
  EXPECT_EQ(out.status, OutcomeStatus::kCrash);
  EXPECT_THAT(out.error, HasSubstr("signal 11"));
}

TEST(RunJobIsolatedTest, AHangingRunnerIsKilledAtTheTimeout) {
  auto dir = TempDir::Create("/tmp", "fusor-fake-");
  JobSpec spec = Spec(JobKind::kCandidate, "m=8 / - / -");
  spec.compile_timeout_s = 0.2;
  spec.run_timeout_s = 0.2;
  JobOutcome out = RunJobIsolated(spec, FakeRunner(dir->path(), "sleep 30"), "/tmp");
  EXPECT_EQ(out.status, OutcomeStatus::kTimeout);
}

TEST(RunJobIsolatedTest, ARunnerThatExitsWithoutAnOutcomeIsACrash) {
  auto dir = TempDir::Create("/tmp", "fusor-fake-");
  JobOutcome out =
      RunJobIsolated(Spec(JobKind::kCandidate, "m=8 / - / -"), FakeRunner(dir->path(), "echo oops; exit 4"), "/tmp");
  EXPECT_EQ(out.status, OutcomeStatus::kCrash);
  EXPECT_THAT(out.error, HasSubstr("oops"));
}

}  // namespace
}  // namespace fusor::worker
