// The worker's CUDA backend: the GPU as a target, and the jobs (calibrate,
// measure a candidate or the baseline) run in the job's child process on
// gpu::Runtime.
// Built only when the CUDA toolkit is present (FUSOR_HAVE_CUDA); otherwise
// DescribeGpuTarget says the build lacks it and the worker serves its CPU
// backend.
#pragma once

#include "absl/status/statusor.h"
#include "common/hw/target.h"
#include "common/ir/chain.h"
#include "worker/job.h"

namespace fusor::worker {

// The GPU `ordinal` as a target (no context is created): FAILED_PRECONDITION
// without a driver, a device or a CUDA-enabled build.
absl::StatusOr<hw::TargetDesc> DescribeGpuTarget(int ordinal);

// In the job's child: calibrate, or measure a candidate or the unfused
// baseline (cuBLAS GEMMs and separate kernels) on spec.device.
JobOutcome RunCudaJob(const JobSpec& spec, const ir::Chain& chain);

}  // namespace fusor::worker
