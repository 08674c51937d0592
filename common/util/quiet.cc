#include "common/util/quiet.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace fusor {
namespace {

constexpr size_t kBytes = 16;

uint64_t Load(const void* map, int index) {
  // The serving process writes the counters whole (8-byte aligned words).
  return reinterpret_cast<const std::atomic<uint64_t>*>(map)[index].load(std::memory_order_acquire);
}

}  // namespace

absl::StatusOr<QuietGate> QuietGate::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("quiet file ", path, ": ", strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size != static_cast<off_t>(kBytes)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("quiet file ", path, " is not ", kBytes, " bytes"));
  }
  void* map = mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("quiet file ", path, ": mmap: ", strerror(errno)));
  }
  return QuietGate(map, fd);
}

QuietGate::QuietGate(QuietGate&& other) noexcept : map_(other.map_), fd_(other.fd_) {
  other.map_ = nullptr;
  other.fd_ = -1;
}

QuietGate& QuietGate::operator=(QuietGate&& other) noexcept {
  std::swap(map_, other.map_);
  std::swap(fd_, other.fd_);
  return *this;
}

QuietGate::~QuietGate() {
  if (map_ != nullptr) munmap(map_, kBytes);
  if (fd_ >= 0) close(fd_);
}

uint64_t QuietGate::Running() const { return Load(map_, 0); }
uint64_t QuietGate::Started() const { return Load(map_, 1); }

bool QuietGate::WaitQuiet(double max_wait_s) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(max_wait_s);
  while (Running() != 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  return true;
}

}  // namespace fusor
