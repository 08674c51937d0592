#include "worker/cuda/gpu_job.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codegen/cuda/cuda_codegen.h"
#include "common/codegen/cuda/nvrtc.h"
#include "common/hw/intrinsic.h"
#include "common/space/loop_nest.h"
#include "common/space/schedule.h"
#include "worker/cpu/measure.h"
#include "worker/cuda/gpu_runtime.h"

namespace fusor::worker {
namespace {

JobOutcome Fail(OutcomeStatus status, std::string error) {
  JobOutcome o;
  o.status = status;
  o.error = std::move(error);
  return o;
}

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
  if (out.bandwidth_bytes_per_s <= 0) return Fail(OutcomeStatus::kRuntimeError, "copy bandwidth: " + why);
  const double mma = rt.MmaRate(spec.timing.time_budget_s, &why);
  if (mma <= 0) return Fail(OutcomeStatus::kRuntimeError, "mma rate: " + why);
  out.peak_flops = PeakFromMmaRate(mma);
  out.status = OutcomeStatus::kOk;
  return out;
}

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

JobOutcome MeasureCandidate(gpu::Runtime& rt, const JobSpec& spec, const ir::Chain& chain) {
  auto schedule = space::ParseSchedule(spec.schedule_text, chain);
  if (!schedule.ok()) return Fail(OutcomeStatus::kCompileError, std::string(schedule.status().message()));
  auto nest = space::BuildLoopNest(chain, *schedule, spec.target);
  if (!nest.ok()) return Fail(OutcomeStatus::kCompileError, std::string(nest.status().message()));
  auto kernel = codegen::EmitCudaFusedKernel(chain, *nest, spec.schedule_text, spec.mapping);
  if (!kernel.ok()) return Fail(OutcomeStatus::kCompileError, std::string(kernel.status().message()));

  std::string why;
  const codegen::Nvrtc* nvrtc = codegen::Nvrtc::Get(&why);
  if (nvrtc == nullptr) return Fail(OutcomeStatus::kCompileError, why);
  codegen::NvrtcOutput built =
      nvrtc->Compile(kernel->source, rt.info().arch, {{"fusor_device.h", std::string(codegen::CudaDeviceHeader())}});
  JobOutcome out;
  out.compile_s = built.seconds;
  out.compile_flags = absl::StrCat(nvrtc->Version(), " ", absl::StrJoin(built.options, " "));
  out.code_bytes = static_cast<int64_t>(built.cubin.size());
  out.resources_json = nlohmann::json{{"registers", built.usage.registers},
                                      {"stack_bytes", built.usage.stack_bytes},
                                      {"spill_store_bytes", built.usage.spill_store_bytes},
                                      {"spill_load_bytes", built.usage.spill_load_bytes},
                                      {"static_shared_bytes", built.usage.static_shared_bytes},
                                      {"dynamic_shared_bytes", kernel->shared_bytes},
                                      {"threads", kernel->threads},
                                      {"grid", kernel->grid}}
                           .dump();
  if (!built.ok) {
    out.status = OutcomeStatus::kCompileError;
    out.error = built.log;
    return out;
  }
  codegen::DeviceLimits limits;
  limits.max_threads_per_block = rt.info().max_threads_per_block;
  limits.registers_per_sm = rt.info().registers_per_sm;
  limits.max_shared_per_block = rt.info().shared_optin_bytes;
  if (std::string reject = codegen::CheckResources(built.usage, kernel->threads, kernel->shared_bytes, limits);
      !reject.empty()) {
    out.status = OutcomeStatus::kCompileError;
    out.error = "rejected before running: " + reject;
    return out;
  }
  gpu::Runtime::Kernel k;
  if (!rt.Load(built.cubin, kernel->kernel_name, kernel->shared_bytes, &k, &why)) {
    out.status = OutcomeStatus::kRuntimeError;
    out.error = why;
    return out;
  }

  Buffers buf{rt, {}, {}, {}, {}};
  for (int t : chain.inputs) buf.in_bytes.push_back(chain.tensors[t].NumElements() * ir::DTypeBytes(chain.dtype));
  for (int t : chain.outputs) buf.out_bytes.push_back(chain.tensors[t].NumElements() * ir::DTypeBytes(chain.dtype));
  for (size_t b : buf.in_bytes) buf.in.push_back(rt.Alloc(b, &why));
  for (size_t b : buf.out_bytes) buf.out.push_back(rt.Alloc(b, &why));
  for (CUdeviceptr p : buf.in) {
    if (p == 0) return Fail(OutcomeStatus::kRuntimeError, why);
  }
  for (CUdeviceptr p : buf.out) {
    if (p == 0) return Fail(OutcomeStatus::kRuntimeError, why);
  }
  // The kernel's one argument: {const void* in[]; void* out[];} by value.
  std::vector<CUdeviceptr> args = buf.in;
  args.insert(args.end(), buf.out.begin(), buf.out.end());
  auto launch = [&](std::string* w) {
    return rt.Launch(k, kernel->grid, kernel->threads, kernel->shared_bytes, args.data(),
                     args.size() * sizeof(CUdeviceptr), w);
  };

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
        if (!launch(&run_error) || !rt.Synchronize(&run_error)) return 2;
        for (size_t i = 0; i < buf.out.size(); ++i) {
          if (!rt.Download(outputs[i], buf.out[i], buf.out_bytes[i], &run_error)) return 1;
        }
        return 0;
      },
      chain, RandomInputs(chain, spec.seed), codegen::CudaTolerance(chain.dtype));
  if (!valid.ok()) {
    rt.Unload(k);
    out.status = OutcomeStatus::kRuntimeError;
    out.error = run_error.empty() ? std::string(valid.status().message()) : run_error;
    return out;
  }
  out.max_abs_error = valid->max_abs_error;
  out.max_rel_error = valid->max_rel_error;
  if (!valid->ok) {
    rt.Unload(k);
    out.status = OutcomeStatus::kInvalidResult;
    out.error = valid->detail;
    return out;
  }
  gpu::TimingPlan plan;
  plan.warmup = spec.timing.warmup;
  plan.min_repeats = spec.timing.min_repeats;
  plan.max_repeats = spec.timing.max_repeats;
  plan.time_budget_s = spec.timing.time_budget_s;
  if (!rt.Time(launch, plan, &out.samples_s, &why)) {
    rt.Unload(k);
    out.status = OutcomeStatus::kRuntimeError;
    out.error = why;
    return out;
  }
  rt.Unload(k);
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

JobOutcome RunCudaJob(const JobSpec& spec, const ir::Chain& chain) {
  std::string why;
  auto rt = gpu::Runtime::Open(spec.device, std::string(codegen::CudaDeviceHeader()), &why);
  if (rt == nullptr) return Fail(OutcomeStatus::kRuntimeError, why);
  switch (spec.kind) {
    case JobKind::kCalibrate: return Calibrate(*rt, spec);
    case JobKind::kCandidate: return MeasureCandidate(*rt, spec, chain);
    case JobKind::kBaseline: break;
  }
  return Fail(OutcomeStatus::kRuntimeError,
              "the unfused GPU baseline (cuBLAS GEMMs and separate kernels) is not built yet; see issue 5");
}

}  // namespace fusor::worker
