// The SIMD helpers emitted kernels include (simd.inc), compiled as kernels
// are for AVX-512 (this machine's -march=native where it has it), AVX2
// (-march=haswell) and plain x86-64 (128-bit vectors), and checked against
// float64: exp, erf, GELU, tanh, sigmoid (their limits at +-infinity), f16/bf16 conversions (bit-exact
// against the prelude's scalar ones), softmax rows and the transposing pack.
#include <cmath>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/str_replace.h"
#include "common/codegen/cpu/cpu_codegen.h"
#include "common/codegen/cpu/cpu_emit.h"
#include "worker/cpu/compiler.h"
#include "worker/cpu/measure.h"
#include "common/util/process.h"

namespace fusor::codegen {
namespace {

// Each check writes one figure; the test bounds each.
constexpr char kChecks[] = R"(
#include <math.h>
static double rel(double got, double want) { return fabs(got - want) / (fabs(want) > 1e-30 ? fabs(want) : 1e-30); }
extern "C" int fusor_simd_check(double* out) {
  double exp_rel = 0, exp_twin = 0, erf_abs = 0, gelu_abs = 0, tanh_rel = 0, sigmoid_rel = 0, gelu_tanh_abs = 0;
  for (double xd = -87.0; xd < 88.0; xd += 0.00731) {
    const float x = (float)xd;
    const float v = fusor_vexp(fusor_vsplat(x))[FUSOR_VL - 1];
    exp_rel = fmax(exp_rel, rel(v, exp((double)x)));
    exp_twin = fmax(exp_twin, fabs(v - fusor_exp(x)));
  }
  for (double xd = -9.0; xd < 9.0; xd += 0.00317) {
    const float x = (float)xd;
    const fusor_vf v = fusor_vsplat(x);
    erf_abs = fmax(erf_abs, fabs(fusor_verf(v)[0] - erf((double)x)));
    gelu_abs = fmax(gelu_abs, fabs(fusor_vgelu(v)[0] - 0.5 * x * (1 + erf(x / sqrt(2.0)))));
    tanh_rel = fmax(tanh_rel, rel(fusor_vtanh(v)[0], tanh((double)x)));
    sigmoid_rel = fmax(sigmoid_rel, rel(fusor_vsigmoid(v)[0], 1 / (1 + exp(-(double)x))));
    const double inner = 0.7978845608028654 * (x + 0.044715 * (double)x * x * x);
    gelu_tanh_abs = fmax(gelu_tanh_abs, fabs(fusor_vgelu_tanh(v)[0] - 0.5 * x * (1 + tanh(inner))));
    gelu_tanh_abs = fmax(gelu_tanh_abs, fabs(fusor_gelu_tanh(x) - 0.5 * x * (1 + tanh(inner))));
  }
  out[0] = exp_rel;
  out[1] = exp_twin;
  out[2] = erf_abs;
  out[3] = gelu_abs;
  out[4] = tanh_rel;
  out[5] = sigmoid_rel;
  out[6] = fusor_vexp(fusor_vsplat(-1e30f))[0] == 0.0f && fusor_vexp(fusor_vsplat(-INFINITY))[0] == 0.0f &&
           isfinite(fusor_vexp(fusor_vsplat(1000.0f))[0]);
  /* Conversions: bit for bit what the scalar prelude does. */
  const float specials[] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65520.0f, 1e6f, -1e-8f, 6e-8f, 3e-5f,
                            0.333333f, 1.00048828125f, 1.0009765625f, 3.14159f, INFINITY, -INFINITY};
  int mismatches = 0;
  for (int start = 0; start < 16; start += FUSOR_VL) {
    float src[FUSOR_VL];
    for (int i = 0; i < FUSOR_VL; ++i) src[i] = specials[(start + i) % 16];
    uint16_t h[FUSOR_VL], b[FUSOR_VL];
    fusor_vstore_f16(h, fusor_vload(src));
    fusor_vstore_bf16(b, fusor_vload(src));
    const fusor_vf hf = fusor_vload_f16(h), bf = fusor_vload_bf16(b);
    for (int i = 0; i < FUSOR_VL; ++i) {
      mismatches += h[i] != fusor_f32_to_f16(src[i]) || b[i] != fusor_f32_to_bf16(src[i]);
      mismatches += hf[i] != fusor_f16_to_f32(h[i]) || bf[i] != fusor_bf16_to_f32(b[i]);
    }
  }
  out[7] = mismatches;
  /* Softmax rows of every length up to 3 vectors, and a masked one. */
  double row_err = 0;
  for (int n = 1; n <= 3 * FUSOR_VL + 1; ++n) {
    float row[64];
    for (int i = 0; i < n; ++i) row[i] = sinf(1.7f * i) * 20.0f;
    const float mx = fusor_row_max(row, n);
    double want_max = -1e30, want_sum = 0;
    for (int i = 0; i < n; ++i) want_max = fmax(want_max, sinf(1.7f * i) * 20.0f);
    for (int i = 0; i < n; ++i) want_sum += exp(sinf(1.7f * i) * 20.0f - want_max);
    row_err = fmax(row_err, fabs(mx - want_max) + rel(fusor_row_exp_sum(row, n, mx), want_sum));
  }
  float masked[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  out[8] = row_err;
  out[9] = fusor_row_exp_sum(masked, 5, fusor_row_max(masked, 5)) == 0.0f && masked[4] == 0.0f;
  /* The transposing pack, whole and partial blocks. */
  int wrong = 0;
  static float src[40 * 45], panel[64 * 48];
  for (int i = 0; i < 40 * 45; ++i) src[i] = (float)i;
  const int shapes[][2] = {{1, 1}, {7, 5}, {16, 16}, {33, 40}, {40, 37}};
  for (const auto& shape : shapes) {
    fusor_pack_transposed(src, 45, panel, 48, shape[0], shape[1], 0.5f);
    for (int j = 0; j < shape[0]; ++j)
      for (int p = 0; p < shape[1]; ++p) wrong += panel[p * 48 + j] != 0.5f * src[j * 45 + p];
  }
  out[10] = wrong;
  out[11] = FUSOR_VL;
  out[12] = gelu_tanh_abs;
  /* Far out and infinite arguments: limits, not NaN (the reciprocal's
   * Newton step has no answer at 0 and infinity). */
  const fusor_vf big = fusor_vsplat(1e30f), inf = fusor_vsplat(INFINITY);
  const float tiny = 1e-37f; /* exp's argument is clamped to -88 */
  out[13] = fusor_vsigmoid(-big)[0] < tiny && fusor_vsigmoid(big)[0] == 1.0f && fusor_vsigmoid(-inf)[0] < tiny &&
            fusor_vtanh(big)[0] == 1.0f && fusor_vtanh(-big)[0] == -1.0f && fusor_vtanh(-inf)[0] == -1.0f &&
            fusor_vgelu(big)[0] == 1e30f && fusor_vgelu(inf)[0] == INFINITY && fusor_vgelu(-big)[0] == 0.0f &&
            fusor_verf(inf)[0] == 1.0f && fusor_verf(-inf)[0] == -1.0f;
  return 0;
}
)";

struct Figures {
  double v[14] = {};
};

Figures Run(const std::string& march) {
  KernelSource k;
  k.source = cpu::Preamble("// fusor SIMD helper check\n") + kChecks;
  k.entry_point = "fusor_simd_check";
  for (std::string flag : cpu::CompileFlags()) k.compile_flags.push_back(flag == "-march=native" ? march : flag);
  auto dir = TempDir::Create("/tmp", "fusor-simd-test-");
  EXPECT_TRUE(dir.ok());
  worker::CompileOutcome compiled = worker::CompileKernel(k, dir->path(), "c++", 120);
  EXPECT_TRUE(compiled.ok) << compiled.error;
  Figures f;
  if (!compiled.ok) return f;
  auto loaded = worker::LoadedKernel::Open(compiled.so_path, k.entry_point);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return f;
  auto check = reinterpret_cast<int (*)(double*)>(loaded->Symbol(k.entry_point));
  EXPECT_EQ(check(f.v), 0);
  return f;
}

void ExpectAccurate(const std::string& march, int lanes) {
  SCOPED_TRACE(march);
  Figures f = Run(march);
  EXPECT_EQ(f.v[11], lanes);
  EXPECT_LT(f.v[0], 3e-7) << "exp, relative";
  EXPECT_EQ(f.v[1], 0) << "vector exp and its scalar twin differ";
  EXPECT_LT(f.v[2], 5e-7) << "erf, absolute";
  EXPECT_LT(f.v[3], 2e-6) << "gelu, absolute";
  EXPECT_LT(f.v[4], 2e-6) << "tanh, relative";
  EXPECT_LT(f.v[5], 5e-7) << "sigmoid, relative";
  EXPECT_LT(f.v[12], 2e-5) << "gelu_tanh (vector and scalar), absolute";
  EXPECT_EQ(f.v[6], 1) << "exp of -1e30, -inf and 1000";
  EXPECT_EQ(f.v[7], 0) << "f16/bf16 conversions differ from the prelude's";
  EXPECT_LT(f.v[8], 1e-5) << "softmax row max and sum";
  EXPECT_EQ(f.v[9], 1) << "a fully masked row";
  EXPECT_EQ(f.v[10], 0) << "transposing pack";
  EXPECT_EQ(f.v[13], 1) << "sigmoid, tanh, gelu and erf of +-1e30 and +-inf";
}

bool CpuHas(const char* feature) {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str().find(feature) != std::string::npos;
}

TEST(SimdTest, Sse128BitVectors) { ExpectAccurate("-march=x86-64", 4); }

TEST(SimdTest, Avx2) {
  if (!CpuHas(" avx2")) GTEST_SKIP() << "this CPU has no AVX2";
  ExpectAccurate("-march=haswell", 8);
}

TEST(SimdTest, Avx512) {
  if (!CpuHas(" avx512f")) GTEST_SKIP() << "this CPU has no AVX-512";
  ExpectAccurate("-march=skylake-avx512", 16);
}

}  // namespace
}  // namespace fusor::codegen
