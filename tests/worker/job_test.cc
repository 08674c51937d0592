// The worker's isolation and measurement: children that crash or hang end
// alone, validation catches wrong kernels, a real candidate is measured.
#include "worker/job.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/ir/parse.h"
#include "worker/cpu/compiler.h"
#include "worker/cpu/measure.h"
#include "worker/process.h"

namespace fusor::worker {
namespace {

using ::testing::HasSubstr;

std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return std::string(buf, n > 0 ? n : 0);
}

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

TEST(ProcessTest, KillsAHangingChildAndItsGroupAtTheTimeout) {
  auto r = RunProcess({"sh", "-c", "sleep 30 & sleep 30"}, "", 0.3);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->timed_out);
  EXPECT_LT(r->seconds, 5);
}

TEST(ProcessTest, ReportsSignalsAndExitCodes) {
  auto crash = RunProcess({"sh", "-c", "kill -SEGV $$"}, "", 10);
  ASSERT_TRUE(crash.ok());
  EXPECT_TRUE(crash->signaled);
  EXPECT_EQ(crash->signal, SIGSEGV);
  auto code = RunProcess({"sh", "-c", "exit 7"}, "", 10);
  EXPECT_EQ(code->exit_code, 7);
  auto missing = RunProcess({"/nonexistent/binary"}, "", 1);
  EXPECT_FALSE(missing.ok());
}

TEST(RunJobIsolatedTest, MeasuresARealCandidate) {
  JobOutcome out = RunJobIsolated(Spec(JobKind::kCandidate, "block[m=8] n=32"), SelfExe(), "/tmp");
  ASSERT_EQ(out.status, OutcomeStatus::kOk) << out.error;
  EXPECT_GE(out.samples_s.size(), 3u);
  EXPECT_GT(out.median_s, 0);
  EXPECT_LT(out.max_rel_error, 1e-4);
  EXPECT_GT(out.code_bytes, 0);
  EXPECT_THAT(out.compile_flags, HasSubstr("-O3"));
}

TEST(RunJobIsolatedTest, MeasuresTheBaseline) {
  JobOutcome out = RunJobIsolated(Spec(JobKind::kBaseline, ""), SelfExe(), "/tmp");
  ASSERT_EQ(out.status, OutcomeStatus::kOk) << out.error;
  EXPECT_THAT(out.compile_flags, HasSubstr("-lopenblas"));
}

TEST(RunJobIsolatedTest, ABadScheduleIsACompileError) {
  JobOutcome out = RunJobIsolated(Spec(JobKind::kCandidate, "block[k=4]"), SelfExe(), "/tmp");
  EXPECT_EQ(out.status, OutcomeStatus::kCompileError);
  EXPECT_THAT(out.error, HasSubstr("cannot be a block dim"));
}

TEST(RunJobIsolatedTest, ACrashingRunnerIsRecordedAsACrash) {
  auto dir = TempDir::Create("/tmp", "fusor-fake-");
  JobOutcome out = RunJobIsolated(Spec(JobKind::kCandidate, "block[m=8]"), FakeRunner(dir->path(), "kill -SEGV $$"),
                                  "/tmp");
  EXPECT_EQ(out.status, OutcomeStatus::kCrash);
  EXPECT_THAT(out.error, HasSubstr("signal 11"));
}

TEST(RunJobIsolatedTest, AHangingRunnerIsKilledAtTheTimeout) {
  auto dir = TempDir::Create("/tmp", "fusor-fake-");
  JobSpec spec = Spec(JobKind::kCandidate, "block[m=8]");
  spec.compile_timeout_s = 0.2;
  spec.run_timeout_s = 0.2;
  JobOutcome out = RunJobIsolated(spec, FakeRunner(dir->path(), "sleep 30"), "/tmp");
  EXPECT_EQ(out.status, OutcomeStatus::kTimeout);
}

TEST(RunJobIsolatedTest, ARunnerThatExitsWithoutAnOutcomeIsACrash) {
  auto dir = TempDir::Create("/tmp", "fusor-fake-");
  JobOutcome out =
      RunJobIsolated(Spec(JobKind::kCandidate, "block[m=8]"), FakeRunner(dir->path(), "echo oops; exit 4"), "/tmp");
  EXPECT_EQ(out.status, OutcomeStatus::kCrash);
  EXPECT_THAT(out.error, HasSubstr("oops"));
}

// A kernel written by hand so that it is wrong in a known way.
Validation ValidateSource(const std::string& body) {
  codegen::KernelSource k;
  k.source = "#include <math.h>\n#include <stdint.h>\nextern \"C\" int fusor_run(const void* const* in, void* const* out, "
             "int) {\n  const float* a = (const float*)in[0];\n  float* o = (float*)out[0];\n" +
             body + "\n  return 0;\n}\n";
  k.compile_flags = {"-O1"};
  auto dir = TempDir::Create("/tmp", "fusor-validate-");
  CompileOutcome c = CompileKernel(k, dir->path(), "c++", 60);
  EXPECT_TRUE(c.ok) << c.error;
  auto loaded = LoadedKernel::Open(c.so_path, "fusor_run");
  EXPECT_TRUE(loaded.ok());
  auto chain = ir::ParseChainText("dim m=64\nin A[m]\nO[m] = relu(A[m]) * 2\nout O");
  auto v = ValidateKernel(*loaded, *chain, 3, 1);
  EXPECT_TRUE(v.ok());
  return *v;
}

TEST(ValidateKernelTest, AcceptsACorrectKernel) {
  Validation v = ValidateSource("for (int i = 0; i < 64; ++i) o[i] = (a[i] > 0 ? a[i] : 0) * 2;");
  EXPECT_TRUE(v.ok) << v.detail;
}

TEST(ValidateKernelTest, RejectsWrongUnwrittenAndNanOutputs) {
  Validation wrong = ValidateSource("for (int i = 0; i < 64; ++i) o[i] = (a[i] > 0 ? a[i] : 0) * 2.01f;");
  EXPECT_FALSE(wrong.ok);
  EXPECT_THAT(wrong.detail, HasSubstr("output 'O' element"));
  // Skipping the last element leaves the poison in place.
  EXPECT_FALSE(ValidateSource("for (int i = 0; i < 63; ++i) o[i] = (a[i] > 0 ? a[i] : 0) * 2;").ok);
  EXPECT_FALSE(ValidateSource("for (int i = 0; i < 64; ++i) o[i] = NAN;").ok);
}

}  // namespace
}  // namespace fusor::worker
