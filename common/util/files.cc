#include "common/util/files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fusor {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  return ReadFile(path, std::numeric_limits<int64_t>::max());
}

absl::StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof(chunk)) || in.gcount() > 0) {
    text.append(chunk, static_cast<size_t>(in.gcount()));
    if (static_cast<int64_t>(text.size()) > max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, " is larger than ", max_bytes, " bytes (the limit)"));
    }
  }
  return text;
}

absl::Status CheckJsonDepth(absl::string_view text, absl::string_view what, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": JSON nests deeper than ", max_depth, " levels at byte ", i, " (limit)"));
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return absl::OkStatus();
}

void EvictLeastRecentlyUsed(const std::string& dir, int64_t max_bytes, const std::string& keep) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> files;
  int64_t total = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    total += static_cast<int64_t>(e.file_size(ec));
    files.push_back({e.last_write_time(ec), e.path()});
  }
  std::sort(files.begin(), files.end());
  for (const auto& [when, path] : files) {
    if (total <= max_bytes) break;
    if (path == fs::path(keep)) continue;
    const int64_t bytes = static_cast<int64_t>(fs::file_size(path, ec));
    if (fs::remove(path, ec)) total -= bytes;
  }
}

absl::Status WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  if (!out) return absl::InternalError("cannot write " + path);
  return absl::OkStatus();
}

namespace {

absl::StatusOr<int> OpenLockFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) return fd;
  const std::string message = "cannot open lock file " + path + ": " + std::strerror(errno);
  if (errno == EACCES || errno == EPERM || errno == EROFS) return absl::PermissionDeniedError(message);
  if (errno == ENOENT || errno == ENOTDIR) return absl::NotFoundError(message);
  return absl::UnavailableError(message);
}

// The holder's pid in the file; should it not be written, the lock holds
// all the same.
void WritePid(int fd) {
  const std::string pid = std::to_string(getpid());
  if (ftruncate(fd, 0) == 0 && pwrite(fd, pid.data(), pid.size(), 0) < 0) errno = 0;
}

}  // namespace

absl::StatusOr<FileLock> FileLock::Wait(const std::string& path) {
  absl::StatusOr<int> fd = OpenLockFile(path);
  if (!fd.ok()) return fd.status();
  while (flock(*fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      const std::string message = "cannot lock " + path + ": " + std::strerror(errno);
      close(*fd);
      return absl::UnavailableError(message);
    }
  }
  WritePid(*fd);
  return FileLock(*fd);
}

absl::StatusOr<FileLock> FileLock::Acquire(const std::string& path) {
  absl::StatusOr<int> opened = OpenLockFile(path);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {0};
    const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    close(fd);
    const std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?";
    return absl::FailedPreconditionError("process " + holder + " holds " + path);
  }
  WritePid(fd);
  return FileLock(fd);
}

FileLock::~FileLock() {
  if (fd_ >= 0) close(fd_);  // releases the flock
}

}  // namespace fusor
