// The float64 reference kept across jobs: computed by the first job of a
// task's input set, read back by the others, recomputed when its file is
// damaged, bounded in size; and the task's input-set seeds.
#include <chrono>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/ir/parse.h"
#include "common/ir/reference.h"
#include "common/util/process.h"
#include "tests/test_chains.h"
#include "worker/validate.h"

namespace fusor::worker {
namespace {

namespace fs = std::filesystem;

// One output E[m=64, h=32]: 18 bytes of header and 2048 doubles a file.
constexpr int64_t kFileBytes = 18 + 64 * 32 * sizeof(double);

struct Set {
  ir::Chain chain;
  std::vector<std::vector<double>> rounded;
  Outputs expected;
};

Set MakeSet(uint64_t seed) {
  Set s{*ir::ParseChainText(testing::kGemmChain), {}, {}};
  for (const std::vector<double>& v : RandomInputs(s.chain, seed)) s.rounded.push_back(RoundToDType(s.chain.dtype, v));
  s.expected = *ir::EvaluateReference(s.chain, s.rounded);
  return s;
}

std::vector<fs::path> Files(const std::string& dir) {
  std::vector<fs::path> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) out.push_back(e.path());
  return out;
}

TEST(ReferenceCacheTest, ComputedOnceThenReadBack) {
  auto dir = TempDir::Create("/tmp", "fusor-reference-test-");
  ASSERT_TRUE(dir.ok());
  const Set s = MakeSet(7);
  auto first = CachedReference(s.chain, 7, s.rounded, dir->path());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, s.expected);
  const std::vector<fs::path> files = Files(dir->path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(fs::file_size(files[0]), kFileBytes);

  // What the file says is what a later job gets: it is not recomputed.
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(18);
    const double marked = 42;
    f.write(reinterpret_cast<const char*>(&marked), sizeof(marked));
  }
  auto second = CachedReference(s.chain, 7, s.rounded, dir->path());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)[0][0], 42);

  // A damaged file is computed again, and replaced.
  fs::resize_file(files[0], 100);
  auto third = CachedReference(s.chain, 7, s.rounded, dir->path());
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(*third, s.expected);
  EXPECT_EQ(fs::file_size(files[0]), kFileBytes);

  // Another input set is another file; no directory keeps nothing.
  const Set other = MakeSet(8);
  EXPECT_EQ(*CachedReference(other.chain, 8, other.rounded, dir->path()), other.expected);
  EXPECT_EQ(Files(dir->path()).size(), 2u);
  EXPECT_EQ(*CachedReference(other.chain, 8, other.rounded, ""), other.expected);
}

TEST(ReferenceCacheTest, KeepsTheMostRecentlyUsedWithinItsBound) {
  auto dir = TempDir::Create("/tmp", "fusor-reference-test-");
  ASSERT_TRUE(dir.ok());
  const int64_t bound = 2 * kFileBytes;
  const Set a = MakeSet(1), b = MakeSet(2), c = MakeSet(3);
  ASSERT_TRUE(CachedReference(a.chain, 1, a.rounded, dir->path(), bound).ok());
  const fs::path a_file = Files(dir->path())[0];
  ASSERT_TRUE(CachedReference(b.chain, 2, b.rounded, dir->path(), bound).ok());
  fs::path b_file;
  for (const fs::path& p : Files(dir->path())) {
    if (p != a_file) b_file = p;
  }
  // a older than b, then read back: b is the least recently used.
  fs::last_write_time(a_file, fs::file_time_type::clock::now() - std::chrono::hours(2));
  fs::last_write_time(b_file, fs::file_time_type::clock::now() - std::chrono::hours(1));
  ASSERT_TRUE(CachedReference(a.chain, 1, a.rounded, dir->path(), bound).ok());
  ASSERT_TRUE(CachedReference(c.chain, 3, c.rounded, dir->path(), bound).ok());
  EXPECT_EQ(Files(dir->path()).size(), 2u);
  EXPECT_TRUE(fs::exists(a_file));
  EXPECT_FALSE(fs::exists(b_file));
}

TEST(ReferenceCacheTest, ATaskHasAFewInputSets) {
  EXPECT_EQ(TaskInputSeed("t1", 0), TaskInputSeed("t1", 0));
  EXPECT_EQ(TaskInputSeed("t1", 1), TaskInputSeed("t1", 1 + kInputSets));
  EXPECT_NE(TaskInputSeed("t1", 0), TaskInputSeed("t1", 1));
  EXPECT_NE(TaskInputSeed("t1", 0), TaskInputSeed("t2", 0));
}

}  // namespace
}  // namespace fusor::worker
