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
#include "common/codegen/cuda/cuda_codegen.h"
#include "common/codegen/cuda/nvrtc.h"
#include "common/hw/target.h"
#include "common/ir/chain.h"
#include "common/space/space.h"

namespace fusor::client {

// A GPU from the device table by name (h100) or by arch (sm_90: the
// table's first device of that arch).
absl::StatusOr<hw::TargetDesc> GpuTarget(const std::string& name);

struct GpuCandidate {
  const space::RankedSchedule* ranked = nullptr;
  int rank = 0;  // 1-based, in model order
  std::string schedule;
  codegen::CudaKernel kernel;
  codegen::CompiledProgram compiled;  // of FusedProgram(chain, kernel); empty when NVRTC is missing
};

// The `count` best-ranked candidates of `space` whose CUDA compiles for the
// target's arch within its limits, in model order, looking at no more than
// count + 16 of them; why better-ranked ones were dropped goes to
// `skipped`. Without NVRTC the candidates are emitted but neither compiled
// nor checked.
std::vector<GpuCandidate> CompilingGpuCandidates(const ir::Chain& chain, const hw::TargetDesc& target,
                                                 const space::Space& space, int count,
                                                 std::vector<std::string>* skipped);

struct ModelOnlyOutput {
  std::vector<std::string> files;  // written, source first
  std::string schedule;
  std::string mapping;
  double predicted_s = 0;
  int rank = 1;                    // of the candidate written, in model order
  std::vector<std::string> skipped;  // better-ranked candidates that did not compile or fit, and why
};

// Writes `name`.cu/.cubin/.json and fusor_device.h (GPU; the source
// includes it) or `name`.cc/.json (CPU) into `out_dir`. FAILED_PRECONDITION
// when NVRTC is missing (the source and metadata are still written) or no
// candidate fits.
// `schedule_text`, when not empty, is written instead of the model's pick
// (CPU targets; INVALID_ARGUMENT when the schedule is not legal there).
absl::StatusOr<ModelOnlyOutput> CompileModelOnly(const ir::Chain& chain, const hw::TargetDesc& target,
                                                 const std::string& name, const std::string& out_dir,
                                                 const std::string& schedule_text = "");

}  // namespace fusor::client
