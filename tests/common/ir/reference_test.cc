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

}  // namespace
}  // namespace fusor::ir
