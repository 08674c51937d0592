// The device check's supervisor: a fault or a hang costs the item it hit,
// the rest still run in a new child; a child that gives up ends the list;
// the run's deadline is kept.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <csignal>

#include "bench/gpu/supervise.h"

namespace fusor::bench {
namespace {

using ::testing::HasSubstr;
using State = ItemOutcome::State;

TEST(SuperviseTest, AFaultOrAHangCostsOneItem) {
  const auto outcomes = SuperviseItems(6, {/*item_timeout_s=*/1.0, /*deadline_s=*/0}, [](int from, ItemChannel& c) {
    for (int i = from; i < 6; ++i) {
      c.Begin(i);
      if (i == 1) std::raise(SIGSEGV);
      if (i == 3) sleep(30);
      c.Done(i, "ran " + std::to_string(i) + " in the child started at " + std::to_string(from));
    }
  });
  ASSERT_EQ(outcomes.size(), 6u);
  EXPECT_EQ(outcomes[0].state, State::kDone);
  EXPECT_EQ(outcomes[0].text, "ran 0 in the child started at 0");
  EXPECT_EQ(outcomes[1].state, State::kCrashed);
  EXPECT_THAT(outcomes[1].text, HasSubstr("signal 11"));
  EXPECT_EQ(outcomes[2].text, "ran 2 in the child started at 2");
  EXPECT_EQ(outcomes[3].state, State::kTimedOut);
  EXPECT_THAT(outcomes[3].text, HasSubstr("no report within 1 s"));
  EXPECT_EQ(outcomes[4].text, "ran 4 in the child started at 4");
  EXPECT_EQ(outcomes[5].text, "ran 5 in the child started at 4");
}

TEST(SuperviseTest, AChildThatStopsEarlyIsFollowedByAnother) {
  // As the runner does after an error that leaves its CUDA context unusable.
  const auto outcomes = SuperviseItems(4, {}, [](int from, ItemChannel& c) {
    for (int i = from; i < 4; ++i) {
      c.Begin(i);
      c.Done(i, "from " + std::to_string(from));
      if (i == 1) return;
    }
  });
  EXPECT_EQ(outcomes[1].text, "from 0");
  EXPECT_EQ(outcomes[2].text, "from 2");
  EXPECT_EQ(outcomes[3].text, "from 2");
}

TEST(SuperviseTest, AnAbortSettlesEveryItemLeft) {
  const auto outcomes = SuperviseItems(3, {}, [](int from, ItemChannel& c) {
    c.Begin(from);
    c.Done(from, "one");
    c.Abort("no GPU: no CUDA driver");
  });
  EXPECT_EQ(outcomes[0].state, State::kDone);
  for (int i : {1, 2}) {
    EXPECT_EQ(outcomes[i].state, State::kAborted);
    EXPECT_EQ(outcomes[i].text, "no GPU: no CUDA driver");
  }
}

TEST(SuperviseTest, AChildThatEndsSilentlyCostsTheItemItWasGiven) {
  const auto outcomes = SuperviseItems(2, {}, [](int from, ItemChannel& c) {
    if (from == 0) _exit(7);
    c.Begin(from);
    c.Done(from, "ok");
  });
  EXPECT_EQ(outcomes[0].state, State::kCrashed);
  EXPECT_THAT(outcomes[0].text, HasSubstr("exited with code 7 before starting"));
  EXPECT_EQ(outcomes[1].state, State::kDone);
}

TEST(SuperviseTest, KeepsTheRunsDeadline) {
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes = SuperviseItems(50, {/*item_timeout_s=*/10, /*deadline_s=*/1.0}, [](int from, ItemChannel& c) {
    for (int i = from; i < 50; ++i) {
      c.Begin(i);
      usleep(100000);
      c.Done(i, "ok");
    }
  });
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(elapsed, 5.0);
  int done = 0, late = 0;
  for (const ItemOutcome& o : outcomes) {
    done += o.state == State::kDone;
    late += o.state == State::kOutOfTime;
  }
  EXPECT_GT(done, 0);
  EXPECT_GT(late, 30);
  EXPECT_EQ(done + late, 50);
}

}  // namespace
}  // namespace fusor::bench
