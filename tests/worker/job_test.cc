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
#include "tests/test_chains.h"
#include "tests/test_targets.h"
#include "worker/validate.h"

namespace fusor::worker {
namespace {

using ::testing::HasSubstr;

hw::TargetDesc Target() {
  hw::TargetDesc t = testing::Avx2Target();
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

// What the worker writes into job.json and the child into outcome.json
// reads back field for field.
TEST(JobJsonTest, SpecAndOutcomeRoundTripEveryField) {
  JobSpec spec = Spec(JobKind::kConfirm, "m=8 / - / -");
  spec.phase = JobPhase::kMeasure;
  spec.artifact_dir = "/art";
  spec.mapping = "C=fma[m,n]";
  spec.target.backend = hw::Backend::kCuda;
  spec.target.arch = "sm_90";
  spec.target.bandwidth_bytes_per_s = 4.8123e12;
  spec.target.peak_flops = 9.89e14 / 7;
  spec.timing.warmup = 7;
  spec.timing.num_threads = 3;
  spec.timing.seed = 99;
  spec.timing.rotate_bytes = int64_t{3} << 30;
  spec.compiler = "clang++";
  spec.seed = uint64_t{1} << 63;
  spec.device = 2;
  absl::StatusOr<std::string> json = JobSpecToJson(spec);
  ASSERT_TRUE(json.ok()) << json.status();
  absl::StatusOr<JobSpec> back = JobSpecFromJson(*json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, spec.kind);
  EXPECT_EQ(back->phase, spec.phase);
  EXPECT_EQ(back->artifact_dir, spec.artifact_dir);
  EXPECT_EQ(back->chain_json, spec.chain_json);
  EXPECT_EQ(back->schedule_text, spec.schedule_text);
  EXPECT_EQ(back->mapping, spec.mapping);
  EXPECT_EQ(hw::TargetFingerprint(back->target), hw::TargetFingerprint(spec.target));
  EXPECT_EQ(back->target.bandwidth_bytes_per_s, spec.target.bandwidth_bytes_per_s);
  EXPECT_EQ(back->target.peak_flops, spec.target.peak_flops);
  EXPECT_EQ(back->timing.warmup, 7);
  EXPECT_EQ(back->timing.min_repeats, spec.timing.min_repeats);
  EXPECT_EQ(back->timing.max_repeats, spec.timing.max_repeats);
  EXPECT_EQ(back->timing.time_budget_s, spec.timing.time_budget_s);
  EXPECT_EQ(back->timing.num_threads, 3);
  EXPECT_EQ(back->timing.seed, 99u);
  EXPECT_EQ(back->timing.rotate_bytes, spec.timing.rotate_bytes);
  EXPECT_EQ(back->timing.max_spread, spec.timing.max_spread);
  EXPECT_EQ(back->compiler, spec.compiler);
  EXPECT_EQ(back->blas_dir, spec.blas_dir);
  EXPECT_EQ(back->compile_timeout_s, spec.compile_timeout_s);
  EXPECT_EQ(back->run_timeout_s, spec.run_timeout_s);
  EXPECT_EQ(back->seed, spec.seed);
  EXPECT_EQ(back->device, 2);
  EXPECT_THAT(std::string(JobSpecFromJson("{").status().message()), HasSubstr("job spec: "));
  EXPECT_FALSE(JobSpecFromJson(R"({"kind": "candidate"})").ok());  // every field is required
  std::string unknown_phase = *json;
  unknown_phase.replace(unknown_phase.find(R"("phase":"measure")"), 17, R"("phase":"later")");
  EXPECT_THAT(std::string(JobSpecFromJson(unknown_phase).status().message()), HasSubstr("unknown name 'later'"));

  JobOutcome out;
  out.status = OutcomeStatus::kNoisy;
  out.error = "spread \xff";  // not UTF-8: replaced, not thrown
  out.samples_s = {1e-3, 3e-3};
  out.median_s = 2e-3;
  out.spread = 1;
  out.max_abs_error = 1e-7;
  out.max_rel_error = 2e-7;
  out.compile_s = 0.5;
  out.compile_flags = "-O3";
  out.code_bytes = 1234;
  out.resources_json = "{}";
  out.bandwidth_bytes_per_s = 1e10;
  out.peak_flops = 2e11;
  absl::StatusOr<JobOutcome> read = JobOutcomeFromJson(JobOutcomeToJson(out));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->status, out.status);
  EXPECT_THAT(read->error, HasSubstr("spread "));
  EXPECT_EQ(read->samples_s, out.samples_s);
  EXPECT_EQ(read->median_s, out.median_s);
  EXPECT_EQ(read->spread, out.spread);
  EXPECT_EQ(read->max_abs_error, out.max_abs_error);
  EXPECT_EQ(read->max_rel_error, out.max_rel_error);
  EXPECT_EQ(read->compile_s, out.compile_s);
  EXPECT_EQ(read->compile_flags, out.compile_flags);
  EXPECT_EQ(read->code_bytes, out.code_bytes);
  EXPECT_EQ(read->resources_json, out.resources_json);
  EXPECT_EQ(read->bandwidth_bytes_per_s, out.bandwidth_bytes_per_s);
  EXPECT_EQ(read->peak_flops, out.peak_flops);
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

// A constant input is packed once before timing; the packing's time is
// recorded apart.
TEST(RunJobIsolatedTest, ConstantInputsArePreparedOnceAndTimedApart) {
  JobSpec spec = Spec(JobKind::kCandidate, "m=8 / - / -");
  std::string text = kChain;
  text.insert(text.find("S[m,n]"), "const B\n");
  spec.chain_json = ir::ChainToJson(*ir::ParseChainText(text));
  JobOutcome out = RunJobIsolated(spec, CurrentExecutable(""), "/tmp");
  ASSERT_EQ(out.status, OutcomeStatus::kOk) << out.error;
  const nlohmann::json resources = nlohmann::json::parse(out.resources_json);
  EXPECT_GT(resources.at("prepare_s").get<double>(), 0) << out.resources_json;
  // Without the constant, nothing is prepared.
  out = RunJobIsolated(Spec(JobKind::kCandidate, "m=8 / - / -"), CurrentExecutable(""), "/tmp");
  ASSERT_EQ(out.status, OutcomeStatus::kOk) << out.error;
  EXPECT_EQ(out.resources_json.find("prepare_s"), std::string::npos) << out.resources_json;
}

// A chain with a ranged dim: one kernel validated at each of its
// ValidationSizes and timed at its TimingSizes, one request at each per
// sample; a baseline and a confirmation time each BLAS at each size.
TEST(RunJobIsolatedTest, ARangedChainIsValidatedAcrossItsRangeAndTimedAtItsSizes) {
  std::string text = kChain;
  text.replace(text.find("m=24"), 4, "m=3..24");
  const ir::Chain chain = *ir::ParseChainText(text);
  ASSERT_EQ(TimingSizes(chain), (std::vector<std::vector<int64_t>>{{24}, {8}}));
  for (JobKind kind : {JobKind::kCandidate, JobKind::kBaseline, JobKind::kConfirm}) {
    JobSpec spec = Spec(kind, kind == JobKind::kBaseline ? "" : "m=8 / - / S(n=32)");
    spec.chain_json = ir::ChainToJson(chain);
    JobOutcome out = RunJobIsolated(spec, CurrentExecutable(""), "/tmp");
    ASSERT_EQ(out.status, OutcomeStatus::kOk) << out.error;
    const nlohmann::json resources = nlohmann::json::parse(out.resources_json);
    const nlohmann::json& sizes = resources.at("sizes");
    ASSERT_EQ(sizes.size(), 2u) << out.resources_json;
    EXPECT_EQ(sizes[0].at("dims").at("m"), 24);
    EXPECT_EQ(sizes[1].at("dims").at("m"), 8);
    // A sample is a request at each size: more than either size's median.
    const std::string timed = kind == JobKind::kBaseline ? resources.at("baseline").get<std::string>() : "fused";
    for (const nlohmann::json& at : sizes) {
      EXPECT_LT(at.at("median_s").at(timed).get<double>(), out.median_s) << out.resources_json;
    }
    if (kind == JobKind::kConfirm) EXPECT_EQ(resources.at("beside").at("status"), "ok") << out.resources_json;
  }
  // A kernel wrong at one size of the range is invalid: a split schedule's
  // unfused part compiled at the largest size only cannot run the others.
  JobSpec wrong = Spec(JobKind::kCandidate, "split after S: m=8 / - / - | unfused onednn");
  wrong.chain_json = ir::ChainToJson(chain);
  JobOutcome out = RunJobIsolated(wrong, CurrentExecutable(""), "/tmp");
  EXPECT_NE(out.status, OutcomeStatus::kOk);
}

// The chain in two parts, the second through oneDNN: built, validated
// against the whole chain's reference and timed like any candidate.
TEST(RunJobIsolatedTest, MeasuresASplitCandidate) {
  JobSpec spec = Spec(JobKind::kCandidate, "split after C: m=16 / - / - | unfused onednn");
  spec.chain_json = ir::ChainToJson(*ir::ParseChainText(testing::kGemmChain));
  JobOutcome out = RunJobIsolated(spec, CurrentExecutable(""), "/tmp");
  ASSERT_EQ(out.status, OutcomeStatus::kOk) << out.error;
  EXPECT_GE(out.samples_s.size(), 3u);
  EXPECT_LT(out.max_rel_error, 1e-4);
  EXPECT_THAT(out.compile_flags, HasSubstr("-ldnnl"));
  // A part's schedule that does not fit it is the candidate's compile error.
  spec.schedule_text = "split after C: m=16 / - / E(h=8) | unfused onednn";
  out = RunJobIsolated(spec, CurrentExecutable(""), "/tmp");
  EXPECT_EQ(out.status, OutcomeStatus::kCompileError);
  EXPECT_THAT(out.error, HasSubstr("head"));
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
