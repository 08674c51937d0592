// worker/cuda/driver_api.h declares the driver's ABI by hand so fusor
// builds without cuda.h; where the toolkit is installed, its values are
// checked against cuda.h's.
#include <gtest/gtest.h>

#include "worker/cuda/driver_api.h"

#if __has_include(<cuda.h>)
#include <cuda.h>
#define FUSOR_TEST_HAVE_CUDA_H 1
#endif

namespace fusor::gpu {
namespace {

TEST(DriverApiTest, MatchesCudaH) {
#ifndef FUSOR_TEST_HAVE_CUDA_H
  GTEST_SKIP() << "no cuda.h here to compare with";
#else
  EXPECT_EQ(sizeof(drv::DevicePtr), sizeof(CUdeviceptr));
  EXPECT_EQ(sizeof(drv::Result), sizeof(CUresult));
  EXPECT_EQ(sizeof(drv::Device), sizeof(CUdevice));
  EXPECT_EQ(drv::kSuccess, CUDA_SUCCESS);
  EXPECT_EQ(drv::kInvalidValue, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(drv::kAttrMaxThreadsPerBlock, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  EXPECT_EQ(drv::kAttrMultiprocessorCount, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  EXPECT_EQ(drv::kAttrL2CacheSize, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  EXPECT_EQ(drv::kAttrComputeCapabilityMajor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  EXPECT_EQ(drv::kAttrComputeCapabilityMinor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  EXPECT_EQ(drv::kAttrMaxRegistersPerMultiprocessor, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
  EXPECT_EQ(drv::kAttrMaxSharedMemoryPerBlockOptin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  EXPECT_EQ(drv::kFuncLocalSizeBytes, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
  EXPECT_EQ(drv::kFuncNumRegs, CU_FUNC_ATTRIBUTE_NUM_REGS);
  EXPECT_EQ(drv::kFuncMaxDynamicSharedSizeBytes, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
  EXPECT_EQ(drv::kEventDefault, static_cast<unsigned>(CU_EVENT_DEFAULT));
#endif
}

}  // namespace
}  // namespace fusor::gpu
