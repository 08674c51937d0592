// The GPU half of the worker, in plain C++17 over the CUDA driver API,
// which is loaded at run time (dlopen libcuda.so.1): the binary starts on
// machines without a driver, and the GPU device check (bench/gpu) builds
// this file where only CUDA is installed. Errors are strings: a function
// returns false (or nullptr) and says why.
//
// A Runtime owns the device's primary context in this process; the worker
// creates one only in the child process that runs a job, so a kernel that
// faults ends that child and its context, never the worker.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/codegen/cuda/nvrtc.h"
#include "common/codegen/cuda/program.h"
#include "worker/cuda/driver_api.h"

namespace fusor::gpu {

using DevicePtr = drv::DevicePtr;

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  std::string arch;  // "sm_90"
  int sm_count = 0;
  int64_t l2_bytes = 0;
  int64_t shared_optin_bytes = 0;  // max dynamic + static shared memory per block
  int64_t total_bytes = 0;
  int max_threads_per_block = 0;
  int registers_per_sm = 0;
  int driver_version = 0;  // e.g. 12080
};

struct Driver;  // the resolved entry points

// Describes device `ordinal` without creating a context; false (with `why`)
// when there is no driver or no such device.
bool DescribeDevice(int ordinal, DeviceInfo* info, std::string* why);

// The median of timing samples (0 for none).
double Median(std::vector<double> samples);

struct TimingPlan {
  int warmup = 2;
  int min_repeats = 5;
  int max_repeats = 200;
  double time_budget_s = 0.5;  // of kernel time, not counting the flushes
  bool flush_l2 = true;        // overwrite a buffer twice the L2 before every run
};

class Runtime {
 public:
  // `device_header` is the text of fusor_device.h, which the calibration
  // kernels include.
  static std::unique_ptr<Runtime> Open(int ordinal, const std::string& device_header, std::string* why);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const DeviceInfo& info() const { return info_; }
  const std::string& device_header() const { return device_header_; }
  // What a kernel may use on this device.
  codegen::DeviceLimits limits() const;

  // Device memory; 0 on failure.
  DevicePtr Alloc(size_t bytes, std::string* why);
  void Free(DevicePtr p);
  bool Upload(DevicePtr dst, const void* src, size_t bytes, std::string* why);
  bool Download(void* dst, DevicePtr src, size_t bytes, std::string* why);
  bool Fill(DevicePtr dst, unsigned char byte, size_t bytes, std::string* why);

  struct Kernel {
    std::string name;
    drv::Module module = nullptr;
    drv::Function function = nullptr;
    int registers = 0;
    int local_bytes = 0;
    // The parameter list as the driver reports it (cuFuncGetParamInfo);
    // -1 where the driver is older than 12.4 and cannot say.
    int param_count = -1;
    size_t param_bytes = 0;
  };
  // Loads a cubin and finds `name`, allowing `dynamic_shared` bytes.
  bool Load(const std::string& cubin, const std::string& name, int64_t dynamic_shared, Kernel* out,
            std::string* why);
  void Unload(Kernel& k);
  // One launch. Every kernel fusor launches takes one parameter, a struct
  // passed by value: `args` (args_bytes). A kernel whose parameters the
  // driver reports otherwise is refused rather than launched.
  bool Launch(const Kernel& k, int64_t grid, int threads, int64_t dynamic_shared, const void* args,
              size_t args_bytes, std::string* why);
  bool Synchronize(std::string* why);

  // Times `run` (which launches work on the default stream) with CUDA
  // events: warm-up, then repeats within the plan; samples in seconds.
  bool Time(const std::function<bool(std::string*)>& run, const TimingPlan& plan, std::vector<double>* samples,
            std::string* why);

  // Calibration: device-memory copy bandwidth (bytes read + written per
  // second) and the f16 mma.sync rate (FLOP/s), each measured for about
  // `seconds`. 0 on failure.
  double CopyBandwidth(double seconds, std::string* why);
  double MmaRate(double seconds, std::string* why);

 private:
  Runtime() = default;
  bool Check(drv::Result rc, const char* what, std::string* why) const;
  bool BuildAndLoad(const std::string& source, const std::string& name, Kernel* out, std::string* why);

  const Driver* d_ = nullptr;
  DeviceInfo info_;
  drv::Device device_ = 0;
  drv::Context context_ = nullptr;
  DevicePtr flush_ = 0;
  size_t flush_bytes_ = 0;
  std::string device_header_;
};

// The runtime's own kernels (calibration), each with the size of the one
// argument struct the runtime passes it: tests compile them and check
// that each takes exactly that (the launch contract above).
struct BuiltinKernel {
  const char* name;
  const char* source;
  size_t args_bytes;
};
std::vector<BuiltinKernel> BuiltinKernels();

// A program (program.h) ready to run: its compiled kernels (CompileProgram)
// loaded, scratch buffers allocated, cuBLAS loaded when a step needs it.
class LoadedProgram {
 public:
  // false (with `why`) when a kernel does not load or memory runs out.
  bool Prepare(Runtime& rt, const codegen::Program& program, const codegen::CompiledProgram& compiled,
               std::string* why);
  ~LoadedProgram();

  // One run: `inputs` and `outputs` are device buffers in the chain's
  // order; ends with the work queued (not synchronized).
  bool Run(const std::vector<DevicePtr>& inputs, const std::vector<DevicePtr>& outputs, std::string* why);

 private:
  Runtime* rt_ = nullptr;
  codegen::Program program_;
  std::vector<Runtime::Kernel> kernels_;  // per step (empty for GEMMs)
  std::vector<DevicePtr> scratch_;      // per buffer (0 unless scratch)
  void* cublas_ = nullptr;                // cublasHandle_t
};

}  // namespace fusor::gpu
