#include "common/hw/target.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/sha256.h"

namespace fusor::hw {

bool TargetDesc::HasFeature(const std::string& f) const {
  return std::find(isa_features.begin(), isa_features.end(), f) != isa_features.end();
}

std::string TargetFingerprint(const TargetDesc& t) {
  std::vector<std::string> features = t.isa_features;
  std::sort(features.begin(), features.end());
  std::string identity = absl::StrCat(
      t.backend == Backend::kCpu ? "cpu" : "cuda", "|", t.arch, "|", t.device_name, "|",
      t.compute_units, "|", t.vector_lanes_f32, "|", absl::StrJoin(features, ","), "|",
      t.l1d_bytes, "|", t.l2_bytes, "|", t.l3_bytes, "|", t.shared_mem_per_block, "|", t.compiler);
  return absl::StrCat(t.backend == Backend::kCpu ? "cpu-" : "cuda-",
                      Sha256Hex(identity).substr(0, 16));
}

int64_t ScratchBudget(const TargetDesc& t) {
  if (t.backend == Backend::kCuda) return t.shared_mem_per_block > 0 ? t.shared_mem_per_block : 48 << 10;
  int64_t private_cache = t.l1d_bytes + t.l2_bytes;
  return private_cache > 0 ? private_cache : int64_t{1} << 20;
}

}  // namespace fusor::hw
