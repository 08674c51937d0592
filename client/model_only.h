// `fusor compile --model-only`: ahead-of-time output for a target no
// worker serves. The schedule space is ranked by the cost model alone and
// the best candidate that compiles within the target's limits is written
// out: for a GPU its CUDA source, its cubin (NVRTC) and launch metadata;
// for a CPU its C++ source and metadata. The output says it is unmeasured
// and nothing is stored in any tuning database.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/hw/target.h"
#include "common/ir/chain.h"

namespace fusor::client {

// A GPU from the device table by name (h100) or by arch (sm_90: the
// table's first device of that arch).
absl::StatusOr<hw::TargetDesc> GpuTarget(const std::string& name);

struct ModelOnlyOutput {
  std::vector<std::string> files;  // written, source first
  std::string schedule;
  std::string mapping;
  double predicted_s = 0;
  int rank = 1;                    // of the candidate written, in model order
  std::vector<std::string> skipped;  // better-ranked candidates that did not compile or fit, and why
};

// Writes `name`.cu/.cubin/.json and fusor_device.h (GPU; the source
// includes it) or `name`.cc/.json (CPU) into `out_dir`. FAILED_PRECONDITION when NVRTC is missing (the source and
// metadata are still written) or no candidate fits.
absl::StatusOr<ModelOnlyOutput> CompileModelOnly(const ir::Chain& chain, const hw::TargetDesc& target,
                                                 const std::string& name, const std::string& out_dir);

}  // namespace fusor::client
