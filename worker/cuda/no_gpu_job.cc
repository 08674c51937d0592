// The worker's CUDA backend in a build without the CUDA toolkit.
#include "worker/cuda/gpu_job.h"

namespace fusor::worker {

absl::StatusOr<hw::TargetDesc> DescribeGpuTarget(int) {
  return absl::FailedPreconditionError("this fusor was built without the CUDA toolkit");
}

namespace {
JobOutcome NoCuda() {
  return FailedOutcome(OutcomeStatus::kRuntimeError, "this fusor was built without the CUDA toolkit");
}
}  // namespace

JobOutcome CalibrateCudaJob(const JobSpec&) { return NoCuda(); }
JobOutcome CompileCudaJob(const JobSpec&, const ir::Chain&, const std::string&) { return NoCuda(); }
JobOutcome MeasureCudaJob(const JobSpec&, const ir::Chain&, const std::string&) { return NoCuda(); }

}  // namespace fusor::worker
