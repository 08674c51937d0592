/* fusor device header (NVRTC): the only primitives emitted CUDA kernels
 * use beyond plain CUDA C++. Each wraps one PTX instruction; the host
 * emulation (emu/fusor_device.h) implements the same names with the PTX
 * ISA's semantics, so the very source handed to NVRTC also runs on a CPU.
 *
 * 16-bit values travel as their bit patterns (unsigned short); fragments
 * are 32-bit registers holding two of them, the lower index in the low
 * half. Needs sm_80 or newer (cp.async, ldmatrix, mma.m16n8k16). */
#ifndef FUSOR_DEVICE_H
#define FUSOR_DEVICE_H

typedef unsigned int fusor_u32;
typedef unsigned short fusor_u16;

#define FUSOR_INLINE __device__ __forceinline__
#define FUSOR_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#define FUSOR_INFINITY __int_as_float(0x7f800000)

/* ------------------------------------------------------- conversions --- */
FUSOR_INLINE float fusor_f16_to_f32(fusor_u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
FUSOR_INLINE fusor_u16 fusor_f32_to_f16(float f) {
  fusor_u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
FUSOR_INLINE float fusor_bf16_to_f32(fusor_u16 h) { return __uint_as_float(((fusor_u32)h) << 16); }
FUSOR_INLINE fusor_u16 fusor_f32_to_bf16(float f) {
  fusor_u16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
/* Round to tf32 (10-bit mantissa, nearest, ties away), kept as f32 bits. */
FUSOR_INLINE float fusor_round_tf32(float f) {
  fusor_u32 t;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(t) : "f"(f));
  return __uint_as_float(t);
}
FUSOR_INLINE fusor_u32 fusor_bits(float f) { return __float_as_uint(f); }
/* Two floats rounded into one register of f16 (bf16) pairs, lo in the low
   half: an mma operand, in one instruction. */
FUSOR_INLINE fusor_u32 fusor_pack_f16x2(float lo, float hi) {
  fusor_u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
FUSOR_INLINE fusor_u32 fusor_pack_bf16x2(float lo, float hi) {
  fusor_u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

/* ---------------------------------------------------------- functions --- */
FUSOR_INLINE float fusor_relu(float x) { return x > 0.0f ? x : 0.0f; }
FUSOR_INLINE float fusor_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
FUSOR_INLINE float fusor_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
FUSOR_INLINE float fusor_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
/* 2^x in one MUFU.EX2 (relative error about 2^-22; 2^-inf = 0): the
   online softmax works in base 2, log2(e) folded into its input. */
FUSOR_INLINE float fusor_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* ------------------------------------------------------------ threads --- */
FUSOR_INLINE int fusor_lane() { return (int)(threadIdx.x & 31u); }
FUSOR_INLINE int fusor_warp() { return (int)(threadIdx.x >> 5); }
FUSOR_INLINE float fusor_shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
FUSOR_INLINE float fusor_shfl(float v, int src_lane) { return __shfl_sync(0xffffffffu, v, src_lane); }

/* A split kernel's parts meet in global memory: each block writes its part,
   fences, and counts itself in; the tile's last block reads the parts past
   L1 (which other SMs' writes do not reach). */
FUSOR_INLINE void fusor_fence() { __threadfence(); }
FUSOR_INLINE unsigned fusor_arrive(unsigned* counter) { return atomicAdd(counter, 1u); }
FUSOR_INLINE float fusor_load_cg(const float* p) { return __ldcg(p); }

/* ------------------------------------------------------ memory moves --- */
FUSOR_INLINE fusor_u32 fusor_smem_addr(const void* p) { return (fusor_u32)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared, asynchronously; bytes past `src_bytes` (0..16)
 * are zero-filled. Both addresses 16-byte aligned. */
FUSOR_INLINE void fusor_cp_async16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(fusor_smem_addr(smem)), "l"(gmem),
               "r"(src_bytes));
}
FUSOR_INLINE void fusor_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/* Waits until at most N of this thread's committed groups are pending. */
template <int N>
FUSOR_INLINE void fusor_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* ldmatrix: 8x8 matrices of b16; lane l gives the address of row l % 8 of
 * matrix l / 8 (16-byte aligned rows); register i of lane l receives row
 * l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i (transposed: the
 * column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1). */
FUSOR_INLINE void fusor_ldmatrix_x4(fusor_u32 r[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(fusor_smem_addr(row)));
}
FUSOR_INLINE void fusor_ldmatrix_x2(fusor_u32 r[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(fusor_smem_addr(row)));
}
FUSOR_INLINE void fusor_ldmatrix_x4_trans(fusor_u32 r[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(fusor_smem_addr(row)));
}
FUSOR_INLINE void fusor_ldmatrix_x2_trans(fusor_u32 r[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(fusor_smem_addr(row)));
}

/* ------------------------------------------------------- matrix units --- */
/* D = A B + D over one warp. m16n8k16: A 16x16 row-major in a[4], B 16x8
 * column-major in b[2], C/D 16x8 f32 in c[4] (lane l: rows l/4 and l/4+8,
 * columns 2 (l%4) and 2 (l%4)+1). */
FUSOR_INLINE void fusor_mma_m16n8k16_f16(float c[4], const fusor_u32 a[4], const fusor_u32 b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
FUSOR_INLINE void fusor_mma_m16n8k16_bf16(float c[4], const fusor_u32 a[4], const fusor_u32 b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* m16n8k8 tf32: a[i] holds A[l/4 + 8 (i%2)][l%4 + 4 (i/2)], b[i] holds
 * B[l%4 + 4 i][l/4]. */
FUSOR_INLINE void fusor_mma_m16n8k8_tf32(float c[4], const fusor_u32 a[4], const fusor_u32 b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#endif /* FUSOR_DEVICE_H */
