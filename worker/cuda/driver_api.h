// The few CUDA driver API types, constants and entry-point signatures fusor
// uses, declared here so the GPU runtime builds without cuda.h: a machine
// with only the NVIDIA driver and a pip PyTorch has no toolkit headers.
// The values are the driver's ABI (cuda.h, CUDA 12 and 13);
// tests/worker/cuda/driver_api_test.cc checks them against cuda.h where
// the toolkit is installed. Entry points are resolved by name at run time
// (gpu_runtime.cc), never linked.
#pragma once

#include <cstddef>

namespace fusor::gpu::drv {

using Result = int;                    // CUresult
using Device = int;                    // CUdevice
using DevicePtr = unsigned long long;  // CUdeviceptr (64-bit)
using Context = struct CUctx_st*;
using Module = struct CUmod_st*;
using Function = struct CUfunc_st*;
using Event = struct CUevent_st*;
using Stream = struct CUstream_st*;

constexpr Result kSuccess = 0;       // CUDA_SUCCESS
constexpr Result kInvalidValue = 1;  // CUDA_ERROR_INVALID_VALUE

// CUdevice_attribute
constexpr int kAttrMaxThreadsPerBlock = 1;
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrL2CacheSize = 38;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kAttrMaxRegistersPerMultiprocessor = 82;
constexpr int kAttrMaxSharedMemoryPerBlockOptin = 97;

// CUfunction_attribute
constexpr int kFuncLocalSizeBytes = 3;
constexpr int kFuncNumRegs = 4;
constexpr int kFuncMaxDynamicSharedSizeBytes = 8;

constexpr unsigned kEventDefault = 0;  // CU_EVENT_DEFAULT

// Entry points, by the names they are resolved under (the _v2 forms where
// cuda.h maps to them).
using InitFn = Result (*)(unsigned flags);                                         // cuInit
using DriverGetVersionFn = Result (*)(int* version);                               // cuDriverGetVersion
using DeviceGetCountFn = Result (*)(int* count);                                   // cuDeviceGetCount
using DeviceGetFn = Result (*)(Device* device, int ordinal);                       // cuDeviceGet
using DeviceGetNameFn = Result (*)(char* name, int length, Device device);         // cuDeviceGetName
using DeviceGetAttributeFn = Result (*)(int* value, int attribute, Device device);  // cuDeviceGetAttribute
using DeviceTotalMemFn = Result (*)(size_t* bytes, Device device);                 // cuDeviceTotalMem_v2
using PrimaryCtxRetainFn = Result (*)(Context* context, Device device);            // cuDevicePrimaryCtxRetain
using PrimaryCtxReleaseFn = Result (*)(Device device);                             // cuDevicePrimaryCtxRelease_v2
using CtxSetCurrentFn = Result (*)(Context context);                               // cuCtxSetCurrent
using CtxSynchronizeFn = Result (*)();                                             // cuCtxSynchronize
using MemAllocFn = Result (*)(DevicePtr* ptr, size_t bytes);                       // cuMemAlloc_v2
using MemFreeFn = Result (*)(DevicePtr ptr);                                       // cuMemFree_v2
using MemcpyHtoDFn = Result (*)(DevicePtr dst, const void* src, size_t bytes);     // cuMemcpyHtoD_v2
using MemcpyDtoHFn = Result (*)(void* dst, DevicePtr src, size_t bytes);           // cuMemcpyDtoH_v2
using MemsetD8Fn = Result (*)(DevicePtr dst, unsigned char value, size_t count);   // cuMemsetD8_v2
using ModuleLoadDataFn = Result (*)(Module* module, const void* image);            // cuModuleLoadData
using ModuleUnloadFn = Result (*)(Module module);                                  // cuModuleUnload
using ModuleGetFunctionFn = Result (*)(Function* f, Module module, const char* name);  // cuModuleGetFunction
using FuncSetAttributeFn = Result (*)(Function f, int attribute, int value);           // cuFuncSetAttribute
using FuncGetAttributeFn = Result (*)(int* value, int attribute, Function f);          // cuFuncGetAttribute
// cuFuncGetParamInfo (driver 12.4 and newer; optional)
using FuncGetParamInfoFn = Result (*)(Function f, size_t index, size_t* offset, size_t* size);
using LaunchKernelFn = Result (*)(Function f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                                  unsigned block_y, unsigned block_z, unsigned shared_bytes, Stream stream,
                                  void** params, void** extra);  // cuLaunchKernel
using EventCreateFn = Result (*)(Event* event, unsigned flags);   // cuEventCreate
using EventDestroyFn = Result (*)(Event event);                   // cuEventDestroy_v2
using EventRecordFn = Result (*)(Event event, Stream stream);     // cuEventRecord
using EventSynchronizeFn = Result (*)(Event event);               // cuEventSynchronize
using EventElapsedTimeFn = Result (*)(float* ms, Event start, Event stop);  // cuEventElapsedTime(_v2)
using GetErrorStringFn = Result (*)(Result error, const char** text);       // cuGetErrorString

}  // namespace fusor::gpu::drv
