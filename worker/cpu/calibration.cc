#include "worker/cpu/calibration.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace fusor::worker {

codegen::KernelSource CalibrationKernel(const hw::TargetDesc& target) {
  static constexpr char kSource[] = R"(// fusor CPU calibration
#include <omp.h>
#include <stdlib.h>
typedef float vf __attribute__((vector_size(LANES * 4)));

extern "C" double fusor_peak_flops(int threads, double seconds) {
  double best = 0;
  for (long iters = 1 << 16;; iters *= 2) {
    double t0 = omp_get_wtime();
    float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      vf acc[12];
      const vf m = (vf){} + 0.999999f, a = (vf){} + 1e-7f;
      for (int j = 0; j < 12; ++j) acc[j] = (vf){} + (float)(omp_get_thread_num() + j);
      for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 12
        for (int j = 0; j < 12; ++j) acc[j] = acc[j] * m + a;
      }
      for (int j = 0; j < 12; ++j) sink += acc[j][0];
    }
    double t = omp_get_wtime() - t0;
    if (sink == 12345.0f) return -1;  // keeps the loop alive
    double rate = 2.0 * 12 * LANES * (double)iters * threads / t;
    if (rate > best) best = rate;
    if (t > seconds / 4) return best;
  }
}

extern "C" double fusor_bandwidth(int threads, double seconds) {
  const long n = 1L << 24;  // 64 MiB per array
  float* a = (float*)aligned_alloc(64, n * sizeof(float));
  float* b = (float*)aligned_alloc(64, n * sizeof(float));
  float* c = (float*)aligned_alloc(64, n * sizeof(float));
  if (!a || !b || !c) return 0;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (long i = 0; i < n; ++i) { a[i] = 0; b[i] = 1; c[i] = 2; }
  double best = 0, spent = 0;
  for (int rep = 0; rep < 50 && spent < seconds; ++rep) {
    double t0 = omp_get_wtime();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
    double t = omp_get_wtime() - t0;
    spent += t;
    double rate = 3.0 * n * sizeof(float) / t;
    if (rate > best) best = rate;
  }
  free(a); free(b); free(c);
  return best;
}
)";
  codegen::KernelSource k;
  const int lanes = target.vector_lanes_f32 > 4 ? target.vector_lanes_f32 : 4;
  k.source = absl::StrReplaceAll(kSource, {{"LANES", absl::StrCat(lanes)}});
  k.entry_point = "fusor_peak_flops";
  k.compile_flags = {"-O3", "-march=native", "-std=gnu++17", "-fopenmp", "-ffp-contract=fast"};
  return k;
}

}  // namespace fusor::worker
