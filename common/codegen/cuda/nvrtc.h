// In-process CUDA compilation with NVRTC, loaded at run time (dlopen), so
// every binary builds and starts without the CUDA toolkit and reports its
// absence only when asked to compile. Plain C++17 (no project libraries):
// the GPU device check builds it on machines that have only CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/codegen/cuda/program.h"

namespace fusor::codegen {

// ptxas's resource report for the kernel (-1: not reported).
struct ResourceUsage {
  int registers = -1;  // per thread
  int64_t stack_bytes = -1;
  int64_t spill_store_bytes = -1;
  int64_t spill_load_bytes = -1;
  int64_t static_shared_bytes = 0;
};

struct NvrtcOutput {
  bool ok = false;
  std::string log;                   // NVRTC's log: errors, or ptxas -v
  std::string cubin;                 // the binary for `arch`
  std::string ptx;                   // instead, for a virtual arch
  std::string arch;                  // e.g. "sm_90", or "compute_90" for PTX
  std::vector<std::string> options;  // as passed to NVRTC
  double seconds = 0;
  ResourceUsage usage;
};

class Nvrtc {
 public:
  // The process-wide instance; nullptr when no libnvrtc could be loaded,
  // with where it looked in `why`.
  static const Nvrtc* Get(std::string* why = nullptr);

  // "NVRTC 13.0"
  std::string Version() const;

  // Compiles `source` (CUDA C++, extern "C" kernels) to a cubin for `arch`
  // (sm_80, sm_86, sm_89, sm_90, ...), or to PTX for a virtual arch
  // (compute_90), with `headers` available to
  // #include by name. Compile errors are in the outcome, never a Status.
  NvrtcOutput Compile(const std::string& source, const std::string& arch,
                      const std::vector<std::pair<std::string, std::string>>& headers) const;

  struct Api;  // the entry points, resolved once

 private:
  explicit Nvrtc(const Api* api) : api_(api) {}
  const Api* api_;
};

// The size in bytes of each parameter of kernel `kernel` as the PTX
// declares it (-1 for one it cannot read); {-1} when there is no such
// entry. The launch contract (gpu_runtime.h) is one struct parameter.
std::vector<int64_t> PtxEntryParamBytes(const std::string& ptx, const std::string& kernel);

// Parses ptxas -v output (one kernel) into a resource report.
ResourceUsage ParsePtxasReport(const std::string& log);

// Limits of the GPU a kernel will run on.
struct DeviceLimits {
  int max_registers_per_thread = 255;
  int max_threads_per_block = 1024;
  int64_t registers_per_sm = 65536;
  int64_t max_shared_per_block = 48 << 10;  // opt-in maximum (dynamic + static)
};
// The opt-in limits of an arch from the datasheets (sm_80: 163 KB of
// shared memory per block, sm_86/89: 99 KB, sm_90: 227 KB).
DeviceLimits LimitsForArch(const std::string& arch);

// "" when a compiled kernel can launch `threads` threads with
// `dynamic_shared` bytes on a device without spilling; else the reason.
std::string CheckResources(const ResourceUsage& usage, int threads, int64_t dynamic_shared,
                           const DeviceLimits& limits);

// A program's kernels compiled for one arch: what a GPU needs to run it
// (the worker compiles a candidate while the device measures another).
struct CompiledProgram {
  std::vector<std::string> cubins;  // per step ("" for GEMM steps)
  std::vector<ResourceUsage> usage;  // per kernel step, in order
  std::vector<std::string> options;  // NVRTC's, for the record
  double compile_s = 0;
  int64_t code_bytes = 0;
};

// Compiles every kernel step of `program` for `arch` with the device
// header's text, and checks each against `limits`. false (with `why`) when
// a kernel does not compile or does not fit: such a program never runs.
// `out` holds what was compiled so far either way.
bool CompileProgram(const Program& program, const std::string& arch, const std::string& device_header,
                    const DeviceLimits& limits, CompiledProgram* out, std::string* why);

}  // namespace fusor::codegen
