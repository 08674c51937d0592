// compile --model-only: the best-ranked candidate that compiles, written
// with its metadata marked unmeasured.
#include "client/model_only.h"

#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/util/files.h"
#include "common/codegen/cuda/nvrtc.h"
#include "common/ir/parse.h"
#include "common/util/process.h"

namespace fusor::client {
namespace {

std::string Read(const std::string& path) { return ReadFile(path).value_or(""); }

TEST(ModelOnlyTest, GpuTargetsByNameOrArch) {
  EXPECT_EQ(GpuTarget("h100")->arch, "sm_90");
  EXPECT_EQ(GpuTarget("sm_80")->arch, "sm_80");
  EXPECT_EQ(GpuTarget("sm_89")->backend, hw::Backend::kCuda);
  auto bad = GpuTarget("sm_42");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("h100"), std::string::npos);
}

TEST(ModelOnlyTest, WritesTheTopCandidateUnmeasured) {
  const bool have_nvrtc = codegen::Nvrtc::Get() != nullptr;
  for (const char* example : {"bert_large_attention_f16", "gemm_chain"}) {
    SCOPED_TRACE(example);
    auto chain = ir::ParseChainText(Read(std::string(FUSOR_SOURCE_DIR) + "/examples/" + example + ".fusor"));
    ASSERT_TRUE(chain.ok()) << chain.status();
    auto dir = TempDir::Create("/tmp", "fusor-model-only-test-");
    ASSERT_TRUE(dir.ok());
    auto out = CompileModelOnly(*chain, *GpuTarget("h100"), example, dir->path());
    if (!have_nvrtc) {
      EXPECT_TRUE(absl::IsFailedPrecondition(out.status()));
      EXPECT_TRUE(std::filesystem::exists(dir->path() + "/" + example + ".cu"));
      continue;
    }
    ASSERT_TRUE(out.ok()) << out.status();
    const std::string base = dir->path() + "/" + example;
    EXPECT_GT(Read(base + ".cubin").size(), 1000u);
    EXPECT_NE(Read(base + ".cu").find(out->schedule), std::string::npos);
    EXPECT_TRUE(std::filesystem::exists(dir->path() + "/fusor_device.h"));
    nlohmann::json meta = nlohmann::json::parse(Read(base + ".json"));
    EXPECT_TRUE(meta["unmeasured"].get<bool>());
    EXPECT_EQ(meta["schedule"], out->schedule);
    EXPECT_EQ(meta["target"]["arch"], "sm_90");
    EXPECT_GT(meta["kernel"]["grid"].get<int64_t>(), 0);
    EXPECT_GT(meta["compiler"]["registers"].get<int>(), 0);
    EXPECT_EQ(meta["compiler"]["spill_store_bytes"].get<int>(), 0);
    EXPECT_GT(out->predicted_s, 0);
  }
}

TEST(ModelOnlyTest, CpuTargetsWriteCppSource) {
  auto chain = ir::ParseChainText(Read(std::string(FUSOR_SOURCE_DIR) + "/examples/gemm_chain.fusor"));
  ASSERT_TRUE(chain.ok());
  hw::TargetDesc cpu;
  cpu.compute_units = 4;
  cpu.vector_lanes_f32 = 8;
  cpu.isa_features = {"avx2", "fma"};
  auto dir = TempDir::Create("/tmp", "fusor-model-only-test-");
  ASSERT_TRUE(dir.ok());
  auto out = CompileModelOnly(*chain, cpu, "gemm_chain", dir->path());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NE(Read(dir->path() + "/gemm_chain.cc").find("fusor_run"), std::string::npos);
  EXPECT_TRUE(nlohmann::json::parse(Read(dir->path() + "/gemm_chain.json"))["unmeasured"].get<bool>());
}

}  // namespace
}  // namespace fusor::client
