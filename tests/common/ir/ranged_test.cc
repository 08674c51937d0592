// Ranged dims (ir::Dim::min): written `m=65..256`, checked, kept by every
// front end and by the canonical key, and made exact by AtSizes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/ir/canonical.h"
#include "absl/strings/str_replace.h"
#include "common/ir/parse.h"
#include "common/ir/ranges.h"
#include "proto/wire/convert.h"

namespace fusor::ir {
namespace {

using ::testing::HasSubstr;

constexpr char kRanged[] = R"(
chain ranged_attention
dtype f32
dim h=4 m=17..64 n=17..64 d=16
in  Q[m,h,d] K[n,h,d] V[n,h,d] M[n]
S[h,m,n] = sum(d) Q[m,h,d] * K[n,h,d] * 0.25
P[h,m,n] = softmax(n) S[h,m,n] + M[n]
O[m,h,d] = sum(n) P[h,m,n] * V[n,h,d]
out O
)";

TEST(RangedDimTest, ParsesTheRangeAndPlansAtItsLargestSize) {
  absl::StatusOr<Chain> chain = ParseChainText(kRanged);
  ASSERT_TRUE(chain.ok()) << chain.status();
  const Dim& m = chain->dims[chain->FindDim("m")];
  EXPECT_TRUE(m.Ranged());
  EXPECT_EQ(m.min, 17);
  EXPECT_EQ(m.extent, 64);
  EXPECT_FALSE(chain->dims[chain->FindDim("h")].Ranged());
  EXPECT_EQ(chain->RangedDims(), (std::vector<int>{chain->FindDim("m"), chain->FindDim("n")}));
  EXPECT_EQ(chain->tensors[chain->FindTensor("Q")].shape, (std::vector<int64_t>{64, 4, 16}));
  EXPECT_THAT(ChainToText(*chain), HasSubstr("dim h=4 m=17..64 n=17..64 d=16"));
}

TEST(RangedDimTest, RoundTripsThroughTextJsonAndProto) {
  absl::StatusOr<Chain> chain = ParseChainText(kRanged);
  ASSERT_TRUE(chain.ok()) << chain.status();
  const std::string key = Canonicalize(*chain).key;
  absl::StatusOr<Chain> text = ParseChainText(ChainToText(*chain));
  absl::StatusOr<Chain> json = ParseChainJson(ChainToJson(*chain));
  v1::Workload workload;
  *workload.mutable_chain() = wire::ChainToProto(*chain);
  absl::StatusOr<Chain> proto = wire::ChainFromWorkload(workload);
  for (const absl::StatusOr<Chain>* c : {&text, &json, &proto}) {
    ASSERT_TRUE(c->ok()) << c->status();
    EXPECT_EQ(Canonicalize(**c).key, key);
    EXPECT_EQ((*c)->dims[(*c)->FindDim("n")].min, 17);
  }
}

TEST(RangedDimTest, TheRangeIsPartOfTheKey) {
  absl::StatusOr<Chain> ranged = ParseChainText(kRanged);
  std::string fixed_text = kRanged;
  fixed_text.replace(fixed_text.find("m=17..64 n=17..64"), 17, "m=64 n=64");
  std::string other_text = kRanged;
  other_text.replace(other_text.find("m=17..64 n=17..64"), 17, "m=33..64 n=17..64");
  absl::StatusOr<Chain> fixed = ParseChainText(fixed_text), other = ParseChainText(other_text);
  ASSERT_TRUE(ranged.ok() && fixed.ok() && other.ok());
  const std::string key = Canonicalize(*ranged).key;
  EXPECT_NE(key, Canonicalize(*fixed).key);
  EXPECT_NE(key, Canonicalize(*other).key);
  // Renaming keeps it.
  std::string renamed = kRanged;
  for (auto [from, to] : {std::pair<std::string, std::string>{"m=", "q="}, {"[m,", "[q,"}, {",m,", ",q,"}}) {
    for (size_t at = renamed.find(from); at != std::string::npos; at = renamed.find(from, at + 1)) {
      renamed.replace(at, from.size(), to);
    }
  }
  absl::StatusOr<Chain> again = ParseChainText(renamed);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Canonicalize(*again).key, key);
  EXPECT_THAT(Canonicalize(*again).text, HasSubstr("=17..64"));
}

TEST(RangedDimTest, AtSizesMakesEveryDimExact) {
  absl::StatusOr<Chain> chain = ParseChainText(kRanged);
  ASSERT_TRUE(chain.ok());
  absl::StatusOr<Chain> at = AtSizes(*chain, {17, 33});
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_TRUE(at->RangedDims().empty());
  EXPECT_EQ(at->tensors[at->FindTensor("Q")].shape, (std::vector<int64_t>{17, 4, 16}));
  EXPECT_EQ(at->tensors[at->FindTensor("M")].shape, (std::vector<int64_t>{33}));
  EXPECT_EQ(at->tensors[at->FindTensor("P")].shape, (std::vector<int64_t>{4, 17, 33}));
  // Exact chains read back as written.
  absl::StatusOr<Chain> reread = ParseChainText(ChainToText(*at));
  ASSERT_TRUE(reread.ok()) << reread.status();
  EXPECT_EQ(Canonicalize(*reread).key, Canonicalize(*at).key);
  EXPECT_THAT(AtSizes(*chain, {16, 33}).status().message(), HasSubstr("size 16 of dim 'm' is outside its range 17..64"));
  EXPECT_THAT(AtSizes(*chain, {17}).status().message(), HasSubstr("2 ranged dims; 1 sizes"));
}

TEST(RangedDimTest, RefusesWhatCannotChangeSize) {
  auto error = [](const std::string& text) { return std::string(ParseChainText(text).status().message()); };
  // A range backwards, or from 0.
  EXPECT_THAT(error("dim m=9..4 k=4\nin X[m,k]\nY[m] = sum(k) X[m,k]\nout Y\n"),
              HasSubstr("ranges over 9..4"));
  EXPECT_THAT(error("dim m=0..4 k=4\nin X[m,k]\nY[m] = sum(k) X[m,k]\nout Y\n"),
              HasSubstr("a range starts at 1"));
  // An axis declared with another dim.
  EXPECT_THAT(error("dim m=1..8 k=4\nin X[k,k]\nY[m] = sum(k) X[m,k]\nout Y\n"),
              HasSubstr("ranges over [0, 7] but the axis has extent 4"));
  // A ranged axis read at an offset.
  EXPECT_THAT(error("dim m=2..8 k=4\nin X[m,k]\nY[m] = sum(k) X[m-1,k]\nout Y\n"),
              HasSubstr("indexed by 'm' alone"));
  // A constant cannot change shape.
  EXPECT_THAT(error("dim m=1..8 k=4\nin X[m,k] W[m]\nconst W\nY[m] = sum(k) X[m,k] * W[m]\nout Y\n"),
              HasSubstr("constant 'W' is declared with ranged dim 'm'"));
  // An axis of fixed extent (a preallocated cache's) may be read by a ranged dim anywhere in it.
  EXPECT_TRUE(ParseChainText("dim m=1..8 k=4\nin X[10,k]\nY[m] = sum(k) X[m+2,k]\nout Y\n").ok());
  // A range of one size is that size.
  absl::StatusOr<Chain> one = ParseChainText("dim m=8..8 k=4\nin X[m,k]\nY[m] = sum(k) X[m,k]\nout Y\n");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_FALSE(one->dims[0].Ranged());
}

}  // namespace
}  // namespace fusor::ir

namespace fusor::ir {
namespace {

constexpr char kExact[] = R"(
chain attn
dtype f32
dim h=4 m=150 n=150 d=32
in  Q[m,h,d] K[n,h,d] V[n,h,d]
S[h,m,n] = sum(d) Q[m,h,d] * K[n,h,d] * 0.17
P[h,m,n] = softmax(n) S[h,m,n]
O[m,h,d] = sum(n) P[h,m,n] * V[n,h,d]
out O
)";

TEST(RangeForTest, RangesGrowFourfold) {
  EXPECT_EQ(RangeFor(1), std::make_pair(int64_t{1}, int64_t{1}));
  EXPECT_EQ(RangeFor(2), std::make_pair(int64_t{2}, int64_t{16}));
  EXPECT_EQ(RangeFor(16), std::make_pair(int64_t{2}, int64_t{16}));
  EXPECT_EQ(RangeFor(17), std::make_pair(int64_t{17}, int64_t{64}));
  EXPECT_EQ(RangeFor(65), std::make_pair(int64_t{65}, int64_t{256}));
  EXPECT_EQ(RangeFor(384), std::make_pair(int64_t{257}, int64_t{1024}));
  EXPECT_EQ(RangeFor(int64_t{1} << 24).second, int64_t{1} << 24);
}

TEST(WidenTest, VaryingDimsBecomeTheirRanges) {
  absl::StatusOr<Chain> exact = ParseChainText(kExact);
  ASSERT_TRUE(exact.ok());
  absl::StatusOr<Chain> widened = Widen(*exact, {"m", "n"});
  ASSERT_TRUE(widened.ok()) << widened.status();
  EXPECT_EQ(RangedText(*widened), "m=65..256 n=65..256");
  EXPECT_THAT(Widen(*exact, {"x"}).status().message(), HasSubstr("'x' is not a dim"));
  // A dim read at an offset on an axis it sizes cannot vary.
  absl::StatusOr<Chain> shifted = ParseChainText("dim m=20 k=4\nin X[m,k]\nY[m] = sum(k) X[m,k]\nZ[m] = Y[m]\nout Z\n");
  ASSERT_TRUE(shifted.ok());
  absl::StatusOr<Chain> offset =
      ParseChainText("dim m=20 k=4 j=19\nin X[m,k]\nY[j] = sum(k) X[j+1,k]\nout Y\n");
  ASSERT_TRUE(offset.ok()) << offset.status();
  EXPECT_THAT(Widen(*offset, {"m"}).status().message(), HasSubstr("cannot serve a range of sizes there"));
}

TEST(FamilyTest, ChainsAtOtherSizesShareAFamilyAndCarryOver) {
  absl::StatusOr<Chain> exact = ParseChainText(kExact);
  ASSERT_TRUE(exact.ok());
  absl::StatusOr<Chain> ranged = Widen(*exact, {"m", "n"});
  ASSERT_TRUE(ranged.ok());
  const CanonicalForm exact_family = CanonicalFamily(*exact);
  // The record is stored in canonical names.
  const Chain record = Canonicalize(*ranged).chain;
  const CanonicalForm record_family = CanonicalFamily(record);
  EXPECT_EQ(exact_family.key, record_family.key);
  EXPECT_NE(exact_family.key, CanonicalFamily(*ParseChainText(absl::StrReplaceAll(kExact, {{"f32", "f16"}}))).key);
  // A range holds the ranges inside it, not exact sizes (whose callers lay out buffers at that size).
  absl::StatusOr<Chain> inside = Widen(*ParseChainText(absl::StrReplaceAll(kExact, {{"=150", "=200"}})), {"m", "n"});
  ASSERT_TRUE(inside.ok()) << inside.status();
  EXPECT_TRUE(Covers(record, record_family, *inside, CanonicalFamily(*inside)));
  EXPECT_FALSE(Covers(record, record_family, *exact, exact_family));
  absl::StatusOr<Chain> outside = ParseChainText(absl::StrReplaceAll(kExact, {{"=150", "=300"}}));
  ASSERT_TRUE(outside.ok());
  EXPECT_FALSE(Covers(record, record_family, *outside, CanonicalFamily(*outside)));
  EXPECT_GT(SizeDistance(record, record_family, *outside, CanonicalFamily(*outside)), 0);
  // The requester's chain at the record's ranges is the record.
  absl::StatusOr<Chain> resized = WithSizesOf(*exact, exact_family, record, record_family);
  ASSERT_TRUE(resized.ok()) << resized.status();
  EXPECT_EQ(Canonicalize(*resized).key, Canonicalize(*ranged).key);
  EXPECT_EQ(RangedText(*resized), "m=65..256 n=65..256");
}

}  // namespace
}  // namespace fusor::ir
