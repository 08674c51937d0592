#include "worker/backend.h"

namespace fusor::worker {

std::string UnfusedVendor(const std::string& schedule_text) {
  const std::string prefix = kUnfusedPrefix;
  return schedule_text.size() > prefix.size() && schedule_text.compare(0, prefix.size(), prefix) == 0
             ? schedule_text.substr(prefix.size())
             : "";
}

const Backend& BackendFor(hw::Backend kind) {
  switch (kind) {
    case hw::Backend::kCpu: return CpuBackend();
    case hw::Backend::kCuda: return CudaBackend();
  }
  return CpuBackend();
}

}  // namespace fusor::worker
