#include "worker/cuda/gpu_job.h"

#include "common/util/timing.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codegen/cuda/cuda_codegen.h"
#include "common/codegen/cuda/nvrtc.h"
#include "common/hw/intrinsic.h"
#include "common/space/loop_nest.h"
#include "common/space/schedule.h"
#include "common/util/files.h"
#include "common/util/status_macros.h"
#include "worker/validate.h"
#include "worker/cuda/gpu_runtime.h"

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

// A compiled program in `dir`: <name>.txt and <name>.step<i>.cubin.
absl::Status WriteCompiled(const std::string& dir, const std::string& name, const codegen::Program& program,
                           const codegen::CompiledProgram& compiled) {
  absl::Status written = WriteFile(absl::StrCat(dir, "/", name, ".txt"), codegen::ProgramToText(program));
  for (size_t i = 0; written.ok() && i < compiled.cubins.size(); ++i) {
    if (!compiled.cubins[i].empty()) {
      written = WriteFile(absl::StrCat(dir, "/", name, ".step", i, ".cubin"), compiled.cubins[i]);
    }
  }
  return written;
}

absl::Status ReadCompiled(const std::string& dir, const std::string& name, codegen::Program* program,
                          codegen::CompiledProgram* compiled) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(absl::StrCat(dir, "/", name, ".txt")));
  std::string why;
  if (!codegen::ProgramFromText(text, program, &why)) return absl::DataLossError(why);
  compiled->cubins.assign(program->steps.size(), "");
  for (size_t i = 0; i < program->steps.size(); ++i) {
    if (program->steps[i].is_gemm) continue;
    ASSIGN_OR_RETURN(compiled->cubins[i], ReadFile(absl::StrCat(dir, "/", name, ".step", i, ".cubin")));
  }
  return absl::OkStatus();
}

codegen::DeviceLimits TargetLimits(const hw::TargetDesc& target) {
  codegen::DeviceLimits limits = codegen::LimitsForArch(target.arch);
  if (target.shared_mem_per_block > 0) limits.max_shared_per_block = target.shared_mem_per_block;
  return limits;
}

// Device buffers for the chain's inputs and outputs, freed on scope exit.
struct Buffers {
  gpu::Runtime& rt;
  std::vector<gpu::DevicePtr> in, out;
  std::vector<size_t> in_bytes, out_bytes;
  ~Buffers() {
    for (gpu::DevicePtr p : in) rt.Free(p);
    for (gpu::DevicePtr p : out) rt.Free(p);
  }
};

// Validates and times a compiled program on fresh inputs, against the
// f32 reference program (EmitCudaReference) run on the same device inputs.
JobOutcome MeasureProgram(gpu::Runtime& rt, const JobSpec& spec, const ir::Chain& chain,
                          const codegen::Program& program, const codegen::CompiledProgram& compiled,
                          const codegen::Program& reference, const codegen::CompiledProgram& reference_compiled) {
  std::string why;
  gpu::LoadedProgram loaded, expected;
  if (!loaded.Prepare(rt, program, compiled, &why)) return FailedOutcome(OutcomeStatus::kRuntimeError, why);
  if (!expected.Prepare(rt, reference, reference_compiled, &why)) {
    return FailedOutcome(OutcomeStatus::kRuntimeError, "reference: " + why);
  }
  JobOutcome out;
  Buffers buf{rt, {}, {}, {}, {}};
  Buffers ref{rt, {}, {}, {}, {}};  // the reference's f32 outputs
  for (int t : chain.outputs) {
    ref.out_bytes.push_back(chain.tensors[t].NumElements() * sizeof(float));
    ref.out.push_back(rt.Alloc(ref.out_bytes.back(), &why));
    if (ref.out.back() == 0) return FailedOutcome(OutcomeStatus::kRuntimeError, why);
  }
  for (int t : chain.inputs) buf.in_bytes.push_back(chain.tensors[t].NumElements() * ir::DTypeBytes(chain.dtype));
  for (int t : chain.outputs) buf.out_bytes.push_back(chain.tensors[t].NumElements() * ir::DTypeBytes(chain.dtype));
  for (size_t b : buf.in_bytes) buf.in.push_back(rt.Alloc(b, &why));
  for (size_t b : buf.out_bytes) buf.out.push_back(rt.Alloc(b, &why));
  for (const std::vector<gpu::DevicePtr>* list : {&buf.in, &buf.out}) {
    for (gpu::DevicePtr p : *list) {
      if (p == 0) return FailedOutcome(OutcomeStatus::kRuntimeError, why);
    }
  }
  auto run = [&](std::string* w) { return loaded.Run(buf.in, buf.out, w); };

  // Validation: fresh inputs, outputs poisoned (all-ones bytes are NaN in
  // every dtype), every element against the reference, computed on the
  // device from the same inputs before the candidate runs.
  std::string run_error;
  Outputs expected_values(chain.outputs.size());
  auto run_reference = [&]() {
    for (size_t i = 0; i < ref.out.size(); ++i) {
      if (!rt.Fill(ref.out[i], 0xff, ref.out_bytes[i], &run_error)) return false;
    }
    if (!expected.Run(buf.in, ref.out, &run_error) || !rt.Synchronize(&run_error)) {
      run_error = "reference: " + run_error;
      return false;
    }
    for (size_t i = 0; i < ref.out.size(); ++i) {
      std::vector<float> host(ref.out_bytes[i] / sizeof(float));
      if (!rt.Download(host.data(), ref.out[i], ref.out_bytes[i], &run_error)) return false;
      expected_values[i].assign(host.begin(), host.end());
    }
    return true;
  };
  auto valid = ValidateRun(
      [&](const void* const* in, void* const* outputs) {
        for (size_t i = 0; i < buf.in.size(); ++i) {
          if (!rt.Upload(buf.in[i], in[i], buf.in_bytes[i], &run_error)) return 1;
        }
        if (!run_reference()) return 1;
        for (size_t i = 0; i < buf.out.size(); ++i) {
          if (!rt.Fill(buf.out[i], 0xff, buf.out_bytes[i], &run_error)) return 1;
        }
        if (!run(&run_error) || !rt.Synchronize(&run_error)) return 2;
        for (size_t i = 0; i < buf.out.size(); ++i) {
          if (!rt.Download(outputs[i], buf.out[i], buf.out_bytes[i], &run_error)) return 1;
        }
        return 0;
      },
      chain, RandomInputs(chain, spec.seed), codegen::CudaTolerance(chain.dtype),
      [&](const std::vector<std::vector<double>>&) -> absl::StatusOr<Outputs> { return expected_values; });
  if (!RecordValidation(valid, out)) {
    if (!valid.ok() && !run_error.empty()) out.error = run_error;  // the CUDA error, not just its code
    return out;
  }
  gpu::TimingPlan plan;
  plan.warmup = spec.timing.warmup;
  plan.min_repeats = std::max(spec.timing.min_repeats, kMinSamples);
  plan.max_repeats = std::max(spec.timing.max_repeats, plan.min_repeats);
  plan.time_budget_s = spec.timing.time_budget_s;
  auto timed = MeasureTrusted([&]() -> absl::StatusOr<std::vector<double>> {
    std::vector<double> samples;
    if (!rt.Time(run, plan, &samples, &why)) return absl::InternalError(why);
    return samples;
  }, kSampleSets, spec.timing.max_spread);
  if (!timed.ok()) {
    out.status = OutcomeStatus::kRuntimeError;
    out.error = std::string(timed.status().message());
    return out;
  }
  RecordTiming(*timed, out);
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
  const std::string header(codegen::CudaDeviceHeader());
  codegen::CompiledProgram compiled;
  std::string why;
  const bool ok = codegen::CompileProgram(*program, spec.target.arch, header, TargetLimits(spec.target), &compiled, &why);
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
  const codegen::Program reference = codegen::EmitCudaReference(chain);
  codegen::CompiledProgram reference_compiled;
  if (!codegen::CompileProgram(reference, spec.target.arch, header, TargetLimits(spec.target), &reference_compiled,
                               &why)) {
    return FailedOutcome(OutcomeStatus::kRuntimeError, "the validation reference does not compile: " + why);
  }
  absl::Status written = WriteCompiled(dir, "program", *program, compiled);
  if (written.ok()) written = WriteCompiled(dir, "reference", reference, reference_compiled);
  if (!written.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(written.message()));
  out.status = OutcomeStatus::kOk;
  return out;
}

JobOutcome MeasureCudaJob(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) {
  codegen::Program program, reference;
  codegen::CompiledProgram compiled, reference_compiled;
  absl::Status read = ReadCompiled(dir, "program", &program, &compiled);
  if (read.ok()) read = ReadCompiled(dir, "reference", &reference, &reference_compiled);
  if (!read.ok()) return FailedOutcome(OutcomeStatus::kRuntimeError, std::string(read.message()));
  std::string why;
  auto rt = gpu::Runtime::Open(spec.device, std::string(codegen::CudaDeviceHeader()), &why);
  if (rt == nullptr) return FailedOutcome(OutcomeStatus::kRuntimeError, why);
  return MeasureProgram(*rt, spec, chain, program, compiled, reference, reference_compiled);
}

}  // namespace fusor::worker
