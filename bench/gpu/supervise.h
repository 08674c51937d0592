// Runs a list of items (a chain's candidates, then its baseline) in child
// processes so that a kernel that faults or hangs costs one item, not the
// run: a child starts at some item and works through the rest in order,
// announcing each; the parent kills a child whose item runs past its
// timeout, records the item it died on, and starts a new child at the
// next. Plain C++17 and POSIX (the GPU device check builds it where only
// CUDA is installed). The parent must not have initialized CUDA: a child
// creates its own context.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace fusor::bench {

struct ItemOutcome {
  enum class State { kNotRun, kDone, kCrashed, kTimedOut, kAborted, kOutOfTime };
  State state = State::kNotRun;
  std::string text;  // the child's report (kDone) or why there is none
};

// What a child is given: report the start and the end of each item it
// runs, or give up on every item left (say, no device).
class ItemChannel {
 public:
  explicit ItemChannel(int fd) : fd_(fd) {}
  void Begin(int item);
  void Done(int item, const std::string& text);  // one line
  void Abort(const std::string& why);
 private:
  void Write(const std::string& line);
  int fd_;
};

struct SuperviseOptions {
  double item_timeout_s = 60;  // from an item's start to its report
  double deadline_s = 0;       // for all items; 0: none
};

// Runs items [0, count): `child(from, channel)` runs in a forked process
// and should run items from..count-1 in order; it may return (or exit)
// early after an item that leaves its process unusable, and the next child
// resumes after it. Returns each item's outcome.
std::vector<ItemOutcome> SuperviseItems(int count, const SuperviseOptions& options,
                                        const std::function<void(int from, ItemChannel& channel)>& child);

const char* StateName(ItemOutcome::State state);

}  // namespace fusor::bench
