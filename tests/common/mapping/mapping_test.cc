#include "common/mapping/mapping.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/ir/parse.h"

namespace fusor::mapping {
namespace {

using ::testing::HasSubstr;

const hw::Intrinsic& Wmma16() { return *hw::FindIntrinsic("wmma.m16n16k16.f16"); }

struct Op {
  ir::Chain chain;
  SoftwareOp sw;
};

Op Parse(const std::string& text) {
  auto chain = ir::ParseChainText(text);
  EXPECT_TRUE(chain.ok()) << chain.status();
  auto sw = ViewOp(*chain, 0);
  EXPECT_TRUE(sw.ok()) << sw.status();
  return {*chain, *sw};
}

constexpr char kConv2d[] = R"(
dim n=2 k=32 p=14 q=14 c=16 r=3 s=3 y=29 x=29
in I[n,c,y,x] W[k,c,r,s]
O[n,k,p,q] = sum(c,r,s) I[n,c,p*2+r,q*2+s] * W[k,c,r,s]
out O
)";

Mapping Make(const Op& op, const char* i, const char* j, const char* k) {
  auto m = ParseMapping(absl::StrCat("wmma.m16n16k16.f16[i=", i, " j=", j, " k=", k, "]"), op.chain);
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

TEST(MappingTest, Conv2dHasSevenBasicMatchingsAndThirtyFiveMappings) {
  Op op = Parse(kConv2d);
  MappingSet set = GenerateMappings(op.chain, op.sw, Wmma16());
  EXPECT_EQ(set.kind_compatible, 4 * 3 * 3);  // i, j from n, k, p, q (ordered, distinct); k from c, r, s
  EXPECT_EQ(set.basic.size(), 7u);
  EXPECT_EQ(set.mappings.size(), 35u);
}

TEST(MappingTest, GemmHasExactlyOneMapping) {
  Op op = Parse("dim m=64 n=64 k=64\nin A[m,k] B[k,n]\nC[m,n] = sum(k) A[m,k] * B[k,n]\nout C");
  MappingSet set = GenerateMappings(op.chain, op.sw, Wmma16());
  ASSERT_EQ(set.mappings.size(), 1u);
  EXPECT_EQ(MappingToText(set.mappings[0], op.chain), "wmma.m16n16k16.f16[i=m j=n k=k]");
  EXPECT_TRUE(Validate(op.chain, op.sw, set.mappings[0]).strict);
}

TEST(MappingTest, BatchedGemmKeepsBatchOutside) {
  Op op = Parse("dim b=8 m=64 n=64 k=64\nin A[b,m,k] B[b,k,n]\nC[b,m,n] = sum(k) A[b,m,k] * B[b,k,n]\nout C");
  MappingSet set = GenerateMappings(op.chain, op.sw, Wmma16());
  ASSERT_EQ(set.mappings.size(), 1u);
  EXPECT_EQ(MappingToText(set.mappings[0], op.chain), "wmma.m16n16k16.f16[i=m j=n k=k]");
  Verdict batch_on_i = Validate(op.chain, op.sw, Make(op, "b", "n", "k"));
  EXPECT_FALSE(batch_on_i.valid);
  EXPECT_THAT(batch_on_i.reason, HasSubstr("B (B) varies along loop b on axis i"));
}

TEST(MappingTest, HandBuiltMappingsWithTheirReasons) {
  Op op = Parse(kConv2d);
  struct Case {
    const char *i, *j, *k;
    bool valid;
    const char* reason;
  } cases[] = {
      {"p", "k", "c", true, ""},
      {"n.p.q", "k", "c", true, ""},
      {"p", "k", "c.s", true, ""},  // s shares no dim with p
      {"p", "k", "r", false, "dim 2 of I (p*2+r) moves with axes i and k at once"},
      {"q", "k", "s", false, "dim 3 of I (q*2+s) moves with axes i and k at once"},
      {"k", "p", "c", false, "I (A) does not use loop k fused onto axis i"},
      {"p", "n", "c", false, "I (A) varies along loop n on axis j, which A does not have"},
      {"p", "n.k", "c", false, "I (A) varies along loop n on axis j"},
      {"p", "k", "-", false, "axis k of A has no loop"},
      {"c", "k", "r", false, "loop c is reduced but axis i is not"},
  };
  for (const Case& c : cases) {
    Verdict v = Validate(op.chain, op.sw, Make(op, c.i, c.j, c.k));
    EXPECT_EQ(v.valid, c.valid) << c.i << " " << c.j << " " << c.k << ": " << v.reason;
    EXPECT_THAT(v.reason, HasSubstr(c.reason));
  }
}

TEST(MappingTest, StrictModeRejectsSmallFusedExtents) {
  Op op = Parse(kConv2d);
  Verdict small = Validate(op.chain, op.sw, Make(op, "n", "k", "c"));  // n = 2 < 16
  EXPECT_TRUE(small.valid);
  EXPECT_FALSE(small.strict);
  EXPECT_DOUBLE_EQ(small.padding, 16.0 / 2);
  Verdict fused = Validate(op.chain, op.sw, Make(op, "n.p", "k", "c"));  // 28 -> 32
  EXPECT_TRUE(fused.strict);
  EXPECT_DOUBLE_EQ(fused.padding, 32.0 / 28);
}

TEST(MappingTest, DefaultMappingKeepsConvWindowLoopsOutside) {
  Op op = Parse(kConv2d);
  auto m = DefaultMapping(op.chain, op.sw, Wmma16());
  ASSERT_TRUE(m.has_value());
  // Oriented so that the result's last dim (q) is on the columns.
  EXPECT_EQ(MappingToText(*m, op.chain), "wmma.m16n16k16.f16[i=k j=n.p.q k=c swap]");
}

// The product P V written [m, h, e, b] with a batch b of one last (the
// canonical form of an attention read from a packed projection): e is the
// adjacent dim, so it goes on the columns; a swapped mapping would store
// the result a column at a time, with rows 768 floats apart.
TEST(MappingTest, DefaultMappingSkipsTrailingDimsOfOne) {
  Op op = Parse(R"(
dim b=1 h=12 m=64 n=64 e=64
in P[b,h,m,n] V[n,h,e]
O[m,h,e,b] = sum(n) P[b,h,m,n] * V[n,h,e]
out O
)");
  auto m = DefaultMapping(op.chain, op.sw, Wmma16());
  ASSERT_TRUE(m.has_value());
  EXPECT_FALSE(m->swapped) << MappingToText(*m, op.chain);
  EXPECT_THAT(MappingToText(*m, op.chain), HasSubstr(" j=e "));
}

TEST(MappingTest, NotMappable) {
  auto chain = ir::ParseChainText("dim m=8 k=8\nin A[m,k]\nS[m] = sum(k) relu(A[m,k])\nout S");
  EXPECT_TRUE(absl::IsInvalidArgument(ViewOp(*chain, 0).status()));
  auto gemv = Parse("dim m=64 k=64\nin A[m,k] x[k]\ny[m] = sum(k) A[m,k] * x[k]\nout y");
  EXPECT_TRUE(GenerateMappings(gemv.chain, gemv.sw, Wmma16()).mappings.empty());  // no loop for j
}

TEST(IntrinsicRegistryTest, TargetsGetTheirIntrinsics) {
  hw::TargetDesc avx512;
  avx512.isa_features = {"avx512f", "avx2", "fma"};
  avx512.vector_lanes_f32 = 16;
  std::vector<const hw::Intrinsic*> cpu = hw::IntrinsicsFor(avx512);
  ASSERT_GE(cpu.size(), 3u);
  EXPECT_EQ(cpu[0]->name, "fma.avx512.8x32");
  hw::TargetDesc h100;
  h100.backend = hw::Backend::kCuda;
  h100.arch = "sm_90";
  std::vector<std::string> names;
  for (const hw::Intrinsic* x : hw::IntrinsicsFor(h100)) names.push_back(x->name);
  EXPECT_THAT(names, ::testing::IsSupersetOf({"mma.sync.m16n8k16.f16", "mma.sync.m16n8k16.bf16",
                                              "mma.sync.m16n8k8.tf32", "wmma.m16n16k16.f16", "wmma.m32n8k16.f16",
                                              "wmma.m8n32k16.f16", "wgmma.m64n128k16.f16"}));
  h100.arch = "sm_80";
  for (const hw::Intrinsic* x : hw::IntrinsicsFor(h100)) EXPECT_THAT(x->name, ::testing::Not(HasSubstr("wgmma")));
}

}  // namespace
}  // namespace fusor::mapping
