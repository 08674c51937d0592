// The peak rates of a CPU's 512-bit f32 FMA (vfmadd231ps: 32 FLOP) and bf16
// dot product (vdpbf16ps: 64 FLOP), each on 12 independent accumulators per
// thread, summed over the OpenMP threads: what a bf16 micro-kernel can gain
// over the f32 one on this CPU (issue 53). Needs AVX-512 with avx512_bf16:
//   g++ -O2 -march=native -fopenmp bench/micro/peak_rates.cc -o peak_rates && OMP_NUM_THREADS=2 ./peak_rates
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>

template <bool BF16> double Rate(long iters) {
  double total = 0;
#pragma omp parallel reduction(+ : total)
  {
    __m512 acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
    const __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
    const __m512bh ab = (__m512bh)_mm512_set1_epi32(0x3f803f80), bb = (__m512bh)_mm512_set1_epi32(0x3f803f80);
    auto t0 = std::chrono::steady_clock::now();
    for (long n = 0; n < iters; ++n) {
#pragma GCC unroll 12
      for (int i = 0; i < 12; ++i) {
        if constexpr (BF16) acc[i] = _mm512_dpbf16_ps(acc[i], ab, bb);
        else acc[i] = _mm512_fmadd_ps(acc[i], a, b);
      }
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    float sink = 0;
    for (int i = 0; i < 12; ++i) sink += _mm512_reduce_add_ps(acc[i]);
    if (sink == 12345.f) std::printf("x");
    total += iters * 12.0 * (BF16 ? 64 : 32) / s;
  }
  return total;
}
int main() {
  for (int rep = 0; rep < 3; ++rep)
    std::printf("f32 FMA %.0f GFLOP/s   bf16 dot %.0f GFLOP/s\n", Rate<false>(50000000) / 1e9, Rate<true>(50000000) / 1e9);
}
