// The float64 reference interpreter against loops written out by hand, to
// the last bit: its threads split output points, never a sum.
#include "common/ir/reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/ir/parse.h"

namespace fusor::ir {
namespace {

std::vector<double> Random(int64_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

TEST(ReferenceTest, SumsEveryPointInOneOrderWhateverTheThreads) {
  // A strided product (B read down its columns), a scaled three-factor
  // sum, a softmax and a map, with extents that no thread count divides.
  auto chain = ParseChainText(R"(
dim m=37 k=29 n=41 h=3
in A[m,k] B[k,n] D[n,h] G[m,n]
C[m,n] = sum(k) A[m,k] * B[k,n]
P[m,n] = softmax(n) C[m,n]
E[m,h] = sum(n) P[m,n] * G[m,n] * D[n,h] * 0.5
F[m,h] = relu(E[m,h])
out F
)");
  ASSERT_TRUE(chain.ok()) << chain.status();
  std::mt19937_64 rng(3);
  const int m = 37, k = 29, n = 41, h = 3;
  const std::vector<double> a = Random(m * k, rng), b = Random(k * n, rng), d = Random(n * h, rng),
                            g = Random(m * n, rng);
  auto got = EvaluateReference(*chain, {a, b, d, g});
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<double> c(m * n), p(m * n), f(m * h);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int r = 0; r < k; ++r) acc += 1.0 * a[i * k + r] * b[r * n + j];
      c[i * n + j] = acc;
    }
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < n; ++j) mx = std::max(mx, c[i * n + j]);
    for (int j = 0; j < n; ++j) sum += p[i * n + j] = std::exp(c[i * n + j] - mx);
    for (int j = 0; j < n; ++j) p[i * n + j] /= sum;
    for (int o = 0; o < h; ++o) {
      double acc = 0;
      for (int j = 0; j < n; ++j) acc += 0.5 * p[i * n + j] * g[i * n + j] * d[j * h + o];
      f[i * h + o] = acc > 0 ? acc : 0;
    }
  }
  ASSERT_EQ(got->size(), 1u);
  ASSERT_EQ((*got)[0].size(), f.size());
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ((*got)[0][i], f[i]) << i;
}

// A causal softmax is the same softmax with -inf added above the
// diagonal (here offset by 2, with fewer rows than keys, and with its own
// additive mask as well).
TEST(ReferenceTest, CausalSoftmaxDropsTheEntriesPastItsRow) {
  const std::string causal = R"(
dim b=2 m=9 n=12 h=5
in S[b,m,n] A[m,n] V[b,n,h]
P[b,m,n] = softmax(n <= m + 2) S[b,m,n] + A[m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O P
)";
  std::string masked = causal;
  masked.replace(masked.find("softmax(n <= m + 2)"), 19, "softmax(n)");
  masked.replace(masked.find("A[m,n]\nO"), 6, "A[m,n] + C[m,n]");
  masked.replace(masked.find("V[b,n,h]\n"), 8, "V[b,n,h] C[m,n]");
  auto c = ParseChainText(causal);
  auto m = ParseChainText(masked);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(m.ok()) << m.status() << masked;
  std::mt19937_64 rng(3);
  std::vector<std::vector<double>> inputs = {Random(2 * 9 * 12, rng), Random(9 * 12, rng), Random(2 * 12 * 5, rng)};
  std::vector<double> mask(9 * 12);
  for (int i = 0; i < 9; ++i) {
    for (int j = 0; j < 12; ++j) mask[i * 12 + j] = j <= i + 2 ? 0.0 : -INFINITY;
  }
  std::vector<std::vector<double>> with_mask = inputs;
  with_mask.push_back(mask);
  auto want = EvaluateReference(*m, with_mask);
  auto got = EvaluateReference(*c, inputs);
  ASSERT_TRUE(want.ok() && got.ok());
  ASSERT_EQ(got->size(), 2u);
  for (size_t t = 0; t < 2; ++t) {
    for (size_t i = 0; i < (*got)[t].size(); ++i) EXPECT_DOUBLE_EQ((*got)[t][i], (*want)[t][i]) << t << " " << i;
  }
  EXPECT_EQ((*got)[1][0 * 12 + 3], 0.0);  // row 0 keeps keys 0..2
  EXPECT_GT((*got)[1][0 * 12 + 2], 0.0);
}

}  // namespace
}  // namespace fusor::ir
