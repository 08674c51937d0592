// The worker's CUDA backend in a build without the CUDA toolkit.
#include "worker/cuda/gpu_job.h"

namespace fusor::worker {

absl::StatusOr<hw::TargetDesc> DescribeGpuTarget(int) {
  return absl::FailedPreconditionError("this fusor was built without the CUDA toolkit");
}

JobOutcome RunCudaJob(const JobSpec&, const ir::Chain&) {
  return FailedOutcome(OutcomeStatus::kRuntimeError, "this fusor was built without the CUDA toolkit");
}

}  // namespace fusor::worker
