// The worker's CUDA backend: the GPU as a target, and the jobs (calibrate,
// measure a candidate or the baseline) run in the job's child process on
// gpu::Runtime. Built everywhere: without a driver, DescribeGpuTarget says
// so and the worker serves its CPU backend.
#pragma once

#include "absl/status/statusor.h"
#include "common/hw/target.h"
#include "common/ir/chain.h"
#include "worker/job.h"

namespace fusor::worker {

// The GPU `ordinal` as a target (no context is created): FAILED_PRECONDITION
// without a driver, a device or a CUDA-enabled build.
absl::StatusOr<hw::TargetDesc> DescribeGpuTarget(int ordinal);

// In the job's child (see JobPhase): calibrate; generate and compile a
// candidate's fused kernel or the unfused baseline (cuBLAS GEMMs and
// separate kernels) with NVRTC for spec.target into `dir`, rejecting what
// does not fit the device (this needs no GPU); validate and time what was
// compiled into `dir` on spec.device.
JobOutcome CalibrateCudaJob(const JobSpec& spec);
JobOutcome CompileCudaJob(const JobSpec& spec, const ir::Chain& chain, const std::string& dir);
JobOutcome MeasureCudaJob(const JobSpec& spec, const ir::Chain& chain, const std::string& dir);

}  // namespace fusor::worker
