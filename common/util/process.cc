#include "common/util/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace fusor {
namespace {

using Clock = std::chrono::steady_clock;

// The children of RunProcess not yet waited for, by process group, and how
// long they have been held in all (HoldChildren).
struct Children {
  std::mutex mu;
  std::set<pid_t> groups;
  bool held = false;
  bool own_groups = true;  // false: KeepChildrenInMyGroup
  Clock::time_point held_since;
  Clock::duration held_before{};  // of holds that ended

  Clock::duration HeldSoFar() {
    std::lock_guard<std::mutex> lock(mu);
    return held_before + (held ? Clock::now() - held_since : Clock::duration{});
  }
};

Children& RunningChildren() {
  static auto* children = new Children;
  return *children;
}

}  // namespace

void KeepChildrenInMyGroup() {
  Children& c = RunningChildren();
  std::lock_guard<std::mutex> lock(c.mu);
  c.own_groups = false;
}

void HoldChildren(bool hold) {
  Children& c = RunningChildren();
  std::lock_guard<std::mutex> lock(c.mu);
  if (hold == c.held) return;
  c.held = hold;
  if (hold) {
    c.held_since = Clock::now();
  } else {
    c.held_before += Clock::now() - c.held_since;
  }
  for (pid_t group : c.groups) kill(-group, hold ? SIGSTOP : SIGCONT);
}

absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                         const std::string& log_path, double timeout_s) {
  if (argv.empty()) return absl::InvalidArgumentError("RunProcess: empty argv");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const char* log = log_path.empty() ? "/dev/null" : log_path.c_str();
  posix_spawn_file_actions_addopen(&actions, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  Children& children = RunningChildren();
  bool own_group = true;
  {
    std::lock_guard<std::mutex> lock(children.mu);
    own_group = children.own_groups;
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, (own_group ? POSIX_SPAWN_SETPGROUP : 0) | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attr, &empty);

  auto start = std::chrono::steady_clock::now();
  const Clock::duration held_at_start = children.HeldSoFar();
  pid_t pid = -1;
  int rc = 0;
  {
    // Registered before anyone may hold children again: a child never misses a hold.
    std::lock_guard<std::mutex> lock(children.mu);
    rc = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
    if (rc == 0 && own_group) {
      children.groups.insert(pid);
      if (children.held) kill(-pid, SIGSTOP);
    }
  }
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot start '", argv[0], "': ", strerror(rc)));
  }
  auto forget = [&] {
    std::lock_guard<std::mutex> lock(children.mu);
    children.groups.erase(pid);
  };

  ProcessResult result;
  const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  auto sleep = std::chrono::microseconds(200);
  int status = 0;
  while (true) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) {
      forget();
      return absl::InternalError(absl::StrCat("waitpid: ", strerror(errno)));
    }
    // The time the child was held does not count.
    if (std::chrono::steady_clock::now() >= start + timeout + (children.HeldSoFar() - held_at_start)) {
      if (own_group) kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      result.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(20000));
  }
  forget();
  // Leave nothing of the group behind (e.g. a compiler's subprocesses).
  if (own_group) kill(-pid, SIGKILL);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!result.timed_out) {
    if (WIFSIGNALED(status)) {
      result.signaled = true;
      result.signal = WTERMSIG(status);
    } else if (WIFEXITED(status)) {
      result.exit_code = WEXITSTATUS(status);
    }
  }
  return result;
}

absl::StatusOr<ForkedResult> RunForked(const std::function<int(std::string* output)>& body, double timeout_s) {
  const int out_fd = memfd_create("fusor-forked-output", MFD_CLOEXEC);
  if (out_fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", strerror(errno)));
  // The child holds the pipe's write end until it exits: the parent waits
  // for its hang-up with a deadline instead of polling waitpid.
  int done_pipe[2];
  if (pipe2(done_pipe, O_CLOEXEC) != 0) {
    close(out_fd);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    close(out_fd);
    close(done_pipe[0]);
    close(done_pipe[1]);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, SIG_DFL);
    std::string output;
    int code = 124;
    // Never unwind into the parent's stack frames from the child.
    try {
      code = body(&output);
    } catch (const std::exception& e) {
      output = std::string("the forked body threw: ") + e.what();
    } catch (...) {
      output = "the forked body threw";
    }
    for (size_t done = 0; done < output.size();) {
      const ssize_t n = write(out_fd, output.data() + done, output.size() - done);
      if (n <= 0) _exit(125);
      done += static_cast<size_t>(n);
    }
    _exit(code);
  }
  close(done_pipe[1]);
  // A child forked meanwhile by another thread may also hold the write end,
  // so waitpid is asked too, at least every 100 ms.
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  ForkedResult result;
  int status = 0;
  pid_t ended = 0;
  while ((ended = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) {
    pollfd hangup{done_pipe[0], POLLIN, 0};
    if (poll(&hangup, 1, 100) > 0) {
      ended = waitpid(pid, &status, 0);
      break;
    }
  }
  close(done_pipe[0]);
  if (ended == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    result.process.timed_out = true;
  } else if (WIFSIGNALED(status)) {
    result.process.signaled = true;
    result.process.signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    result.process.exit_code = WEXITSTATUS(status);
  }
  result.process.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  lseek(out_fd, 0, SEEK_SET);
  char buf[1 << 16];
  for (ssize_t n; (n = read(out_fd, buf, sizeof(buf))) > 0;) result.output.append(buf, static_cast<size_t>(n));
  close(out_fd);
  return result;
}

std::string CurrentExecutable(const std::string& fallback) {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : fallback;
}

std::string ReadTail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  std::streamoff size = in.tellg();
  std::streamoff start = size > static_cast<std::streamoff>(max_bytes) ? size - max_bytes : 0;
  in.seekg(start);
  std::string text(static_cast<size_t>(size - start), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  return text;
}

absl::StatusOr<TempDir> TempDir::Create(const std::string& base_dir, const std::string& prefix) {
  std::string base = base_dir;
  if (base.empty()) {
    std::error_code ec;
    base = std::filesystem::temp_directory_path(ec).string();
    if (ec || base.empty()) base = "/tmp";
  }
  std::string pattern = absl::StrCat(base, "/", prefix, "XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create a temporary directory: ", strerror(errno)));
  }
  return TempDir(pattern);
}

TempDir::TempDir(TempDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace fusor
