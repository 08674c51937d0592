// Whole-file reads (bounded where asked) and writes with errors as Status, a
// JSON nesting check, a least-recently-used bound on a cache directory, and
// an exclusive lock on a file.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusor {

// NOT_FOUND when `path` cannot be read.
absl::StatusOr<std::string> ReadFile(const std::string& path);
// The same, INVALID_ARGUMENT (naming the limit) when `path` holds more than
// `max_bytes`: nothing past the limit is read.
absl::StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes);

// INVALID_ARGUMENT when JSON `text` nests objects and arrays deeper than
// `max_depth`, checked before any parser builds its tree (`what`: the
// file or message, for the error).
inline constexpr int kMaxJsonDepth = 32;
absl::Status CheckJsonDepth(absl::string_view text, absl::string_view what, int max_depth = kMaxJsonDepth);
// INTERNAL when `path` cannot be written.
absl::Status WriteFile(const std::string& path, const std::string& bytes);

// Removes the least recently written files of `dir` until they fit in
// `max_bytes`, never `keep` (caches of files touched on every use).
void EvictLeastRecentlyUsed(const std::string& dir, int64_t max_bytes, const std::string& keep);

// An exclusive advisory lock (flock) on `path`, created if needed, with this
// process's id written in it; released when destroyed or when the process
// dies, however it dies.
class FileLock {
 public:
  // FAILED_PRECONDITION naming the holder's pid when another process holds
  // it; PERMISSION_DENIED, NOT_FOUND or UNAVAILABLE when the file cannot be opened.
  static absl::StatusOr<FileLock> Acquire(const std::string& path);
  // Waits until no other process holds it; errors as Acquire's for a file
  // that cannot be opened.
  static absl::StatusOr<FileLock> Wait(const std::string& path);
  FileLock(FileLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  FileLock& operator=(FileLock&&) = delete;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace fusor
