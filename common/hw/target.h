// The hardware a candidate is tuned for, as fusor_core sees it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusor::hw {

enum class Backend { kCpu, kCuda };

struct TargetDesc {
  Backend backend = Backend::kCpu;
  std::string arch;         // "x86-64-avx2", "x86-64-avx512", "sm_90", ...
  std::string device_name;
  int compute_units = 1;    // N_SM of the model: cores or multiprocessors
  int vector_lanes_f32 = 1;
  std::vector<std::string> isa_features;
  int64_t l1d_bytes = 0;
  int64_t l2_bytes = 0;
  int64_t l3_bytes = 0;
  int64_t shared_mem_per_block = 0;
  std::string compiler;
  double bandwidth_bytes_per_s = 0;  // W, calibrated
  double peak_flops = 0;             // P, calibrated

  bool HasFeature(const std::string& f) const;
};

// "cpu-" or "cuda-" plus 16 hex digits over the identity fields (everything
// but the calibrated W and P, which vary from run to run).
std::string TargetFingerprint(const TargetDesc& target);

// The matrix unit a target's GEMM-shaped compute maps onto. On a CPU, the
// register-blocked SIMD FMA outer-product micro-kernel: an mr x nr block of
// C kept in registers, updated by one column of packed A and one row of
// packed B per step. On a GPU, the tensor-core tile (mr x nr per warp
// instruction group); tiles are padded to multiples of mr and nr.
struct MicroKernel {
  std::string name;  // e.g. "fma.avx2.6x16"
  int lanes = 1;     // f32 lanes per vector register (CPU)
  int mr = 1;
  int nr = 1;        // a multiple of lanes
};

// Scratch one block may use for intermediates and packed tiles: the
// core's private caches (CPU) or the shared memory per block (GPU).
int64_t ScratchBudget(const TargetDesc& target);

}  // namespace fusor::hw
