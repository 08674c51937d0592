#include "bench/gpu/supervise.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>

namespace fusor::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string HowItEnded(int status) {
  if (WIFSIGNALED(status)) {
    return std::string("the child died of signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "the child exited with code " + std::to_string(WEXITSTATUS(status));
}

// One child's run from item `from`: what it reported, until it ended, was
// killed or gave up. Returns the first item not yet settled.
int RunChild(int from, int count, const SuperviseOptions& options, Clock::time_point start,
             const std::function<void(int, ItemChannel&)>& child, std::vector<ItemOutcome>& out) {
  int fds[2];
  if (pipe(fds) != 0) {
    out[from] = {ItemOutcome::State::kCrashed, std::string("pipe: ") + std::strerror(errno)};
    return from + 1;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    ItemChannel channel(fds[1]);
    try {
      child(from, channel);
    } catch (const std::exception& e) {
      channel.Abort(std::string("exception: ") + e.what());
    }
    std::fflush(stdout);
    _exit(0);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    out[from] = {ItemOutcome::State::kCrashed, std::string("fork: ") + std::strerror(errno)};
    return from + 1;
  }
  int next = from, current = -1;
  Clock::time_point last_word = Clock::now();
  std::string buffer;
  bool killed = false;
  while (true) {
    double wait_s = options.item_timeout_s - Since(last_word);
    if (options.deadline_s > 0) wait_s = std::min(wait_s, options.deadline_s - Since(start));
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, wait_s <= 0 ? 0 : static_cast<int>(std::min(wait_s, 3600.0) * 1000) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0 && wait_s <= 0) {  // nothing said in time (a last word is read first)
      kill(pid, SIGKILL);
      killed = true;
      const bool deadline = options.deadline_s > 0 && Since(start) >= options.deadline_s;
      // Hung between items: charged to the next only if this child has
      // not finished one yet (its setup hangs); else the next child tries it.
      const int item = current >= 0 ? current : next == from ? from : count;
      if (item < count) {
        std::ostringstream timeout;
        timeout << "no report within " << options.item_timeout_s << " s; killed";
        out[item] = deadline ? ItemOutcome{ItemOutcome::State::kOutOfTime, "the run's deadline passed; killed"}
                             : ItemOutcome{ItemOutcome::State::kTimedOut, timeout.str()};
        next = item + 1;
      }
      break;
    }
    if (ready == 0) continue;
    if (ready < 0) {  // cannot watch the child: end it, charged like a crash
      kill(pid, SIGKILL);
      break;
    }
    char chunk[4096];
    const ssize_t n = read(fds[0], chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the child ended
    last_word = Clock::now();  // the timeout runs from the child's last word
    buffer.append(chunk, static_cast<size_t>(n));
    for (size_t eol; (eol = buffer.find('\n')) != std::string::npos; buffer.erase(0, eol + 1)) {
      std::istringstream line(buffer.substr(0, eol));
      std::string verb;
      int item = -1;
      line >> verb;
      if (verb == "ABORT") {
        std::string why;
        std::getline(line >> std::ws, why);
        for (int i = next; i < count; ++i) out[i] = {ItemOutcome::State::kAborted, why};
        next = count;
        current = -1;
        continue;
      }
      line >> item;
      if (item < next || item >= count) continue;  // not the item expected
      if (verb == "BEGIN") {
        current = item;
      } else if (verb == "DONE") {
        std::string text;
        std::getline(line >> std::ws, text);
        out[item] = {ItemOutcome::State::kDone, text};
        next = item + 1;
        current = -1;
      }
    }
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!killed && current >= 0) {
    out[current] = {ItemOutcome::State::kCrashed, HowItEnded(status)};
    next = current + 1;
  } else if (!killed && next == from) {
    out[from] = {ItemOutcome::State::kCrashed, HowItEnded(status) + " before starting this item"};
    next = from + 1;
  }
  return next;
}

}  // namespace

void ItemChannel::Write(const std::string& line) {
  std::string text = line;
  std::replace(text.begin(), text.end(), '\n', ' ');
  text += '\n';
  for (size_t at = 0; at < text.size();) {
    const ssize_t n = write(fd_, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the parent is gone
    at += static_cast<size_t>(n);
  }
}

void ItemChannel::Begin(int item) { Write("BEGIN " + std::to_string(item)); }
void ItemChannel::Done(int item, const std::string& text) { Write("DONE " + std::to_string(item) + " " + text); }
void ItemChannel::Abort(const std::string& why) { Write("ABORT " + why); }

std::vector<ItemOutcome> SuperviseItems(int count, const SuperviseOptions& options,
                                        const std::function<void(int from, ItemChannel& channel)>& child) {
  std::vector<ItemOutcome> out(static_cast<size_t>(std::max(count, 0)));
  const Clock::time_point start = Clock::now();
  for (int next = 0; next < count;) {
    if (options.deadline_s > 0 && Since(start) >= options.deadline_s) {
      for (int i = next; i < count; ++i) out[i] = {ItemOutcome::State::kOutOfTime, "the run's deadline passed"};
      break;
    }
    next = RunChild(next, count, options, start, child, out);
  }
  return out;
}

const char* StateName(ItemOutcome::State state) {
  switch (state) {
    case ItemOutcome::State::kNotRun: return "not run";
    case ItemOutcome::State::kDone: return "done";
    case ItemOutcome::State::kCrashed: return "crashed";
    case ItemOutcome::State::kTimedOut: return "timed out";
    case ItemOutcome::State::kAborted: return "aborted";
    case ItemOutcome::State::kOutOfTime: return "out of time";
  }
  return "?";
}

}  // namespace fusor::bench
