// Describes the CPU this worker runs on.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/hw/target.h"

namespace fusor::worker {

// ISA features, core count (CPUs this process may run on), cache sizes and
// the compiler's version line. W and P are left 0 for calibration.
absl::StatusOr<hw::TargetDesc> DescribeCpu(const std::string& compiler, const std::string& workdir);

}  // namespace fusor::worker
