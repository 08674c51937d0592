#include "worker/backend.h"

namespace fusor::worker {

const Backend& BackendFor(hw::Backend kind) {
  switch (kind) {
    case hw::Backend::kCpu: return CpuBackend();
    case hw::Backend::kCuda: return CudaBackend();
  }
  return CpuBackend();
}

}  // namespace fusor::worker
