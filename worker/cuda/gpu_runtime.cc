#include "worker/cuda/gpu_runtime.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "common/codegen/cuda/nvrtc.h"

namespace fusor::gpu {

// The driver entry points fusor uses (driver_api.h), resolved by their
// versioned names (cuMemAlloc is cuMemAlloc_v2, ...), the newest first.
struct Driver {
  drv::InitFn init;
  drv::DriverGetVersionFn driver_version;
  drv::DeviceGetCountFn device_count;
  drv::DeviceGetFn device_get;
  drv::DeviceGetNameFn device_name;
  drv::DeviceGetAttributeFn attribute;
  drv::DeviceTotalMemFn total_mem;
  drv::PrimaryCtxRetainFn primary_retain;
  drv::PrimaryCtxReleaseFn primary_release;
  drv::CtxSetCurrentFn set_current;
  drv::CtxSynchronizeFn synchronize;
  drv::MemAllocFn alloc;
  drv::MemFreeFn free;
  drv::MemcpyHtoDFn htod;
  drv::MemcpyDtoHFn dtoh;
  drv::MemsetD8Fn memset8;
  drv::ModuleLoadDataFn module_load;
  drv::ModuleUnloadFn module_unload;
  drv::ModuleGetFunctionFn get_function;
  drv::FuncSetAttributeFn func_set_attribute;
  drv::FuncGetAttributeFn func_get_attribute;
  drv::FuncGetParamInfoFn param_info = nullptr;  // optional
  drv::LaunchKernelFn launch;
  drv::EventCreateFn event_create;
  drv::EventDestroyFn event_destroy;
  drv::EventRecordFn event_record;
  drv::EventSynchronizeFn event_synchronize;
  drv::EventElapsedTimeFn event_elapsed;
  drv::GetErrorStringFn error_string;
};

namespace {

template <typename Fn>
bool Resolve(void* h, Fn& fn, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    fn = reinterpret_cast<Fn>(dlsym(h, name));
    if (fn != nullptr) return true;
  }
  return false;
}

const Driver* LoadDriver(std::string* why) {
  static std::once_flag once;
  static const Driver* driver = nullptr;
  static std::string error;
  std::call_once(once, [] {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) h = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      error = "no CUDA driver (libcuda.so.1 not found)";
      return;
    }
    auto* d = new Driver();
    bool ok = Resolve(h, d->init, {"cuInit"}) && Resolve(h, d->driver_version, {"cuDriverGetVersion"}) &&
              Resolve(h, d->device_count, {"cuDeviceGetCount"}) && Resolve(h, d->device_get, {"cuDeviceGet"}) &&
              Resolve(h, d->device_name, {"cuDeviceGetName"}) &&
              Resolve(h, d->attribute, {"cuDeviceGetAttribute"}) &&
              Resolve(h, d->total_mem, {"cuDeviceTotalMem_v2"}) &&
              Resolve(h, d->primary_retain, {"cuDevicePrimaryCtxRetain"}) &&
              Resolve(h, d->primary_release, {"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}) &&
              Resolve(h, d->set_current, {"cuCtxSetCurrent"}) && Resolve(h, d->synchronize, {"cuCtxSynchronize"}) &&
              Resolve(h, d->alloc, {"cuMemAlloc_v2"}) && Resolve(h, d->free, {"cuMemFree_v2"}) &&
              Resolve(h, d->htod, {"cuMemcpyHtoD_v2"}) && Resolve(h, d->dtoh, {"cuMemcpyDtoH_v2"}) &&
              Resolve(h, d->memset8, {"cuMemsetD8_v2"}) && Resolve(h, d->module_load, {"cuModuleLoadData"}) &&
              Resolve(h, d->module_unload, {"cuModuleUnload"}) &&
              Resolve(h, d->get_function, {"cuModuleGetFunction"}) &&
              Resolve(h, d->func_set_attribute, {"cuFuncSetAttribute"}) &&
              Resolve(h, d->func_get_attribute, {"cuFuncGetAttribute"}) && Resolve(h, d->launch, {"cuLaunchKernel"}) &&
              Resolve(h, d->event_create, {"cuEventCreate"}) &&
              Resolve(h, d->event_destroy, {"cuEventDestroy_v2", "cuEventDestroy"}) &&
              Resolve(h, d->event_record, {"cuEventRecord"}) &&
              Resolve(h, d->event_synchronize, {"cuEventSynchronize"}) &&
              Resolve(h, d->event_elapsed, {"cuEventElapsedTime_v2", "cuEventElapsedTime"}) &&
              Resolve(h, d->error_string, {"cuGetErrorString"});
    Resolve(h, d->param_info, {"cuFuncGetParamInfo"});
    if (!ok) {
      error = "the CUDA driver lacks an entry point fusor needs (driver too old?)";
      delete d;
      return;
    }
    if (drv::Result rc = d->init(0); rc != drv::kSuccess) {
      const char* s = nullptr;
      d->error_string(rc, &s);
      error = std::string("cuInit failed: ") + (s ? s : "unknown error");
      delete d;
      return;
    }
    driver = d;
  });
  if (driver == nullptr && why != nullptr) *why = error;
  return driver;
}

// Device-to-device copy, 16 bytes per thread and step.
struct CopyArgs {
  DevicePtr in, out;
  long n;  // float4s
};
const char kCopySource[] = R"(
struct FusorCopyArgs {
  const float4* __restrict__ in;
  float4* __restrict__ out;
  long n;
};
extern "C" __global__ void fusor_copy(const FusorCopyArgs a) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < a.n; i += (long)gridDim.x * blockDim.x) {
    a.out[i] = a.in[i];
  }
}
)";

// Independent f16 mma.sync chains per warp, on registers only.
struct MmaRateArgs {
  DevicePtr out;
  int steps;
};
const char kMmaSource[] = R"(
#include "fusor_device.h"
struct FusorMmaRateArgs {
  float* out;
  int steps;
};
extern "C" __global__ void __launch_bounds__(128, 1) fusor_mma_rate(const FusorMmaRateArgs args) {
  fusor_u32 a[4] = {0x3c003c00u + threadIdx.x, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
  fusor_u32 b[2] = {0x3c003c00u, 0x3c003c00u + blockIdx.x};
  float c[8][4] = {};
  for (int s = 0; s < args.steps; ++s) {
#pragma unroll
    for (int i = 0; i < 8; ++i) fusor_mma_m16n8k16_f16(c[i], a, b);
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum += c[i][0] + c[i][1] + c[i][2] + c[i][3];
  if (sum == 1234.5f) args.out[threadIdx.x] = sum;  // keeps the work alive
}
)";

// cuBLAS's C entry points fusor calls (enums as ints, as in its ABI).
struct Cublas {
  int (*create)(void**);
  int (*destroy)(void*);
  int (*gemm)(void* handle, int transa, int transb, int m, int n, int k, const void* alpha, const void* a, int a_type,
              int lda, long long stride_a, const void* b, int b_type, int ldb, long long stride_b, const void* beta,
              void* c, int c_type, int ldc, long long stride_c, int batch, int compute, int algo);
};

const Cublas* LoadCublas(std::string* why) {
  static std::once_flag once;
  static const Cublas* cublas = nullptr;
  std::call_once(once, [] {
    std::vector<std::string> paths = {"libcublas.so", "libcublas.so.13", "libcublas.so.12", "libcublas.so.11"};
    for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
      if (const char* v = std::getenv(var)) paths.push_back(std::string(v) + "/lib64/libcublas.so");
    }
    paths.push_back("/usr/local/cuda/lib64/libcublas.so");
    for (const std::string& path : paths) {
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) continue;
      auto* c = new Cublas();
      if (Resolve(h, c->create, {"cublasCreate_v2"}) && Resolve(h, c->destroy, {"cublasDestroy_v2"}) &&
          Resolve(h, c->gemm, {"cublasGemmStridedBatchedEx"})) {
        cublas = c;
        return;
      }
      delete c;
    }
  });
  if (cublas == nullptr && why != nullptr) *why = "cuBLAS not found (libcublas.so; set CUDA_HOME)";
  return cublas;
}

constexpr int kCudaR32F = 0, kCudaR16F = 2, kCudaR16BF = 14;
constexpr int kComputeF32 = 68, kComputeF32Pedantic = 69, kComputeF32FastTf32 = 77, kGemmDefault = -1;

}  // namespace

std::vector<BuiltinKernel> BuiltinKernels() {
  return {{"fusor_copy", kCopySource, sizeof(CopyArgs)}, {"fusor_mma_rate", kMmaSource, sizeof(MmaRateArgs)}};
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool DescribeDevice(int ordinal, DeviceInfo* info, std::string* why) {
  const Driver* d = LoadDriver(why);
  if (d == nullptr) return false;
  int count = 0;
  if (d->device_count(&count) != drv::kSuccess || ordinal < 0 || ordinal >= count) {
    *why = "no GPU " + std::to_string(ordinal) + " (" + std::to_string(count) + " visible)";
    return false;
  }
  drv::Device dev;
  if (d->device_get(&dev, ordinal) != drv::kSuccess) {
    *why = "cuDeviceGet failed";
    return false;
  }
  char name[256] = {};
  d->device_name(name, sizeof(name) - 1, dev);
  auto attr = [&](int a) {
    int v = 0;
    d->attribute(&v, a, dev);
    return v;
  };
  size_t total = 0;
  d->total_mem(&total, dev);
  info->ordinal = ordinal;
  info->name = name;
  info->arch = "sm_" + std::to_string(attr(drv::kAttrComputeCapabilityMajor)) +
               std::to_string(attr(drv::kAttrComputeCapabilityMinor));
  info->sm_count = attr(drv::kAttrMultiprocessorCount);
  info->l2_bytes = attr(drv::kAttrL2CacheSize);
  info->shared_optin_bytes = attr(drv::kAttrMaxSharedMemoryPerBlockOptin);
  info->max_threads_per_block = attr(drv::kAttrMaxThreadsPerBlock);
  info->registers_per_sm = attr(drv::kAttrMaxRegistersPerMultiprocessor);
  info->total_bytes = static_cast<int64_t>(total);
  d->driver_version(&info->driver_version);
  return true;
}

std::unique_ptr<Runtime> Runtime::Open(int ordinal, const std::string& device_header, std::string* why) {
  std::unique_ptr<Runtime> rt(new Runtime());
  rt->device_header_ = device_header;
  rt->d_ = LoadDriver(why);
  if (rt->d_ == nullptr || !DescribeDevice(ordinal, &rt->info_, why)) return nullptr;
  const Driver* d = rt->d_;
  if (!rt->Check(d->device_get(&rt->device_, ordinal), "cuDeviceGet", why) ||
      !rt->Check(d->primary_retain(&rt->context_, rt->device_), "cuDevicePrimaryCtxRetain", why) ||
      !rt->Check(d->set_current(rt->context_), "cuCtxSetCurrent", why)) {
    return nullptr;
  }
  rt->flush_bytes_ = static_cast<size_t>(std::max<int64_t>(2 * rt->info_.l2_bytes, 8 << 20));
  rt->flush_ = rt->Alloc(rt->flush_bytes_, why);
  if (rt->flush_ == 0) return nullptr;
  return rt;
}

Runtime::~Runtime() {
  if (d_ == nullptr || context_ == nullptr) return;
  if (flush_ != 0) d_->free(flush_);
  d_->primary_release(device_);
}

bool Runtime::Check(drv::Result rc, const char* what, std::string* why) const {
  if (rc == drv::kSuccess) return true;
  const char* s = nullptr;
  d_->error_string(rc, &s);
  *why = std::string(what) + ": " + (s ? s : "unknown CUDA error") + " (" + std::to_string(static_cast<int>(rc)) + ")";
  return false;
}

DevicePtr Runtime::Alloc(size_t bytes, std::string* why) {
  DevicePtr p = 0;
  if (!Check(d_->alloc(&p, std::max<size_t>(bytes, 16)), "cuMemAlloc", why)) return 0;
  return p;
}

void Runtime::Free(DevicePtr p) {
  if (p != 0) d_->free(p);
}

bool Runtime::Upload(DevicePtr dst, const void* src, size_t bytes, std::string* why) {
  return Check(d_->htod(dst, src, bytes), "cuMemcpyHtoD", why);
}

bool Runtime::Download(void* dst, DevicePtr src, size_t bytes, std::string* why) {
  return Check(d_->dtoh(dst, src, bytes), "cuMemcpyDtoH", why);
}

bool Runtime::Fill(DevicePtr dst, unsigned char byte, size_t bytes, std::string* why) {
  return Check(d_->memset8(dst, byte, bytes), "cuMemsetD8", why);
}

bool Runtime::Load(const std::string& cubin, const std::string& name, int64_t dynamic_shared, Kernel* out,
                   std::string* why) {
  if (!Check(d_->module_load(&out->module, cubin.data()), "cuModuleLoadData", why)) return false;
  if (!Check(d_->get_function(&out->function, out->module, name.c_str()), "cuModuleGetFunction", why)) {
    Unload(*out);
    return false;
  }
  if (dynamic_shared > 48 * 1024 &&
      !Check(d_->func_set_attribute(out->function, drv::kFuncMaxDynamicSharedSizeBytes,
                                    static_cast<int>(dynamic_shared)),
             "raising the kernel's dynamic shared memory limit", why)) {
    Unload(*out);
    return false;
  }
  d_->func_get_attribute(&out->registers, drv::kFuncNumRegs, out->function);
  d_->func_get_attribute(&out->local_bytes, drv::kFuncLocalSizeBytes, out->function);
  out->name = name;
  if (d_->param_info != nullptr) {
    // The driver answers INVALID_VALUE past the last parameter; any other
    // error means it cannot say, and the launch goes unchecked.
    size_t offset = 0, size = 0;
    out->param_count = 0;
    out->param_bytes = 0;
    drv::Result rc;
    while ((rc = d_->param_info(out->function, out->param_count, &offset, &size)) == drv::kSuccess) {
      ++out->param_count;
      out->param_bytes = offset + size;
    }
    if (rc != drv::kInvalidValue) out->param_count = -1;
  }
  return true;
}

void Runtime::Unload(Kernel& k) {
  if (k.module != nullptr) d_->module_unload(k.module);
  k = Kernel();
}

bool Runtime::Launch(const Kernel& k, int64_t grid, int threads, int64_t dynamic_shared, const void* args,
                     size_t args_bytes, std::string* why) {
  if (k.param_count >= 0 && (k.param_count != 1 || k.param_bytes != args_bytes)) {
    *why = "kernel " + k.name + " takes " + std::to_string(k.param_count) + " parameters (" +
           std::to_string(k.param_bytes) + " bytes), not one struct of " + std::to_string(args_bytes) +
           " bytes; not launched";
    return false;
  }
  if (grid <= 0 || grid > 0x7fffffff) {
    *why = "grid of " + std::to_string(grid) + " blocks cannot be launched";
    return false;
  }
  // One parameter: the driver copies args_bytes from `args`.
  void* params[] = {const_cast<void*>(args)};
  return Check(d_->launch(k.function, static_cast<unsigned>(grid), 1, 1, static_cast<unsigned>(threads), 1, 1,
                          static_cast<unsigned>(dynamic_shared), nullptr, params, nullptr),
               "cuLaunchKernel", why);
}

bool Runtime::Synchronize(std::string* why) { return Check(d_->synchronize(), "kernel execution", why); }

bool Runtime::Time(const std::function<bool(std::string*)>& run, const TimingPlan& plan, std::vector<double>* samples,
                   std::string* why) {
  drv::Event start = nullptr, stop = nullptr;
  if (!Check(d_->event_create(&start, drv::kEventDefault), "cuEventCreate", why) ||
      !Check(d_->event_create(&stop, drv::kEventDefault), "cuEventCreate", why)) {
    return false;
  }
  bool ok = true;
  double total = 0;
  for (int i = 0; ok && i < plan.warmup + plan.max_repeats; ++i) {
    const bool measured = i >= plan.warmup;
    if (measured && static_cast<int>(samples->size()) >= plan.min_repeats && total >= plan.time_budget_s) break;
    if (plan.flush_l2) ok = Fill(flush_, static_cast<unsigned char>(i), flush_bytes_, why);
    ok = ok && Check(d_->event_record(start, nullptr), "cuEventRecord", why) && run(why) &&
         Check(d_->event_record(stop, nullptr), "cuEventRecord", why) &&
         Check(d_->event_synchronize(stop), "kernel execution", why);
    float ms = 0;
    ok = ok && Check(d_->event_elapsed(&ms, start, stop), "cuEventElapsedTime", why);
    if (ok && measured) {
      samples->push_back(ms * 1e-3);
      total += ms * 1e-3;
    }
  }
  d_->event_destroy(start);
  d_->event_destroy(stop);
  return ok;
}

bool Runtime::BuildAndLoad(const std::string& source, const std::string& name, Kernel* out, std::string* why) {
  const codegen::Nvrtc* nvrtc = codegen::Nvrtc::Get(why);
  if (nvrtc == nullptr) return false;
  codegen::NvrtcOutput built = nvrtc->Compile(source, info_.arch, {{"fusor_device.h", device_header_}});
  if (!built.ok) {
    *why = "NVRTC: " + built.log;
    return false;
  }
  return Load(built.cubin, name, 0, out, why);
}

double Runtime::CopyBandwidth(double seconds, std::string* why) {
  Kernel k;
  if (!BuildAndLoad(kCopySource, "fusor_copy", &k, why)) return 0;
  const size_t bytes = static_cast<size_t>(std::min<int64_t>(info_.total_bytes / 8, int64_t{1} << 30)) / 16 * 16;
  DevicePtr in = Alloc(bytes, why), out = in != 0 ? Alloc(bytes, why) : 0;
  double rate = 0;
  if (out != 0 && Fill(in, 0, bytes, why)) {
    const CopyArgs args{in, out, static_cast<long>(bytes / 16)};
    const int64_t grid = 4L * info_.sm_count;
    std::vector<double> samples;
    TimingPlan plan;
    plan.time_budget_s = seconds;
    plan.flush_l2 = false;  // the buffers are far larger than the L2
    if (Time([&](std::string* w) { return Launch(k, grid, 512, 0, &args, sizeof(args), w); }, plan, &samples, why)) {
      rate = 2.0 * static_cast<double>(bytes) / Median(samples);
    }
  }
  Free(in);
  Free(out);
  Unload(k);
  return rate;
}

double Runtime::MmaRate(double seconds, std::string* why) {
  Kernel k;
  if (!BuildAndLoad(kMmaSource, "fusor_mma_rate", &k, why)) return 0;
  DevicePtr out = Alloc(4096, why);
  double rate = 0;
  if (out != 0) {
    const MmaRateArgs args{out, 4096};
    const int64_t grid = 8L * info_.sm_count;
    const int threads = 128;
    std::vector<double> samples;
    TimingPlan plan;
    plan.time_budget_s = seconds;
    plan.flush_l2 = false;
    if (Time([&](std::string* w) { return Launch(k, grid, threads, 0, &args, sizeof(args), w); }, plan, &samples,
             why)) {
      const double flops = 2.0 * 16 * 8 * 16 * 8 * static_cast<double>(args.steps) * (threads / 32) * grid;
      rate = flops / Median(samples);
    }
  }
  Free(out);
  Unload(k);
  return rate;
}

codegen::DeviceLimits Runtime::limits() const {
  codegen::DeviceLimits limits;
  limits.max_threads_per_block = info_.max_threads_per_block;
  limits.registers_per_sm = info_.registers_per_sm;
  limits.max_shared_per_block = info_.shared_optin_bytes;
  return limits;
}

bool LoadedProgram::Prepare(Runtime& rt, const codegen::Program& program, const codegen::CompiledProgram& compiled,
                            std::string* why) {
  rt_ = &rt;
  program_ = program;
  if (compiled.cubins.size() != program.steps.size()) {
    *why = "the compiled program does not match the program";
    return false;
  }
  kernels_.assign(program.steps.size(), {});
  for (size_t i = 0; i < program.steps.size(); ++i) {
    const codegen::ProgramStep& step = program.steps[i];
    if (step.is_gemm) {
      if (cublas_ == nullptr) {
        const Cublas* cb = LoadCublas(why);
        if (cb == nullptr || cb->create(&cublas_) != 0) {
          if (cb != nullptr) *why = "cublasCreate failed";
          return false;
        }
      }
      continue;
    }
    const codegen::KernelStep& k = step.kernel;
    if (!rt.Load(compiled.cubins[i], k.name, k.shared_bytes, &kernels_[i], why)) {
      *why = step.what + ": " + *why;
      return false;
    }
  }
  scratch_.assign(program.buffers.size(), 0);
  for (size_t b = 0; b < program.buffers.size(); ++b) {
    const codegen::ProgramBuffer& buf = program.buffers[b];
    if (buf.input >= 0 || buf.output >= 0) continue;
    scratch_[b] = rt.Alloc(static_cast<size_t>(buf.bytes), why);
    if (scratch_[b] == 0) return false;
    if (buf.zeroed && !rt.Fill(scratch_[b], 0, static_cast<size_t>(buf.bytes), why)) return false;
  }
  return true;
}

LoadedProgram::~LoadedProgram() {
  if (rt_ == nullptr) return;
  for (Runtime::Kernel& k : kernels_) rt_->Unload(k);
  for (DevicePtr p : scratch_) rt_->Free(p);
  if (cublas_ != nullptr) LoadCublas(nullptr)->destroy(cublas_);
}

bool LoadedProgram::Run(const std::vector<DevicePtr>& inputs, const std::vector<DevicePtr>& outputs,
                        std::string* why) {
  std::vector<DevicePtr> address(program_.buffers.size());
  for (size_t b = 0; b < program_.buffers.size(); ++b) {
    const codegen::ProgramBuffer& buf = program_.buffers[b];
    if (buf.input >= 0 && buf.input < static_cast<int>(inputs.size())) {
      address[b] = inputs[buf.input];
    } else if (buf.output >= 0 && buf.output < static_cast<int>(outputs.size())) {
      address[b] = outputs[buf.output];
    } else {
      address[b] = scratch_[b];
    }
    if (address[b] == 0) {
      *why = "buffer " + std::to_string(b) + " has no device memory";
      return false;
    }
  }
  for (size_t i = 0; i < program_.steps.size(); ++i) {
    const codegen::ProgramStep& step = program_.steps[i];
    if (!step.is_gemm) {
      const codegen::KernelStep& k = step.kernel;
      std::vector<DevicePtr> args;
      for (int a : k.args) args.push_back(address[a]);
      if (!rt_->Launch(kernels_[i], k.grid, k.threads, k.shared_bytes, args.data(), args.size() * sizeof(DevicePtr),
                       why)) {
        *why = step.what + ": " + *why;
        return false;
      }
      continue;
    }
    // Row-major C = A B is column-major C^T = B^T A^T.
    const codegen::GemmStep& g = step.gemm;
    const int type = g.dtype == "f16" ? kCudaR16F : g.dtype == "bf16" ? kCudaR16BF : kCudaR32F;
    const int bytes = type == kCudaR32F ? 4 : 2;
    const float alpha = static_cast<float>(g.alpha), beta = 0.0f;
    const int rc = LoadCublas(why)->gemm(
        cublas_, g.trans_b ? 1 : 0, g.trans_a ? 1 : 0, static_cast<int>(g.n), static_cast<int>(g.m),
        static_cast<int>(g.k), &alpha, reinterpret_cast<const void*>(address[g.b] + g.offset_b * bytes), type,
        static_cast<int>(g.ldb), g.stride_b, reinterpret_cast<const void*>(address[g.a] + g.offset_a * bytes), type,
        static_cast<int>(g.lda), g.stride_a, &beta, reinterpret_cast<void*>(address[g.c] + g.offset_c * bytes), type,
        static_cast<int>(g.ldc), g.stride_c, static_cast<int>(g.batch),
        g.dtype == "f32-exact" ? kComputeF32Pedantic : type == kCudaR32F ? kComputeF32FastTf32 : kComputeF32,
        kGemmDefault);
    if (rc != 0) {
      *why = step.what + ": cublasGemmStridedBatchedEx failed with status " + std::to_string(rc);
      return false;
    }
  }
  return true;
}

}  // namespace fusor::gpu
