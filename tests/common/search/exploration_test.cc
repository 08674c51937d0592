// Every schedule the exploration proposes for the chains in examples/ (not
// only the best one) compiles and validates on the CPU backend.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "common/codegen/cpu/cpu_codegen.h"
#include "common/ir/parse.h"
#include "common/search/search_strategy.h"
#include "worker/cpu/compiler.h"
#include "worker/cpu/measure.h"
#include "common/util/process.h"
#include "tests/test_targets.h"

namespace fusor::search {
namespace {

hw::TargetDesc Target() {
  hw::TargetDesc t = testing::Avx2Target();
  t.l1d_bytes = 32 << 10;
  t.l2_bytes = 1 << 20;
  t.bandwidth_bytes_per_s = 20e9;
  t.peak_flops = 200e9;
  return t;
}

class ExplorationTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ExplorationTest, EveryProposedScheduleCompilesAndValidates) {
  std::ifstream in(std::string(FUSOR_SOURCE_DIR) + "/examples/" + GetParam());
  std::stringstream text;
  text << in.rdbuf();
  auto chain = ir::ParseChain(text.str());
  ASSERT_TRUE(chain.ok()) << chain.status();
  auto strategy = MakeMcfuserSearch();
  ASSERT_TRUE(strategy->Initialize({&*chain, Target(), 6}).ok());
  int checked = 0;
  for (int round = 0; round < 10 && !strategy->Done(); ++round) {
    std::vector<CandidateSpec> batch = strategy->NextBatch(3);
    std::vector<MeasuredResult> results;
    for (const CandidateSpec& c : batch) {
      SCOPED_TRACE(c.schedule_text);
      auto nest = space::BuildLoopNest(*chain, c.schedule, Target());
      ASSERT_TRUE(nest.ok()) << nest.status();
      auto kernel = codegen::EmitCpuFusedKernel(*chain, *nest, c.schedule_text, c.mapping);
      ASSERT_TRUE(kernel.ok());
      auto dir = TempDir::Create("/tmp", "fusor-explore-");
      worker::CompileOutcome compiled = worker::CompileKernel(*kernel, dir->path(), "c++", 300);
      ASSERT_TRUE(compiled.ok) << compiled.error;
      auto loaded = worker::LoadedKernel::Open(compiled.so_path, kernel->entry_point);
      ASSERT_TRUE(loaded.ok());
      auto v = worker::ValidateKernel(*loaded, *chain, 11 + checked, 2);
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_TRUE(v->ok) << v->detail;
      ++checked;
      // Pretend the model was a little optimistic, so the search goes on.
      results.push_back({c.schedule_text, true, c.prediction.t_estm_s * (1.2 + 0.1 * checked)});
    }
    strategy->NotifyResults(results);
  }
  EXPECT_EQ(checked, 6);
}

INSTANTIATE_TEST_SUITE_P(Examples, ExplorationTest,
                         ::testing::Values("bert_base_attention.fusor", "gemm_chain.fusor", "gemm_chain.json",
                                           "bert_large_attention_f16.fusor", "bert_ffn_gelu.fusor",
                                           "conv_chain.fusor", "conv1x1_chain.fusor"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace fusor::search
