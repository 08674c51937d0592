/* fusor device header, host emulation: the same names as
 * device/fusor_device.h, so the exact source fusor hands to NVRTC compiles
 * with a host C++ compiler and runs on a CPU.
 *
 * A launch runs the grid's blocks one after another (spread over host
 * threads with OpenMP); each thread of a block is a fiber (ucontext) with
 * its own stack. __syncthreads is a block barrier; warp-collective
 * primitives (mma, ldmatrix, shuffles) deposit each lane's operands in the
 * warp's exchange area, meet at a warp barrier, compute what the PTX ISA
 * gives that lane, and meet again. cp.async copies are queued per thread
 * and performed when a wait_group retires their group, so a kernel that
 * reads shared memory before waiting sees stale data, as it may on a GPU.
 * A barrier not every live thread reaches is reported as a deadlock, and a
 * misaligned cp.async as the fault it would be on a GPU. */
#ifndef FUSOR_DEVICE_H
#define FUSOR_DEVICE_H
#define FUSOR_EMULATION 1

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <vector>

#include "fusor_prelude.inc" /* f16/bf16 conversions, relu, gelu, sigmoid */

typedef unsigned int fusor_u32;
typedef unsigned short fusor_u16;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define FUSOR_INLINE static inline
#define FUSOR_INFINITY INFINITY
#define FUSOR_DYNAMIC_SMEM(name) unsigned char* const name = fusor_emu::SharedMemory()

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

namespace fusor_emu {

enum Wait { kRunnable, kBlockBarrier, kWarpBarrier, kDone };

struct Lane {
  fusor_u32 r[6];
  const void* ptr;
  float f;
};

struct Copy {
  void* dst;
  const void* src;
  int bytes;
};

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  Wait wait = kRunnable;
  unsigned gen = 0;
  std::vector<std::vector<Copy>> groups;  // committed cp.async groups, oldest first
  std::vector<Copy> open;                 // issued since the last commit
};

struct Warp {
  int arrived = 0;
  unsigned gen = 0;
  Lane lanes[32];
};

struct Block {
  dim3 block_idx, grid_dim, block_dim;
  int threads = 0;
  std::vector<unsigned char> smem;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  int arrived = 0;
  unsigned gen = 0;
  int current = -1;
  ucontext_t scheduler;
  void (*body)(const void*) = nullptr;
  const void* args = nullptr;
  const char* fault = nullptr;  // set by a primitive misused in a way a GPU would fault on
};

inline thread_local Block* t_block = nullptr;
constexpr size_t kStackBytes = 64 * 1024;

inline Fiber& Me() { return t_block->fibers[t_block->current]; }
inline unsigned char* SharedMemory() { return t_block->smem.data(); }
inline void Yield() { swapcontext(&Me().ctx, &t_block->scheduler); }

inline void BlockBarrier() {
  Block* b = t_block;
  const unsigned gen = b->gen;
  if (++b->arrived == b->threads) {
    b->arrived = 0;
    ++b->gen;
    return;
  }
  Me().wait = kBlockBarrier;
  Me().gen = gen;
  Yield();
}

inline Warp& MyWarp() { return t_block->warps[t_block->current / 32]; }
inline int MyLane() { return t_block->current % 32; }
inline Lane& MyLaneSlot() { return MyWarp().lanes[MyLane()]; }

inline void WarpBarrier() {
  Warp& w = MyWarp();
  const unsigned gen = w.gen;
  if (++w.arrived == 32) {
    w.arrived = 0;
    ++w.gen;
    return;
  }
  Me().wait = kWarpBarrier;
  Me().gen = gen;
  Yield();
}

inline void FiberMain() {
  Block* b = t_block;
  b->body(b->args);
  b->fibers[b->current].wait = kDone;
}

inline bool Runnable(const Block& b, int i) {
  const Fiber& f = b.fibers[i];
  switch (f.wait) {
    case kRunnable: return true;
    case kBlockBarrier: return b.gen != f.gen;
    case kWarpBarrier: return b.warps[i / 32].gen != f.gen;
    case kDone: return false;
  }
  return false;
}

// Runs one block to completion; false (with a message) on a deadlock.
inline bool RunBlock(Block& b) {
  for (int i = 0; i < b.threads; ++i) {
    Fiber& f = b.fibers[i];
    f.wait = kRunnable;
    f.groups.clear();
    f.open.clear();
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = &b.scheduler;
    makecontext(&f.ctx, FiberMain, 0);
  }
  for (Warp& w : b.warps) w.arrived = 0;
  b.arrived = 0;
  b.fault = nullptr;
  int done = 0;
  while (done < b.threads) {
    bool progress = false;
    done = 0;
    for (int i = 0; i < b.threads; ++i) {
      if (b.fibers[i].wait == kDone) {
        ++done;
        continue;
      }
      if (!Runnable(b, i)) continue;
      b.fibers[i].wait = kRunnable;
      b.current = i;
      swapcontext(&b.scheduler, &b.fibers[i].ctx);
      progress = true;
    }
    if (!progress && done < b.threads) {
      int at_block = 0, at_warp = 0;
      for (const Fiber& f : b.fibers) {
        at_block += f.wait == kBlockBarrier;
        at_warp += f.wait == kWarpBarrier;
      }
      fprintf(stderr,
              "fusor emulation: deadlock in block %u: %d threads wait at __syncthreads, %d at a warp collective, "
              "%d have exited\n",
              b.block_idx.x, at_block, at_warp, done);
      return false;
    }
  }
  if (b.fault != nullptr) {
    fprintf(stderr, "fusor emulation: block %u: %s\n", b.block_idx.x, b.fault);
    return false;
  }
  return true;
}

// Launches kernel<<<grid, block, smem_bytes>>>(args); 0 on success.
template <typename Args>
int Launch(void (*kernel)(Args), dim3 grid, dim3 block, size_t smem_bytes, const Args& args, int host_threads) {
  struct Thunk {
    static void Run(const void* p) {
      const auto* self = static_cast<const std::pair<void (*)(Args), const Args*>*>(p);
      self->first(*self->second);
    }
  };
  if (block.x % 32 != 0 || block.y != 1 || block.z != 1 || grid.y != 1 || grid.z != 1) {
    fprintf(stderr, "fusor emulation: only 1-D launches of whole warps are emulated\n");
    return 2;
  }
  const std::pair<void (*)(Args), const Args*> call(kernel, &args);
  int failed = 0;
#pragma omp parallel num_threads(host_threads > 0 ? host_threads : 1)
  {
    Block b;
    b.grid_dim = grid;
    b.block_dim = block;
    b.threads = static_cast<int>(block.x);
    b.fibers.resize(b.threads);
    for (Fiber& f : b.fibers) f.stack.resize(kStackBytes);
    b.warps.resize(b.threads / 32);
    b.body = Thunk::Run;
    b.args = &call;
    t_block = &b;
#pragma omp for schedule(dynamic, 1)
    for (long long i = 0; i < static_cast<long long>(grid.x); ++i) {
      if (failed) continue;
      b.block_idx.x = static_cast<unsigned>(i);
      // Fresh shared memory per block, filled with a pattern that is NaN in
      // f32, f16 and bf16: a kernel reading what it never wrote fails.
      b.smem.assign(smem_bytes + 16, 0xff);
      if (!RunBlock(b)) {
#pragma omp atomic write
        failed = 3;
      }
    }
    t_block = nullptr;
  }
  return failed;
}

inline void Retire(std::vector<Copy>& group) {
  for (const Copy& c : group) {
    memcpy(c.dst, c.src, c.bytes);
    memset(static_cast<char*>(c.dst) + c.bytes, 0, 16 - c.bytes);
  }
}

inline void StoreU16(fusor_u32& r, int half, fusor_u16 v) {
  r = half ? ((r & 0xffffu) | (static_cast<fusor_u32>(v) << 16)) : ((r & 0xffff0000u) | v);
}
inline fusor_u16 Half(fusor_u32 r, int half) { return static_cast<fusor_u16>(half ? r >> 16 : r & 0xffffu); }

template <int kMatrices, bool kTrans>
inline void LdMatrix(fusor_u32* r, const void* row) {
  Warp& w = MyWarp();
  const int lane = MyLane();
  w.lanes[lane].ptr = row;
  WarpBarrier();
  for (int i = 0; i < kMatrices; ++i) {
    fusor_u32 v = 0;
    for (int h = 0; h < 2; ++h) {
      const int a = 2 * (lane % 4) + h, b = lane / 4;
      // Element (row, column) of matrix i is at lane (8 i + row)'s address.
      const int mrow = kTrans ? a : b, mcol = kTrans ? b : a;
      fusor_u16 e;
      memcpy(&e, static_cast<const char*>(w.lanes[8 * i + mrow].ptr) + 2 * mcol, 2);
      StoreU16(v, h, e);
    }
    r[i] = v;
  }
  WarpBarrier();
}

inline float Tf32Value(fusor_u32 bits) {
  bits &= 0xffffe000u; /* the unit ignores the low 13 mantissa bits */
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// One warp's D = A B + C; `kind` 0: f16, 1: bf16 (m16n8k16), 2: tf32 (m16n8k8).
inline void Mma(float c[4], const fusor_u32 a[4], const fusor_u32 b[2], int kind) {
  Warp& w = MyWarp();
  const int lane = MyLane();
  Lane& me = w.lanes[lane];
  for (int i = 0; i < 4; ++i) me.r[i] = a[i];
  me.r[4] = b[0];
  me.r[5] = b[1];
  WarpBarrier();
  const int g = lane / 4, t = lane % 4;
  const int depth = kind == 2 ? 8 : 16;
  auto a_at = [&](int row, int k) -> float {
    if (kind == 2) return Tf32Value(w.lanes[(row % 8) * 4 + k % 4].r[(row >= 8) + 2 * (k >= 4)]);
    const fusor_u32 reg = w.lanes[(row % 8) * 4 + (k % 8) / 2].r[(row >= 8) + 2 * (k >= 8)];
    const fusor_u16 h = Half(reg, k % 2);
    return kind == 0 ? fusor_f16_to_f32(h) : fusor_bf16_to_f32(h);
  };
  auto b_at = [&](int k, int col) -> float {
    if (kind == 2) return Tf32Value(w.lanes[col * 4 + k % 4].r[4 + (k >= 4)]);
    const fusor_u32 reg = w.lanes[col * 4 + (k % 8) / 2].r[4 + (k >= 8)];
    const fusor_u16 h = Half(reg, k % 2);
    return kind == 0 ? fusor_f16_to_f32(h) : fusor_bf16_to_f32(h);
  };
  float d[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float s = c[i];
    for (int k = 0; k < depth; ++k) s += a_at(row, k) * b_at(k, col);
    d[i] = s;
  }
  WarpBarrier();
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}

inline dim3 ThreadIdx() { return dim3{static_cast<unsigned>(t_block->current), 1, 1}; }

}  // namespace fusor_emu

#define threadIdx (fusor_emu::ThreadIdx())
#define blockIdx (fusor_emu::t_block->block_idx)
#define blockDim (fusor_emu::t_block->block_dim)
#define gridDim (fusor_emu::t_block->grid_dim)

inline void __syncthreads() { fusor_emu::BlockBarrier(); }

/* ------------------------------------------------------- conversions --- */
FUSOR_INLINE float fusor_exp2(float x) { return exp2f(x); }
FUSOR_INLINE fusor_u32 fusor_pack_f16x2(float lo, float hi) {
  return (fusor_u32)fusor_f32_to_f16(lo) | ((fusor_u32)fusor_f32_to_f16(hi) << 16);
}
FUSOR_INLINE fusor_u32 fusor_pack_bf16x2(float lo, float hi) {
  return (fusor_u32)fusor_f32_to_bf16(lo) | ((fusor_u32)fusor_f32_to_bf16(hi) << 16);
}
FUSOR_INLINE float fusor_round_tf32(float f) {
  fusor_u32 x;
  memcpy(&x, &f, 4);
  if ((x & 0x7f800000u) != 0x7f800000u) x = (x + 0x1000u) & 0xffffe000u; /* nearest, ties away */
  memcpy(&f, &x, 4);
  return f;
}
FUSOR_INLINE fusor_u32 fusor_bits(float f) {
  fusor_u32 x;
  memcpy(&x, &f, 4);
  return x;
}

/* ------------------------------------------------------------ threads --- */
FUSOR_INLINE int fusor_lane() { return fusor_emu::MyLane(); }
FUSOR_INLINE int fusor_warp() { return fusor_emu::t_block->current / 32; }
FUSOR_INLINE float fusor_shfl_xor(float v, int mask) {
  fusor_emu::Warp& w = fusor_emu::MyWarp();
  const int lane = fusor_emu::MyLane();
  w.lanes[lane].f = v;
  fusor_emu::WarpBarrier();
  const float other = w.lanes[lane ^ mask].f;
  fusor_emu::WarpBarrier();
  return other;
}

FUSOR_INLINE float fusor_shfl(float v, int src_lane) {
  fusor_emu::Warp& w = fusor_emu::MyWarp();
  const int lane = fusor_emu::MyLane();
  w.lanes[lane].f = v;
  fusor_emu::WarpBarrier();
  const float other = w.lanes[src_lane & 31].f;
  fusor_emu::WarpBarrier();
  return other;
}

FUSOR_INLINE void fusor_fence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
FUSOR_INLINE unsigned fusor_arrive(unsigned* counter) { return __atomic_fetch_add(counter, 1u, __ATOMIC_SEQ_CST); }
FUSOR_INLINE float fusor_load_cg(const float* p) {
  float v;
  __atomic_load(p, &v, __ATOMIC_RELAXED);
  return v;
}

/* ------------------------------------------------------ memory moves --- */
FUSOR_INLINE void fusor_cp_async16(void* smem, const void* gmem, int src_bytes) {
  if (((uintptr_t)smem | (uintptr_t)gmem) % 16 != 0 || src_bytes < 0 || src_bytes > 16) {
    fusor_emu::t_block->fault = "cp.async with a misaligned address or a size outside [0, 16]";
    return;
  }
  fusor_emu::Me().open.push_back({smem, gmem, src_bytes});
}
FUSOR_INLINE void fusor_cp_async_commit() {
  fusor_emu::Fiber& f = fusor_emu::Me();
  f.groups.push_back(f.open);
  f.open.clear();
}
template <int N>
inline void fusor_cp_async_wait() {
  fusor_emu::Fiber& f = fusor_emu::Me();
  while (f.groups.size() > static_cast<size_t>(N)) {
    fusor_emu::Retire(f.groups.front());
    f.groups.erase(f.groups.begin());
  }
}

FUSOR_INLINE void fusor_ldmatrix_x4(fusor_u32 r[4], const void* row) { fusor_emu::LdMatrix<4, false>(r, row); }
FUSOR_INLINE void fusor_ldmatrix_x2(fusor_u32 r[2], const void* row) { fusor_emu::LdMatrix<2, false>(r, row); }
FUSOR_INLINE void fusor_ldmatrix_x4_trans(fusor_u32 r[4], const void* row) { fusor_emu::LdMatrix<4, true>(r, row); }
FUSOR_INLINE void fusor_ldmatrix_x2_trans(fusor_u32 r[2], const void* row) { fusor_emu::LdMatrix<2, true>(r, row); }

/* ------------------------------------------------------- matrix units --- */
FUSOR_INLINE void fusor_mma_m16n8k16_f16(float c[4], const fusor_u32 a[4], const fusor_u32 b[2]) {
  fusor_emu::Mma(c, a, b, 0);
}
FUSOR_INLINE void fusor_mma_m16n8k16_bf16(float c[4], const fusor_u32 a[4], const fusor_u32 b[2]) {
  fusor_emu::Mma(c, a, b, 1);
}
FUSOR_INLINE void fusor_mma_m16n8k8_tf32(float c[4], const fusor_u32 a[4], const fusor_u32 b[2]) {
  fusor_emu::Mma(c, a, b, 2);
}

#endif /* FUSOR_DEVICE_H */
