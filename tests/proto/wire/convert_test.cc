#include "proto/wire/convert.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/ir/canonical.h"
#include "common/ir/parse.h"

namespace fusor::wire {
namespace {

using ::testing::HasSubstr;

constexpr char kText[] = R"(
chain attn
dtype bf16
dim b=2 m=8 n=8 k=4 h=4
in Q[b,m,k] K[b,n,k] V[b,n,h] M[m,n]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.5
P[b,m,n] = softmax(n) S[b,m,n] + M[m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)";

TEST(ConvertTest, StructuredChainAndTextGiveTheSameChain) {
  auto chain = ir::ParseChainText(kText);
  ASSERT_TRUE(chain.ok());
  v1::Workload structured;
  *structured.mutable_chain() = ChainToProto(*chain);
  auto back = ChainFromWorkload(structured);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ir::ChainToText(*back), ir::ChainToText(*chain));
  v1::Workload text;
  text.set_text(kText);
  EXPECT_EQ(ir::Canonicalize(*ChainFromWorkload(text)).key, ir::Canonicalize(*back).key);
  // Constant inputs travel too.
  std::string with_const = kText;
  with_const.insert(with_const.find("S[b,m,n]"), "const M\n");
  text.set_text(with_const);
  auto constant = ChainFromWorkload(text);
  ASSERT_TRUE(constant.ok()) << constant.status();
  *structured.mutable_chain() = ChainToProto(*constant);
  EXPECT_TRUE(structured.chain().inputs(3).constant());
  EXPECT_EQ(ir::ChainToText(*ChainFromWorkload(structured)), ir::ChainToText(*constant));
}

TEST(ConvertTest, ErrorsNameTheField) {
  v1::Workload w;
  *w.mutable_chain() = ChainToProto(*ir::ParseChainText(kText));
  w.mutable_chain()->mutable_ops(1)->set_expr("S[b,m,n] + M[m,x]");
  absl::Status st = ChainFromWorkload(w).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_THAT(std::string(st.message()), HasSubstr("chain.ops[1].expr, column 16: unknown dim 'x'"));
  w.mutable_chain()->mutable_dims(0)->set_extent(-3);
  EXPECT_THAT(std::string(ChainFromWorkload(w).status().message()), HasSubstr("chain.dims[0]: dim 'b' has extent -3"));
  EXPECT_TRUE(absl::IsInvalidArgument(ChainFromWorkload(v1::Workload()).status()));
}

TEST(ConvertTest, TargetsRoundTripWithAStableFingerprint) {
  hw::TargetDesc t;
  t.arch = "x86-64-avx2";
  t.device_name = "cpu";
  t.compute_units = 8;
  t.vector_lanes_f32 = 8;
  t.isa_features = {"fma", "avx2"};
  t.l2_bytes = 1 << 20;
  t.compiler = "g++ 12";
  t.bandwidth_bytes_per_s = 1e10;
  v1::Target p = TargetToProto(t);
  EXPECT_EQ(p.fingerprint(), hw::TargetFingerprint(t));
  hw::TargetDesc back = TargetFromProto(p);
  EXPECT_EQ(hw::TargetFingerprint(back), p.fingerprint());
  back.bandwidth_bytes_per_s = 2e10;  // calibration does not change identity
  EXPECT_EQ(hw::TargetFingerprint(back), p.fingerprint());
  back.compiler = "g++ 13";
  EXPECT_NE(hw::TargetFingerprint(back), p.fingerprint());
}

TEST(ConvertTest, TargetTextIsTheProtosJsonAndRoundTripsExactly) {
  hw::TargetDesc t;
  t.backend = hw::Backend::kCuda;
  t.arch = "sm_90";
  t.device_name = "NVIDIA H200";
  t.compute_units = 132;
  t.isa_features = {"mma.sync", "ldmatrix"};
  t.l2_bytes = int64_t{50} << 20;
  t.shared_mem_per_block = 232448;
  t.compiler = "nvrtc 13.0";
  t.bandwidth_bytes_per_s = 4.0123456789012345e12;
  t.peak_flops = 7.56e14 / 3;
  const std::string json = TargetToJson(t).value();
  EXPECT_THAT(json, HasSubstr("\"backend\":\"BACKEND_CUDA\""));
  EXPECT_THAT(json, HasSubstr(absl::StrCat("\"fingerprint\":\"", hw::TargetFingerprint(t), "\"")));
  EXPECT_THAT(json, HasSubstr("\"l1dBytes\":\"0\""));  // every field printed
  absl::StatusOr<hw::TargetDesc> back = TargetFromJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->backend, t.backend);
  EXPECT_EQ(back->isa_features, t.isa_features);
  EXPECT_EQ(back->shared_mem_per_block, t.shared_mem_per_block);
  EXPECT_EQ(back->bandwidth_bytes_per_s, t.bandwidth_bytes_per_s);  // exactly
  EXPECT_EQ(back->peak_flops, t.peak_flops);
  EXPECT_EQ(TargetToJson(*back).value(), json);

  // Field names as the .proto spells them read too.
  auto snake = TargetFromJson(R"({"backend": "BACKEND_CPU", "arch": "x86-64", "compute_units": 2})");
  ASSERT_TRUE(snake.ok()) << snake.status();
  EXPECT_EQ(snake->compute_units, 2);
  for (const char* bad : {"", "{", "[]", R"({"backend": "BACKEND_TPU"})", R"({"computeUnits": "many"})"}) {
    EXPECT_TRUE(absl::IsDataLoss(TargetFromJson(bad).status())) << bad;
  }
}

}  // namespace
}  // namespace fusor::wire
