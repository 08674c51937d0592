// The CUDA backend: candidates are CUDA C++ compiled by NVRTC to cubins,
// validated and timed through the driver API (worker/cuda/gpu_job.h; in a
// build without the toolkit those parts say so). The Compile answer needs
// neither a GPU nor the toolkit's headers: NVRTC is loaded at run time,
// and without it the answer carries the source alone.
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/codegen/cuda/cuda_codegen.h"
#include "common/codegen/cuda/nvrtc.h"
#include "common/util/status_macros.h"
#include "worker/backend.h"
#include "worker/cuda/gpu_job.h"

namespace fusor::worker {
namespace {

class Cuda final : public Backend {
 public:
  hw::Backend kind() const override { return hw::Backend::kCuda; }
  const char* name() const override { return "cuda"; }

  absl::StatusOr<hw::TargetDesc> Describe(const MachineOptions& options) const override {
    return DescribeGpuTarget(options.device);
  }

  std::string Summary(const hw::TargetDesc& t) const override {
    return absl::StrFormat("CUDA backend: %s (%s, %d SMs, L2 %d MiB, %d KiB shared memory per block); "
                           "W = %.1f GB/s, P = %.1f TFLOP/s; compiler: %s",
                           t.device_name, t.arch, t.compute_units, t.l2_bytes >> 20, t.shared_mem_per_block >> 10,
                           t.bandwidth_bytes_per_s / 1e9, t.peak_flops / 1e12, t.compiler);
  }

  // NVRTC runs on the CPU while the GPU measures.
  int DefaultCompileAhead() const override { return 2; }
  bool CompilesDuringMeasurement() const override { return true; }

  JobOutcome Calibrate(const JobSpec& spec, const std::string&) const override { return CalibrateCudaJob(spec); }
  JobOutcome Build(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) const override {
    return CompileCudaJob(spec, chain, dir);
  }
  JobOutcome Run(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) const override {
    return MeasureCudaJob(spec, chain, dir);
  }

  // The answer is one __global__ kernel: no room for cuBLAS calls or a
  // second kernel.
  absl::StatusOr<KernelAnswer> AnswerComposite(const ir::Chain&, const std::string& schedule_text,
                                               const hw::TargetDesc&) const override {
    return absl::UnimplementedError(
        absl::StrCat("a CUDA answer is one fused kernel; it cannot run '", schedule_text, "'"));
  }

  // The kernel's source with the device header in place of its #include,
  // its launch in the metadata, and its cubin for the target's arch when
  // NVRTC is here (the metadata says why when it is not).
  absl::StatusOr<KernelAnswer> Answer(const ir::Chain& chain, const space::LoopNest& nest,
                                      const std::string& schedule_text, const std::string& mapping,
                                      const hw::TargetDesc& target) const override {
    ASSIGN_OR_RETURN(codegen::CudaKernel kernel, codegen::EmitCudaFusedKernel(chain, nest, schedule_text, mapping));
    const std::string header(codegen::CudaDeviceHeader());
    KernelAnswer answer;
    answer.language = "cuda";
    answer.entry_point = kernel.kernel_name;
    answer.source = absl::StrReplaceAll(kernel.source, {{"#include \"fusor_device.h\"\n", header}});
    nlohmann::json meta = nlohmann::json::parse(kernel.metadata_json);
    meta["launch"] = {{"grid", {kernel.grid, 1, 1}},
                      {"block", {kernel.threads, 1, 1}},
                      {"dynamic_shared_bytes", kernel.shared_bytes},
                      {"note", "above 48 KiB, raise CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES first"}};
    if (kernel.workspace_bytes > 0) {
      meta["launch"]["workspace"] = {
          {"bytes", kernel.workspace_bytes},
          {"note", "pass as args.work; zero-fill it once before the first launch (each launch leaves it zeroed); "
                   "launches sharing one workspace must not overlap"}};
    }
    std::string why;
    if (const codegen::Nvrtc* nvrtc = codegen::Nvrtc::Get(&why)) {
      codegen::NvrtcOutput built = nvrtc->Compile(kernel.source, target.arch, {{"fusor_device.h", header}});
      if (built.ok) {
        answer.binary = std::move(built.cubin);
        answer.binary_format = "cubin";
        meta["binary"] = {{"arch", built.arch},
                          {"compiler", nvrtc->Version()},
                          {"options", built.options},
                          {"registers", built.usage.registers},
                          {"spill_store_bytes", built.usage.spill_store_bytes}};
      } else {
        why = "NVRTC: " + built.log;
      }
    }
    if (answer.binary.empty()) meta["binary"] = {{"missing", why}};
    // NVRTC's log may hold bytes that are not UTF-8: replaced, not thrown.
    answer.metadata_json = meta.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    return answer;
  }
};

}  // namespace

const Backend& CudaBackend() {
  static const Cuda backend;
  return backend;
}

}  // namespace fusor::worker
