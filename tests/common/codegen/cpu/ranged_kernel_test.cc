// Kernels of chains with ranged dims: emitted and compiled once, then run
// at every size of interest of the range (its ends, 1, sizes that leave
// remainder tiles) through fusor_run_dims, each checked element by element
// against the float64 reference of the chain at that size.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codegen/cpu/cpu_codegen.h"
#include "common/ir/parse.h"
#include "common/space/loop_nest.h"
#include "common/space/schedule.h"
#include "common/util/process.h"
#include "tests/test_targets.h"
#include "worker/cpu/compiler.h"
#include "worker/cpu/measure.h"
#include "worker/validate.h"

namespace fusor::codegen {
namespace {

using ::testing::HasSubstr;

// Attention as the PyTorch backend writes it for one sequence: heads
// between the rows and the head dim, a padding mask over the keys.
constexpr char kAttention[] = R"(
chain ranged_attention
dtype f32
dim z1=3 m=1..40 n=1..56 d=16 e=24
in  Q[m,z1,d] K[n,z1,d] V[n,z1,e] M[n]
S[z1,m,n] = sum(d) Q[m,z1,d] * K[n,z1,d] * 0.25
P[z1,m,n] = softmax(n) S[z1,m,n] + M[n]
O[m,z1,e] = sum(n) P[z1,m,n] * V[n,z1,e]
out O
)";

// A decode step's attention over a KV cache laid out [heads, keys, dim]:
// the head stride of K and V changes with the keys' count.
constexpr char kDecode[] = R"(
chain ranged_decode
dtype f32
dim z1=4 m=1..3 n=1..70 d=8 e=8
in  Q[z1,m,d] K[z1,n,d] V[z1,n,e]
S[z1,m,n] = sum(d) Q[z1,m,d] * K[z1,n,d] * 0.35
P[z1,m,n] = softmax(n) S[z1,m,n]
O[z1,m,e] = sum(n) P[z1,m,n] * V[z1,n,e]
out O
)";

constexpr char kCausal[] = R"(
chain ranged_causal
dtype f32
dim z0=1..3 z1=2 m=2..48 n=2..48 d=16 e=16
in  Q[z0,m,z1,d] K[z0,n,z1,d] V[z0,n,z1,e]
S[z0,z1,m,n] = sum(d) Q[z0,m,z1,d] * K[z0,n,z1,d] * 0.25
P[z0,z1,m,n] = softmax(n <= m) S[z0,z1,m,n]
O[z0,m,z1,e] = sum(n) P[z0,z1,m,n] * V[z0,n,z1,e]
out O
)";

// A feed-forward block over a batch's rows, its weights constant (packed
// once by fusor_prepare).
constexpr char kFfn[] = R"(
chain ranged_ffn
dtype f32
dim m=1..50 c=32 f=72 o=24
in  X[m,c] W1[c,f] B1[f] W2[f,o]
const W1 B1 W2
H[m,f] = sum(c) X[m,c] * W1[c,f]
G[m,f] = gelu(H[m,f] + B1[f])
Y[m,o] = sum(f) G[m,f] * W2[f,o]
out Y
)";

struct Built {
  ir::Chain chain;
  KernelSource kernel;
  std::optional<worker::LoadedKernel> loaded;
  std::optional<TempDir> dir;
};

// Emits and compiles the chain's kernel under `schedule_text`.
std::unique_ptr<Built> Build(const std::string& text, const std::string& schedule_text,
                             const hw::TargetDesc& target = testing::Avx2Target()) {
  auto built = std::make_unique<Built>();
  absl::StatusOr<ir::Chain> chain = ir::ParseChainText(text);
  EXPECT_TRUE(chain.ok()) << chain.status();
  if (!chain.ok()) return nullptr;
  built->chain = *chain;
  absl::StatusOr<space::Schedule> schedule = space::ParseSchedule(schedule_text, built->chain);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  if (!schedule.ok()) return nullptr;
  absl::StatusOr<space::LoopNest> nest = space::BuildLoopNest(built->chain, *schedule, target);
  EXPECT_TRUE(nest.ok()) << nest.status();
  if (!nest.ok()) return nullptr;
  absl::StatusOr<KernelSource> kernel = EmitCpuFusedKernel(built->chain, *nest, schedule_text, "test");
  EXPECT_TRUE(kernel.ok()) << kernel.status();
  if (!kernel.ok()) return nullptr;
  built->kernel = *kernel;
  absl::StatusOr<TempDir> dir = TempDir::Create("/tmp", "fusor-ranged-test-");
  EXPECT_TRUE(dir.ok());
  built->dir.emplace(*std::move(dir));
  worker::CompileOutcome compiled = worker::CompileKernel(built->kernel, built->dir->path(), "c++", 120);
  EXPECT_TRUE(compiled.ok) << compiled.error << "\n" << built->kernel.source;
  if (!compiled.ok) return nullptr;
  absl::StatusOr<worker::LoadedKernel> loaded = worker::LoadedKernel::Open(compiled.so_path, "fusor_run");
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return nullptr;
  built->loaded.emplace(*std::move(loaded));
  return built;
}

// Runs the built kernel at each of `sizes` and checks it.
void CheckAt(const Built& built, const std::vector<std::vector<int64_t>>& sizes, const std::string& what) {
  for (const std::vector<int64_t>& at : sizes) {
    absl::StatusOr<ir::Chain> chain = ir::AtSizes(built.chain, at);
    ASSERT_TRUE(chain.ok()) << chain.status();
    const std::vector<long> dims(at.begin(), at.end());
    absl::StatusOr<worker::Validation> v = worker::ValidateKernelOn(
        *built.loaded, *chain, worker::RandomInputs(*chain, 11), 2, 0, nullptr, dims);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_TRUE(v->ok) << what << " at " << absl::StrJoin(at, "x") << ": " << v->detail << "\n"
                       << built.kernel.source;
  }
}

TEST(RangedKernelTest, AttentionAtEverySizeOfItsRange) {
  const std::vector<std::vector<int64_t>> sizes = {{40, 56}, {1, 1}, {1, 56}, {17, 23}, {33, 9}, {16, 32}};
  for (const char* schedule : {"z1=1 m=16 / - / -", "z1=1 m=8 / n=16 / S(d=16) O(e=16)", "- / n=16 / -",
                               "z1=1 m=24 / - / S(n=16) O(n=16)"}) {
    std::unique_ptr<Built> built = Build(kAttention, schedule);
    ASSERT_NE(built, nullptr) << schedule;
    CheckAt(*built, sizes, schedule);
  }
}

TEST(RangedKernelTest, DecodeOverACacheWhoseHeadStrideChanges) {
  for (const char* schedule : {"z1=1 / n=16 / -", "z1=1 m=1 / - / S(n=32)", "- / - / -"}) {
    std::unique_ptr<Built> built = Build(kDecode, schedule);
    ASSERT_NE(built, nullptr) << schedule;
    EXPECT_THAT(built->kernel.source, HasSubstr("x_n"));
    CheckAt(*built, {{1, 70}, {1, 1}, {1, 33}, {3, 17}, {2, 64}}, schedule);
  }
}

TEST(RangedKernelTest, CausalAttentionWithARangedBatch) {
  for (const char* schedule : {"z0=1 z1=1 m=16 / - / -", "z0=1 z1=1 m=8 / n=8 / -"}) {
    std::unique_ptr<Built> built = Build(kCausal, schedule);
    ASSERT_NE(built, nullptr) << schedule;
    CheckAt(*built, {{3, 48, 48}, {1, 2, 2}, {2, 19, 19}, {1, 33, 33}}, schedule);
  }
}

TEST(RangedKernelTest, FeedForwardRowsWithPackedConstants) {
  for (const char* schedule : {"m=8 / - / -", "m=16 / f=24 / H(c=16)", "- / f=16x2 / -"}) {
    std::unique_ptr<Built> built = Build(kFfn, schedule, testing::Avx512Target());
    ASSERT_NE(built, nullptr) << schedule;
    CheckAt(*built, {{50}, {1}, {7}, {16}, {33}}, schedule);
  }
}

// Every size of a range, one by one: a feed-forward block's rows, and a
// decode step's keys (one query, the cache one key longer each step).
TEST(RangedKernelTest, EverySizeOfTheRange) {
  std::unique_ptr<Built> ffn = Build(kFfn, "m=16 / f=24 / H(c=16)", testing::Avx512Target());
  ASSERT_NE(ffn, nullptr);
  std::vector<std::vector<int64_t>> rows;
  for (int64_t m = 1; m <= 50; ++m) rows.push_back({m});
  CheckAt(*ffn, rows, "every row count");
  std::unique_ptr<Built> decode = Build(kDecode, "z1=1 / n=16 / -");
  ASSERT_NE(decode, nullptr);
  std::vector<std::vector<int64_t>> keys;
  for (int64_t n = 1; n <= 70; ++n) keys.push_back({1, n});
  CheckAt(*decode, keys, "every key count");
}

TEST(RangedKernelTest, ASizeOutsideTheRangeIsRefused) {
  std::unique_ptr<Built> built = Build(kFfn, "m=8 / - / -", testing::Avx512Target());
  ASSERT_NE(built, nullptr);
  absl::StatusOr<ir::Chain> chain = ir::AtSizes(built->chain, {50});
  ASSERT_TRUE(chain.ok());
  for (long size : {0L, 51L}) {
    absl::StatusOr<worker::Validation> v =
        worker::ValidateKernelOn(*built->loaded, *chain, worker::RandomInputs(*chain, 3), 2, 0, nullptr, {size});
    EXPECT_FALSE(v.ok()) << size;
  }
  EXPECT_THAT(built->kernel.metadata_json, HasSubstr("\"entry_point_dims\": \"fusor_run_dims\""));
}

}  // namespace
}  // namespace fusor::codegen
