// C++ code generation for the CPU backend.
//
// Every emitted kernel is one self-contained translation unit exporting
//   extern "C" int fusor_run(const void* const* inputs, void* const* outputs,
//                            int num_threads);
// with inputs and outputs in the chain's declaration order, each a dense
// row-major array of the chain's dtype (uint16_t bits for f16/bf16). It
// returns 0 on success and nonzero if it could not allocate its scratch.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/ir/chain.h"
#include "common/hw/target.h"
#include "common/space/loop_nest.h"

namespace fusor::codegen {

struct KernelSource {
  std::string source;
  std::string entry_point = "fusor_run";
  // Flags the source is meant to be compiled with (besides -shared -fPIC).
  std::vector<std::string> compile_flags;
  std::vector<std::string> link_libs;  // e.g. "openblas"
  std::string metadata_json;           // arguments, shapes, schedule
  // Files the source includes, written next to it: (file name, text).
  std::vector<std::pair<std::string, std::string>> extra_files;
};

// The text every emitted CPU kernel starts with after its title comment
// (headers, the prelude, the SIMD helpers), the same in every kernel: a
// worker compiles it once as a precompiled header (worker/cpu/compiler.h).
std::string CpuKernelPreamble();

// The fused kernel for `chain` under `nest` (from BuildLoopNest).
// `schedule_text` and `mapping` go into the header comment and metadata.
absl::StatusOr<KernelSource> EmitCpuFusedKernel(const ir::Chain& chain, const space::LoopNest& nest,
                                                const std::string& schedule_text,
                                                const std::string& mapping);

// The bytes the fused kernel of `nest` moves through the caches besides its
// micro-kernels' operands: packs, accumulator copies (strided ones
// weighted) and map passes, as its emitter plans them (the CPU cost
// model's view of the emitter).
double CpuStagingBytes(const ir::Chain& chain, const space::LoopNest& nest);

// The BLAS an unfused baseline calls: OpenBLAS (cblas_sgemm) or oneDNN
// (dnnl_sgemm); "openblas" or "onednn".
enum class CpuBlas { kOpenBlas, kOneDnn };
const char* CpuBlasName(CpuBlas blas);
// The BLAS of that name; nullopt for any other.
std::optional<CpuBlas> CpuBlasNamed(absl::string_view name);

// The unfused chain as a user would otherwise run it: each op over whole
// tensors in turn, GEMM-shaped sums through `blas` (batches of small GEMMs
// in parallel, each on one thread), softmax and elementwise ops as separate
// parallel vector passes.
absl::StatusOr<KernelSource> EmitCpuUnfusedBaseline(const ir::Chain& chain, CpuBlas blas = CpuBlas::kOpenBlas);

// The kernel of a split schedule text (space/split.h): each part's kernel,
// fused under its schedule or unfused through its library, called in turn;
// fusor_prepare where a part has one. `target` builds the fused parts'
// nests.
absl::StatusOr<KernelSource> EmitCpuSplitKernel(const ir::Chain& chain, const std::string& schedule_text,
                                                const hw::TargetDesc& target);

}  // namespace fusor::codegen
