#include "worker/cpu/measure.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <thread>

#include "common/ir/parse.h"
#include "common/util/quiet.h"
#include "common/ir/reference.h"
#include "common/space/loop_nest.h"
#include "common/space/schedule.h"
#include "tests/test_chains.h"
#include "absl/strings/str_cat.h"
#include "worker/cpu/compiler.h"
#include "worker/cpu/cpu_target.h"
#include "common/util/process.h"

namespace fusor::worker {
namespace {

using ::testing::HasSubstr;

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

// A worker compiles the preamble every emitted kernel starts with once,
// as a precompiled header: the kernel includes it instead, and validates.
TEST(CompileKernelTest, IncludesThePrecompiledPreambleOnceBuilt) {
  auto chain = ir::ParseChainText(testing::kGemmChain);
  ASSERT_TRUE(chain.ok());
  auto work = TempDir::Create("/tmp", "fusor-pch-");
  ASSERT_TRUE(work.ok());
  auto cpu = DescribeCpu("c++", work->path());  // this machine: the kernel is built for it
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const std::string schedule = "m=16 / n=16 / -";
  auto nest = space::BuildLoopNest(*chain, *space::ParseSchedule(schedule, *chain), *cpu);
  ASSERT_TRUE(nest.ok()) << nest.status();
  auto kernel = codegen::EmitCpuFusedKernel(*chain, *nest, schedule, "m");
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  const std::string pch = work->path() + "/preamble";
  std::filesystem::file_time_type built;
  for (int round = 0; round < 2; ++round) {
    const std::string dir = absl::StrCat(work->path(), "/k", round);
    std::filesystem::create_directories(dir);
    CompileOutcome c = CompileKernel(*kernel, dir, "c++", 120, "", pch);
    ASSERT_TRUE(c.ok) << c.error;
    std::ifstream in(dir + "/kernel.cc");
    const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_THAT(written, HasSubstr("#include \"" + pch + "/fusor_preamble_"));
    EXPECT_EQ(written.find("#include <immintrin.h>"), std::string::npos);
    std::ifstream log(dir + "/compile.log");
    const std::string said((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_EQ(said, "") << "the precompiled header is used";
    std::vector<std::filesystem::path> gch;
    for (const auto& e : std::filesystem::directory_iterator(pch)) {
      if (e.path().extension() == ".gch") gch.push_back(e.path());
    }
    ASSERT_EQ(gch.size(), 1u);
    if (round == 0) built = std::filesystem::last_write_time(gch[0]);
    EXPECT_EQ(std::filesystem::last_write_time(gch[0]), built) << "built once";
    auto loaded = LoadedKernel::Open(c.so_path, "fusor_run");
    ASSERT_TRUE(loaded.ok());
    auto v = ValidateKernel(*loaded, *chain, 5, 1);
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(v->ok) << v->detail;
  }
  // A compiler that cannot build the header compiles the kernel as
  // written, and is asked for the header once.
  const std::string fussy = work->path() + "/fussy-c++";
  {
    std::ofstream script(fussy);
    script << "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = c++-header ] && echo x >> \"$0.tries\" && exit 1; done\n"
           << "exec c++ \"$@\"\n";
  }
  std::filesystem::permissions(fussy, std::filesystem::perms::owner_all);
  for (int round = 0; round < 2; ++round) {
    const std::string dir = absl::StrCat(work->path(), "/f", round);
    std::filesystem::create_directories(dir);
    CompileOutcome c = CompileKernel(*kernel, dir, fussy, 120, "", pch);
    ASSERT_TRUE(c.ok) << c.error;
    std::ifstream in(dir + "/kernel.cc");
    EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), kernel->source);
  }
  std::ifstream tries(fussy + ".tries");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(tries)), std::istreambuf_iterator<char>()), "x\n");

  // A source without the preamble compiles as written.
  codegen::KernelSource plain;
  plain.source = "extern \"C\" int fusor_plain() { return 1; }\n";
  CompileOutcome c = CompileKernel(plain, work->path(), "c++", 60, "", pch);
  ASSERT_TRUE(c.ok) << c.error;
  std::ifstream in(work->path() + "/kernel.cc");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), plain.source);
}

// A worker keeps what it compiled: the same kernel again is copied from
// the object cache (a confirmation compiles its candidate again); another
// source or other flags compile.
TEST(CompileKernelTest, CopiesAKernelCompiledBeforeFromTheObjectCache) {
  auto cache = TempDir::Create("/tmp", "fusor-objects-");
  ASSERT_TRUE(cache.ok());
  const std::string objects = cache->path() + "/objects";
  codegen::KernelSource k;
  k.source = "extern \"C\" int fusor_answer() { return 42; }\n";
  k.compile_flags = {"-O1"};
  auto compile = [&](const codegen::KernelSource& kernel, int answer) {
    auto dir = TempDir::Create("/tmp", "fusor-compile-");
    CompileOutcome c = CompileKernel(kernel, dir->path(), "c++", 60, "", "", objects);
    EXPECT_TRUE(c.ok) << c.error;
    auto loaded = LoadedKernel::Open(c.so_path, "fusor_answer");
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    if (loaded.ok()) EXPECT_EQ(reinterpret_cast<int (*)()>(loaded->Symbol("fusor_answer"))(), answer);
    return c;
  };
  CompileOutcome first = compile(k, 42);
  EXPECT_FALSE(first.cached);
  EXPECT_GT(first.seconds, 0);
  CompileOutcome again = compile(k, 42);
  EXPECT_TRUE(again.cached);
  EXPECT_EQ(again.seconds, 0);
  EXPECT_EQ(again.code_bytes, first.code_bytes);
  EXPECT_EQ(again.flags, first.flags);
  codegen::KernelSource other = k;
  other.compile_flags = {"-O2"};
  EXPECT_FALSE(compile(other, 42).cached);
  other = k;
  other.source = "extern \"C\" int fusor_answer() { return 7; }  // another\n";
  EXPECT_FALSE(compile(other, 7).cached);
  EXPECT_TRUE(compile(other, 7).cached);
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

// A reference other than the float64 interpreter (the GPU path's, run on
// the device): the check uses it, and refuses one of the wrong shape.
TEST(ValidateRunTest, ChecksAgainstAGivenReference) {
  auto chain = ir::ParseChainText("dim m=8\nin A[m]\nO[m] = A[m] * 2\nout O");
  ASSERT_TRUE(chain.ok());
  auto doubling = [](const void* const* in, void* const* out) {
    for (int i = 0; i < 8; ++i) static_cast<float*>(out[0])[i] = 2 * static_cast<const float*>(in[0])[i];
    return 0;
  };
  auto times = [](double factor) {
    return [factor](const std::vector<std::vector<double>>& in) -> absl::StatusOr<Outputs> {
      Outputs out(1);
      for (double x : in[0]) out[0].push_back(factor * x);
      return out;
    };
  };
  const auto inputs = RandomInputs(*chain, 5);
  auto right = ValidateRun(doubling, *chain, inputs, 0, times(2));
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_TRUE(right->ok) << right->detail;
  auto wrong = ValidateRun(doubling, *chain, inputs, 0, times(3));
  ASSERT_TRUE(wrong.ok());
  EXPECT_FALSE(wrong->ok);
  auto short_reference = ValidateRun(doubling, *chain, inputs, 0,
                                     [](const std::vector<std::vector<double>>&) -> absl::StatusOr<Outputs> {
                                       return Outputs{{1.0}};
                                     });
  EXPECT_FALSE(short_reference.ok());
}

// LLaMA-7B's FFN in f16: with every input uniform in [-1, 1] its output
// (~3e4 typical) overflowed f16, so every candidate and the baseline were
// "invalid". Scaled as weights are, it stays well inside the range while
// short sums (attention's 64) keep their unit-sized inputs.
TEST(RandomInputsTest, LongSumsStayInTheF16Range) {
  auto chain = ir::ParseChainText(R"(chain llama_ffn
dtype f16
dim t=1 c=4096 f=11008 o=4096
in X[t,c] WG[c,f] WU[c,f] WD[f,o]
G[t,f] = sum(c) X[t,c] * WG[c,f]
U[t,f] = sum(c) X[t,c] * WU[c,f]
A[t,f] = G[t,f] * sigmoid(G[t,f]) * U[t,f]
Y[t,o] = sum(f) A[t,f] * WD[f,o]
out Y)");
  ASSERT_TRUE(chain.ok()) << chain.status();
  const auto inputs = RandomInputs(*chain, 11);
  auto max_abs = [](const std::vector<double>& v) {
    double m = 0;
    for (double x : v) m = std::max(m, std::abs(x));
    return m;
  };
  EXPECT_GT(max_abs(inputs[0]), 0.9);  // X: not reduced last, unscaled
  EXPECT_LT(max_abs(inputs[1]), 1 / std::sqrt(4096.0) + 1e-12);
  EXPECT_LT(max_abs(inputs[3]), 1 / std::sqrt(11008.0) + 1e-12);
  auto out = ir::EvaluateReference(*chain, inputs);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_GT(max_abs((*out)[0]), 1e-3);
  EXPECT_LT(max_abs((*out)[0]), 100);

  auto attention = ir::ParseChainText(
      "dim m=8 n=8 k=64\nin Q[m,k] K[n,k]\nS[m,n] = sum(k) Q[m,k] * K[n,k]\nout S");
  ASSERT_TRUE(attention.ok());
  EXPECT_GT(max_abs(RandomInputs(*attention, 11)[1]), 0.9);
}

TEST(TimeKernelTest, KeepsEverySampleWithinTheRepeatBounds) {
  codegen::KernelSource k;
  k.source = "extern \"C\" int fusor_run(const void* const*, void* const* out, int) { ((float*)out[0])[0] = 1; return 0; }\n";
  k.compile_flags = {"-O1"};
  auto dir = TempDir::Create("/tmp", "fusor-time-");
  CompileOutcome c = CompileKernel(k, dir->path(), "c++", 60);
  ASSERT_TRUE(c.ok) << c.error;
  auto loaded = LoadedKernel::Open(c.so_path, "fusor_run");
  auto chain = ir::ParseChainText("dim m=1\nin A[m]\nO[m] = A[m]\nout O");
  TimingOptions options;
  options.min_repeats = 12;
  options.max_repeats = 14;
  options.time_budget_s = 10;
  options.max_spread = 1e9;  // a nanosecond kernel's samples spread; this checks the bounds
  auto t = TimeKernelsTogether({&*loaded}, *chain, options);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->at(0).samples_s.size(), 14u);
  EXPECT_DOUBLE_EQ(t->at(0).median_s, Summarize(t->at(0).samples_s).median);
  EXPECT_EQ(t->at(0).sets, 1);
  // Fewer than kMinSamples are never taken: percentiles need them.
  options.min_repeats = options.max_repeats = 3;
  t = TimeKernelsTogether({&*loaded}, *chain, options);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(static_cast<int>(t->at(0).samples_s.size()), kMinSamples);
}

TEST(TimeKernelTest, KernelsTimedTogetherTakeTurnsInSlices) {
  // Each kernel appends its name to a shared log at every call.
  codegen::KernelSource k;
  k.source =
      "#include <cstdio>\n"
      "extern \"C\" int fusor_run(const void* const*, void* const*, int) {\n"
      "  if (FILE* f = std::fopen(LOG, \"a\")) { std::fputs(NAME, f); std::fclose(f); }\n"
      "  return 0;\n}\n";
  auto dir = TempDir::Create("/tmp", "fusor-together-");
  ASSERT_TRUE(dir.ok());
  const std::string log = dir->path() + "/calls";
  std::vector<LoadedKernel> loaded;
  for (const std::string name : {"a", "b"}) {
    k.compile_flags = {"-O1", "-DLOG=\"" + log + "\"", "-DNAME=\"" + name + "\""};
    auto sub = TempDir::Create(dir->path(), "k-");
    ASSERT_TRUE(sub.ok());
    CompileOutcome c = CompileKernel(k, sub->path(), "c++", 60);
    ASSERT_TRUE(c.ok) << c.error;
    auto kernel = LoadedKernel::Open(c.so_path, "fusor_run");
    ASSERT_TRUE(kernel.ok());
    loaded.push_back(std::move(*kernel));
  }
  auto chain = ir::ParseChainText("dim m=1\nin A[m]\nO[m] = A[m]\nout O");
  TimingOptions options;
  options.warmup = 1;
  options.min_repeats = options.max_repeats = 16;
  options.time_budget_s = 10;
  options.max_spread = 1e9;
  auto t = TimeKernelsTogether({&loaded[0], &loaded[1]}, *chain, options);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  for (const TrustedTiming& timing : *t) EXPECT_EQ(timing.samples_s.size(), 16u);
  // 8 slices, each warm-up calls (at least one, for at least a millisecond) and 2 samples per kernel, in turn.
  std::string calls;
  std::getline(std::ifstream(log), calls);
  EXPECT_TRUE(std::regex_match(calls, std::regex("(a{3,}b{3,}){8}"))) << calls;
}

}  // namespace
}  // namespace fusor::worker

namespace fusor::worker {
namespace {

// A serving process's counters (common/util/quiet.h), written here as fusor.torch writes them.
struct Counters {
  std::string path;
  uint64_t values[2] = {0, 0};  // running, started
  // In place, as an mmap is written: truncating a file a reader has mapped would fault its reads.
  void Write() const {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    if (!f) f.open(path, std::ios::out | std::ios::binary);
    f.write(reinterpret_cast<const char*>(values), 16);
  }
};

TEST(QuietGateTest, WaitsForRequestsToEndAndCountsThoseStarted) {
  auto dir = TempDir::Create("/tmp", "fusor-quiet-");
  ASSERT_TRUE(dir.ok());
  Counters c{dir->path() + "/requests"};
  c.values[0] = 1;
  c.values[1] = 5;
  c.Write();
  absl::StatusOr<QuietGate> gate = QuietGate::Open(c.path);
  ASSERT_TRUE(gate.ok()) << gate.status();
  EXPECT_EQ(gate->Running(), 1u);
  EXPECT_EQ(gate->Started(), 5u);
  EXPECT_FALSE(gate->WaitQuiet(0.02));  // a request runs: not quiet within the wait
  std::thread end([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    c.values[0] = 0;
    c.Write();
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(gate->WaitQuiet(5));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(40));
  end.join();
  EXPECT_FALSE(QuietGate::Open(dir->path() + "/missing").ok());
}

TEST(QuietGateTest, KernelsAreTimedBetweenRequests) {
  codegen::KernelSource k;
  k.source = "extern \"C\" int fusor_run(const void* const*, void* const*, int) { return 0; }\n";
  k.compile_flags = {"-O1"};
  auto dir = TempDir::Create("/tmp", "fusor-quiet-");
  ASSERT_TRUE(dir.ok());
  CompileOutcome compiled = CompileKernel(k, dir->path(), "c++", 60);
  ASSERT_TRUE(compiled.ok) << compiled.error;
  auto kernel = LoadedKernel::Open(compiled.so_path, "fusor_run");
  ASSERT_TRUE(kernel.ok());
  Counters c{dir->path() + "/requests"};
  c.values[0] = 1;  // a request runs for the first 100 ms
  c.Write();
  std::thread requests([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    c.values[0] = 0;
    c.Write();
  });
  auto chain = ir::ParseChainText("dim m=1\nin A[m]\nO[m] = A[m]\nout O");
  TimingOptions options;
  options.min_repeats = options.max_repeats = 16;
  options.max_spread = 1e9;
  options.quiet_file = c.path;
  const auto t0 = std::chrono::steady_clock::now();
  auto t = TimeKernelsTogether({&*kernel}, *chain, options);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(90));
  EXPECT_EQ((*t)[0].samples_s.size(), 16u);
  requests.join();
}

}  // namespace
}  // namespace fusor::worker
