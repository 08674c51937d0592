// The requests of a serving process on the machine a worker measures on:
// a file of two 64-bit counters the serving process keeps up to date (the
// requests running now, and the requests started so far; native byte
// order), which a worker reads so that it times kernels between requests.
// A sample taken while a request runs measures the request's load, not the
// kernel: on a serving machine its spread makes a tune end unconfirmed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace fusor {

class QuietGate {
 public:
  // Maps `path` read-only; NOT_FOUND or FAILED_PRECONDITION naming it when
  // it cannot be read or is not 16 bytes.
  static absl::StatusOr<QuietGate> Open(const std::string& path);
  QuietGate(QuietGate&&) noexcept;
  QuietGate& operator=(QuietGate&&) noexcept;
  ~QuietGate();

  // Waits until no request runs (polling every 0.5 ms), at most
  // `max_wait_s`; whether it is quiet now.
  bool WaitQuiet(double max_wait_s) const;
  // Requests started so far: a stretch of time between two equal readings,
  // quiet at its start, saw no request.
  uint64_t Started() const;
  uint64_t Running() const;

 private:
  QuietGate(void* map, int fd) : map_(map), fd_(fd) {}
  void* map_ = nullptr;
  int fd_ = -1;
};

}  // namespace fusor
