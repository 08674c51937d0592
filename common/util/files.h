// Whole-file reads and writes with errors as Status, and an exclusive lock
// on a file.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusor {

// NOT_FOUND when `path` cannot be read.
absl::StatusOr<std::string> ReadFile(const std::string& path);
// INTERNAL when `path` cannot be written.
absl::Status WriteFile(const std::string& path, const std::string& bytes);

// An exclusive advisory lock (flock) on `path`, created if needed, with this
// process's id written in it; released when destroyed or when the process
// dies, however it dies.
class FileLock {
 public:
  // FAILED_PRECONDITION naming the holder's pid when another process holds
  // it; PERMISSION_DENIED, NOT_FOUND or UNAVAILABLE when the file cannot be opened.
  static absl::StatusOr<FileLock> Acquire(const std::string& path);
  FileLock(FileLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  FileLock& operator=(FileLock&&) = delete;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace fusor
