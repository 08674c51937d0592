// CUDA C++ code generation for NVIDIA GPUs with mma.sync (sm_80, sm_90).
//
// One thread block per tile of the block loops (the grid is their product),
// of the schedule's warps (space::WarpsOf);
// the stream loop and each op's own loops run inside the block as in the
// CPU nest (loop_nest.h), with every statement spread over the block's
// threads:
//  - a GEMM-shaped sum op stages its operand tiles in shared memory as the
//    mma's input dtype (f16/bf16, or tf32 for f32 chains): with cp.async
//    where a side is one global access contiguous along the staged tile's
//    rows, by a predicated gather otherwise (affine indices, transposes,
//    im2col all become a gather); a tile that changes with every step of
//    the stream loop or of the own loop it sits in is prefetched a step
//    ahead into a second buffer when the schedule has 2 stages
//    (space::StagesOf); warps take 16 x 8*NF output units, load
//    fragments with ldmatrix (trans where the tile is stored k-outer) and
//    accumulate in registers over the tile's reduction;
//  - intermediates live in shared memory (f32), as the nest's local
//    buffers;
//  - softmax rows go one per warp, reduced with shuffles; along the stream
//    dim the softmax is online (running max and sum, the consumer rescales);
//  - map ops (scale, bias, mask, relu, gelu, ...) run elementwise.
// Extents that tiles do not divide are predicated; padding is zero.
// Shared memory is dynamic only: the kernel's figure is in shared_bytes
// and the launcher raises the per-kernel limit when it exceeds 48 KB.
//
// The source includes "fusor_device.h": the device header (PTX wrappers)
// for NVRTC, or the emulation header to run the same source on a CPU.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/codegen/cpu/cpu_codegen.h"
#include "common/codegen/cuda/program.h"
#include "common/hw/target.h"
#include "common/ir/chain.h"
#include "common/space/loop_nest.h"

namespace fusor::codegen {

struct CudaKernel {
  std::string source;  // CUDA C++; includes "fusor_device.h"
  std::string kernel_name = "fusor_fused";
  int64_t grid = 1;          // blocks (1-D)
  int threads = 128;         // per block
  int64_t shared_bytes = 0;  // dynamic shared memory per block
  // A split stream loop's global workspace (0: none): each part's share
  // of the result, the softmax row states, and one arrival counter per
  // tile. It is zero-filled once before the first launch; each launch
  // leaves its counters at zero, so launches that share it must not
  // overlap.
  int64_t workspace_bytes = 0;
  // The argument is one struct by value: {const void* in[...]; void* out[...]}
  // with inputs and outputs in the chain's declaration order, then
  // `void* work` when there is a workspace.
  std::string metadata_json;
};

// The fused kernel for `chain` under `nest`. UNIMPLEMENTED when an op is
// mapped onto an intrinsic this generator cannot emit (only mma.sync).
absl::StatusOr<CudaKernel> EmitCudaFusedKernel(const ir::Chain& chain, const space::LoopNest& nest,
                                               const std::string& schedule_text, const std::string& mapping);

// The fused kernel as a program (its buffers: the chain's inputs, then
// its outputs).
Program FusedProgram(const ir::Chain& chain, const CudaKernel& kernel);

// The unfused baseline a framework would run (cuda_baseline.cc): each op
// over whole tensors, intermediates in global memory in the chain's
// dtype, GEMM-shaped sums through cuBLAS where their operands allow, the
// other ops as kernels of this generator, scheduled by the model for
// `target`. Buffers are the chain's tensors, by id.
absl::StatusOr<Program> EmitCudaUnfusedBaseline(const ir::Chain& chain, const hw::TargetDesc& target);

// A cuBLAS strided batched GEMM for sum op `o`, if its operands allow one:
// one plain access per side, and the rows, columns, reduced and batch dims
// each flattening to one stride per operand (a 1x1 convolution's p, q).
// Buffers are the chain's tensors, by id; the dtype is the chain's.
std::optional<GemmStep> CublasGemmStep(const ir::Chain& chain, int o);

// The reference GPU candidates are validated against on the device
// (cuda_reference.cc): the chain op by op in f32 — 16-bit inputs converted,
// cuBLAS in plain f32 ("f32-exact") where it applies, one thread per point
// otherwise. Buffers 0..T-1 are the chain's tensors in f32 (its outputs
// are the program's outputs); 16-bit inputs come in their own buffers.
Program EmitCudaReference(const ir::Chain& chain);

// Relative tolerance of validation: the mma's inputs are f16, bf16 or
// tf32 (10-bit mantissa for f32 chains), intermediates included.
double CudaTolerance(ir::DType dtype);

// The text of device/fusor_device.h (handed to NVRTC as that header).
absl::string_view CudaDeviceHeader();
// The text of emu/fusor_device.h (it includes "fusor_prelude.inc", the CPU
// prelude).
absl::string_view CudaEmulationHeader();

// A host kernel (exporting fusor_run like a CPU kernel, see cpu_codegen.h)
// that runs a program's exact kernel sources through the emulation header,
// its GEMM steps as host loops with the semantics of GemmStep (cuBLAS runs
// only on a GPU): compile it with CompileKernel and validate it as any CPU
// kernel. A fused kernel runs as FusedProgram(chain, kernel). Scratch is
// filled with 0xff for every run, except zeroed scratch (a workspace),
// zero-filled once and kept across runs as on the device.
KernelSource ProgramEmulationHarness(const Program& program);

}  // namespace fusor::codegen
