// Child processes with a time limit: the isolation unit for compiling and
// running candidates, and for third-party code that may crash on bad input
// (ONNX's shape inference). A child that crashes or hangs ends alone.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fusor {

struct ProcessResult {
  int exit_code = -1;    // valid when !signaled && !timed_out
  int signal = 0;        // the terminating signal, when signaled
  bool signaled = false;
  bool timed_out = false;
  double seconds = 0;
};

// Runs argv[0] (searched in PATH) with stdout and stderr appended to
// `log_path` (or discarded when empty), in its own process group (but see
// KeepChildrenInMyGroup). After `timeout_s` the whole group is killed with
// SIGKILL and timed_out is set.
// Fails only if the process could not be started.
absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                         const std::string& log_path, double timeout_s);

// From now on RunProcess starts its children in this process's group, not
// in groups of their own: for a process that is itself held as a group (a
// worker's job runner), so that holding it holds its compilers too. On a
// timeout only the child itself is then killed; whatever it started ends
// with this process's group.
void KeepChildrenInMyGroup();

// Holds the children RunProcess started and has not yet waited for (and
// those it starts while holding): SIGSTOP to each one's process group, or,
// with `hold` false, SIGCONT. The time they are held does not count
// against their timeouts. Thread-safe; holding twice is holding once.
void HoldChildren(bool hold);

// Runs `body` in a forked child of this process (no exec), killed after
// `timeout_s`. The child's exit code is what `body` returns; what it puts
// in its argument comes back as `output` (through an anonymous memory
// file, whatever its size). In the child the crash signals are reset to
// their defaults, so a crash ends it by the signal even under a
// sanitizer's or fuzzer's handlers; a body that throws ends it with exit
// code 124. Fails only if the child could not be started.
struct ForkedResult {
  ProcessResult process;
  std::string output;
};
absl::StatusOr<ForkedResult> RunForked(const std::function<int(std::string* output)>& body, double timeout_s);

// The path of the running executable (from /proc/self/exe), or `fallback`.
std::string CurrentExecutable(const std::string& fallback);

// The last `max_bytes` of a file, for error messages; empty if unreadable.
std::string ReadTail(const std::string& path, size_t max_bytes);

// A fresh directory under `base_dir` (empty: the system's temporary
// directory: $TMPDIR, TMP, TEMP or TEMPDIR, else /tmp), removed with its
// contents on destruction.
class TempDir {
 public:
  static absl::StatusOr<TempDir> Create(const std::string& base_dir, const std::string& prefix);
  TempDir(TempDir&& other) noexcept;
  TempDir& operator=(TempDir&&) = delete;
  TempDir(const TempDir&) = delete;
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace fusor
