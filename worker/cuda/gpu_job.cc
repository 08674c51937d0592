#include "worker/cuda/gpu_job.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codegen/cuda/cuda_codegen.h"
#include "common/codegen/cuda/nvrtc.h"
#include "common/hw/intrinsic.h"
#include "common/space/loop_nest.h"
#include "common/space/schedule.h"
#include "common/util/status_macros.h"
#include "worker/cpu/measure.h"
#include "worker/cuda/gpu_runtime.h"
#include "worker/process.h"

namespace fusor::worker {
namespace {

// P is the model's dense f16 tensor rate; the calibration measures
// mma.sync, which reaches the registry's share of it.
double PeakFromMmaRate(double mma_rate) {
  const hw::Intrinsic* mma = hw::FindIntrinsic("mma.sync.m16n8k16.f16");
  return mma != nullptr && mma->rate > 0 ? mma_rate / mma->rate : mma_rate;
}

JobOutcome Calibrate(gpu::Runtime& rt, const JobSpec& spec) {
  std::string why;
  JobOutcome out;
  out.bandwidth_bytes_per_s = rt.CopyBandwidth(spec.timing.time_budget_s, &why);
  if (out.bandwidth_bytes_per_s <= 0) return FailedOutcome(OutcomeStatus::kRuntimeError, "copy bandwidth: " + why);
  const double mma = rt.MmaRate(spec.timing.time_budget_s, &why);
  if (mma <= 0) return FailedOutcome(OutcomeStatus::kRuntimeError, "mma rate: " + why);
  out.peak_flops = PeakFromMmaRate(mma);
  out.status = OutcomeStatus::kOk;
  return out;
}

// The program a job measures: the candidate's fused kernel or the
// unfused baseline.
absl::StatusOr<codegen::Program> JobProgram(const JobSpec& spec, const ir::Chain& chain) {
  if (spec.kind == JobKind::kBaseline) return codegen::EmitCudaUnfusedBaseline(chain, spec.target);
  ASSIGN_OR_RETURN(space::Schedule schedule, space::ParseSchedule(spec.schedule_text, chain));
  ASSIGN_OR_RETURN(space::LoopNest nest, space::BuildLoopNest(chain, schedule, spec.target));
  ASSIGN_OR_RETURN(codegen::CudaKernel kernel,
                   codegen::EmitCudaFusedKernel(chain, nest, spec.schedule_text, spec.mapping));
  return codegen::FusedProgram(chain, kernel);
}

// The launch shape and ptxas's report of each kernel step, as JSON.
std::string ResourcesJson(const codegen::Program& program, const codegen::CompiledProgram& compiled) {
  nlohmann::json kernels = nlohmann::json::array();
  size_t k = 0;
  for (const codegen::ProgramStep& step : program.steps) {
    nlohmann::json j = {{"step", step.what}};
    if (!step.is_gemm) {
      j["grid"] = step.kernel.grid;
      j["threads"] = step.kernel.threads;
      j["dynamic_shared_bytes"] = step.kernel.shared_bytes;
      if (k < compiled.usage.size()) {
        const codegen::ResourceUsage& u = compiled.usage[k++];
        j["registers"] = u.registers;
        j["stack_bytes"] = u.stack_bytes;
        j["spill_store_bytes"] = u.spill_store_bytes;
        j["spill_load_bytes"] = u.spill_load_bytes;
        j["static_shared_bytes"] = u.static_shared_bytes;
      }
    }
    kernels.push_back(j);
  }
  return kernels.dump();
}

std::string CubinPath(const std::string& dir, size_t step) { return absl::StrCat(dir, "/step", step, ".cubin"); }

// Device buffers for the chain's inputs and outputs, freed on scope exit.
struct Buffers {
  gpu::Runtime& rt;
  std::vector<CUdeviceptr> in, out;
  std::vector<size_t> in_bytes, out_bytes;
  ~Buffers() {
    for (CUdeviceptr p : in) rt.Free(p);
    for (CUdeviceptr p : out) rt.Free(p);
  }
};

// Validates and times a compiled program on fresh inputs.
JobOutcome MeasureProgram(gpu::Runtime& rt, const JobSpec& spec, const ir::Chain& chain,
                          const codegen::Program& program, const codegen::CompiledProgram& compiled) {
  std::string why;
  gpu::LoadedProgram loaded;
  if (!loaded.Prepare(rt, program, compiled, &why)) return FailedOutcome(OutcomeStatus::kRuntimeError, why);
  JobOutcome out;
  Buffers buf{rt, {}, {}, {}, {}};
  for (int t : chain.inputs) buf.in_bytes.push_back(chain.tensors[t].NumElements() * ir::DTypeBytes(chain.dtype));
  for (int t : chain.outputs) buf.out_bytes.push_back(chain.tensors[t].NumElements() * ir::DTypeBytes(chain.dtype));
  for (size_t b : buf.in_bytes) buf.in.push_back(rt.Alloc(b, &why));
  for (size_t b : buf.out_bytes) buf.out.push_back(rt.Alloc(b, &why));
  for (const std::vector<CUdeviceptr>* list : {&buf.in, &buf.out}) {
    for (CUdeviceptr p : *list) {
      if (p == 0) return FailedOutcome(OutcomeStatus::kRuntimeError, why);
    }
  }
  auto run = [&](std::string* w) { return loaded.Run(buf.in, buf.out, w); };

  // Validation: fresh inputs, outputs poisoned (all-ones bytes are NaN in
  // every dtype), every element against the float64 reference.
  std::string run_error;
  auto valid = ValidateRun(
      [&](const void* const* in, void* const* outputs) {
        for (size_t i = 0; i < buf.in.size(); ++i) {
          if (!rt.Upload(buf.in[i], in[i], buf.in_bytes[i], &run_error)) return 1;
        }
        for (size_t i = 0; i < buf.out.size(); ++i) {
          if (!rt.Fill(buf.out[i], 0xff, buf.out_bytes[i], &run_error)) return 1;
        }
        if (!run(&run_error) || !rt.Synchronize(&run_error)) return 2;
        for (size_t i = 0; i < buf.out.size(); ++i) {
          if (!rt.Download(outputs[i], buf.out[i], buf.out_bytes[i], &run_error)) return 1;
        }
        return 0;
      },
      chain, RandomInputs(chain, spec.seed), codegen::CudaTolerance(chain.dtype));
  if (!RecordValidation(valid, out)) {
    if (!valid.ok() && !run_error.empty()) out.error = run_error;  // the CUDA error, not just its code
    return out;
  }
  gpu::TimingPlan plan;
  plan.warmup = spec.timing.warmup;
  plan.min_repeats = spec.timing.min_repeats;
  plan.max_repeats = spec.timing.max_repeats;
  plan.time_budget_s = spec.timing.time_budget_s;
  if (!rt.Time(run, plan, &out.samples_s, &why)) {
    out.status = OutcomeStatus::kRuntimeError;
    out.error = why;
    return out;
  }
  out.median_s = Median(out.samples_s);
  out.status = OutcomeStatus::kOk;
  return out;
}

}  // namespace

absl::StatusOr<hw::TargetDesc> DescribeGpuTarget(int ordinal) {
  gpu::DeviceInfo info;
  std::string why;
  if (!gpu::DescribeDevice(ordinal, &info, &why)) return absl::FailedPreconditionError(why);
  const codegen::Nvrtc* nvrtc = codegen::Nvrtc::Get(&why);
  if (nvrtc == nullptr) return absl::FailedPreconditionError(why);
  hw::TargetDesc t;
  t.backend = hw::Backend::kCuda;
  t.arch = info.arch;
  t.device_name = info.name;
  t.compute_units = info.sm_count;
  t.l2_bytes = info.l2_bytes;
  t.shared_mem_per_block = info.shared_optin_bytes;
  t.compiler = nvrtc->Version();
  return t;
}

JobOutcome CalibrateCudaJob(const JobSpec& spec) {
  std::string why;
  auto rt = gpu::Runtime::Open(spec.device, std::string(codegen::CudaDeviceHeader()), &why);
  if (rt == nullptr) return FailedOutcome(OutcomeStatus::kRuntimeError, why);
  return Calibrate(*rt, spec);
}

JobOutcome CompileCudaJob(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) {
  auto program = JobProgram(spec, chain);
  if (!program.ok()) return FailedOutcome(OutcomeStatus::kCompileError, std::string(program.status().message()));
  codegen::DeviceLimits limits = codegen::LimitsForArch(spec.target.arch);
  if (spec.target.shared_mem_per_block > 0) limits.max_shared_per_block = spec.target.shared_mem_per_block;
  codegen::CompiledProgram compiled;
  std::string why;
  const bool ok = codegen::CompileProgram(*program, spec.target.arch, std::string(codegen::CudaDeviceHeader()),
                                          limits, &compiled, &why);
  JobOutcome out;
  out.compile_s = compiled.compile_s;
  out.compile_flags = absl::StrJoin(compiled.options, " ");
  out.code_bytes = compiled.code_bytes;
  out.resources_json = ResourcesJson(*program, compiled);
  if (!ok) {
    out.status = OutcomeStatus::kCompileError;
    out.error = "rejected before running: " + why;
    return out;
  }
  absl::Status written = WriteFile(dir + "/program.txt", codegen::ProgramToText(*program));
  for (size_t i = 0; written.ok() && i < compiled.cubins.size(); ++i) {
    if (!compiled.cubins[i].empty()) written = WriteFile(CubinPath(dir, i), compiled.cubins[i]);
  }
  if (!written.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(written.message()));
  out.status = OutcomeStatus::kOk;
  return out;
}

JobOutcome MeasureCudaJob(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) {
  auto text = ReadFile(dir + "/program.txt");
  if (!text.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(text.status().message()));
  codegen::Program program;
  std::string why;
  if (!codegen::ProgramFromText(*text, &program, &why)) return FailedOutcome(OutcomeStatus::kRuntimeError, why);
  codegen::CompiledProgram compiled;
  compiled.cubins.resize(program.steps.size());
  for (size_t i = 0; i < program.steps.size(); ++i) {
    if (program.steps[i].is_gemm) continue;
    auto cubin = ReadFile(CubinPath(dir, i));
    if (!cubin.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(cubin.status().message()));
    compiled.cubins[i] = std::move(*cubin);
  }
  auto rt = gpu::Runtime::Open(spec.device, std::string(codegen::CudaDeviceHeader()), &why);
  if (rt == nullptr) return FailedOutcome(OutcomeStatus::kRuntimeError, why);
  return MeasureProgram(*rt, spec, chain, program, compiled);
}

}  // namespace fusor::worker
