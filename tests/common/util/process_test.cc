#include "common/util/process.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <thread>
#include <utility>

#include <gtest/gtest.h>

namespace fusor {
namespace {

TEST(ProcessTest, KillsAHangingChildAndItsGroupAtTheTimeout) {
  auto r = RunProcess({"sh", "-c", "sleep 30 & sleep 30"}, "", 0.3);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->timed_out);
  EXPECT_LT(r->seconds, 5);
}

TEST(ProcessTest, ReportsSignalsAndExitCodes) {
  auto crash = RunProcess({"sh", "-c", "kill -SEGV $$"}, "", 10);
  ASSERT_TRUE(crash.ok());
  EXPECT_TRUE(crash->signaled);
  EXPECT_EQ(crash->signal, SIGSEGV);
  auto code = RunProcess({"sh", "-c", "exit 7"}, "", 10);
  EXPECT_EQ(code->exit_code, 7);
  auto missing = RunProcess({"/nonexistent/binary"}, "", 1);
  EXPECT_FALSE(missing.ok());
}

TEST(ProcessTest, RunForkedReturnsTheChildsOutputAndCode) {
  // Larger than a pipe's buffer: the output does not go through one.
  auto r = RunForked([](std::string* out) { *out = std::string(1 << 20, 'x') + "end"; return 5; }, 30);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->process.signaled);
  EXPECT_EQ(r->process.exit_code, 5);
  EXPECT_EQ(r->output.size(), (1u << 20) + 3);
  EXPECT_EQ(r->output.substr(r->output.size() - 3), "end");
}

TEST(ProcessTest, RunForkedSurvivesACrashAndAHang) {
  auto crash = RunForked([](std::string*) { raise(SIGSEGV); return 0; }, 30);
  ASSERT_TRUE(crash.ok());
  EXPECT_TRUE(crash->process.signaled);
  EXPECT_EQ(crash->process.signal, SIGSEGV);
  auto hang = RunForked([](std::string*) { pause(); return 0; }, 0.3);
  ASSERT_TRUE(hang.ok());
  EXPECT_TRUE(hang->process.timed_out);
  EXPECT_LT(hang->process.seconds, 10);
}

TEST(ProcessTest, ABodyThatThrowsEndsTheChildNotTheParent) {
  const pid_t parent = getpid();
  auto r = RunForked([](std::string*) -> int { throw std::runtime_error("thrown in the child"); }, 30);
  ASSERT_EQ(getpid(), parent);  // the child did not come back through here
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->process.signaled);
  EXPECT_EQ(r->process.exit_code, 124);
  EXPECT_EQ(r->output, "the forked body threw: thrown in the child");
}

TEST(TempDirTest, DefaultsToTmpdir) {
  auto base = TempDir::Create("", "fusor-tmpdir-base-");
  ASSERT_TRUE(base.ok());
  const char* old = getenv("TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  setenv("TMPDIR", base->path().c_str(), 1);
  auto dir = TempDir::Create("", "fusor-tempdir-");
  if (old != nullptr) setenv("TMPDIR", saved.c_str(), 1); else unsetenv("TMPDIR");
  ASSERT_TRUE(dir.ok());
  EXPECT_EQ(dir->path().rfind(base->path() + "/fusor-tempdir-", 0), 0u) << dir->path();
}

TEST(TempDirTest, RemovesItsContents) {
  std::string path;
  {
    auto dir = TempDir::Create("/tmp", "fusor-tempdir-");
    ASSERT_TRUE(dir.ok());
    path = dir->path();
    auto r = RunProcess({"sh", "-c", "echo hi > " + path + "/f"}, path + "/log", 10);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(ReadTail(path + "/f", 100), "hi\n");
  }
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

// A held child is stopped (it makes no progress), and the time it is held
// does not count against its timeout.
TEST(ProcessTest, HeldChildrenStopAndTheirTimeoutWaits) {
  auto dir = TempDir::Create("/tmp", "fusor-hold-");
  ASSERT_TRUE(dir.ok());
  const std::string out = dir->path() + "/ticks";
  std::thread holder([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    HoldChildren(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    HoldChildren(false);
  });
  // 0.4 s of work against a 0.5 s limit: it ends only because the 0.6 s held are not counted.
  auto r = RunProcess({"sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 0.05; echo $i >> " + out + "; done"}, "", 0.5);
  holder.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->timed_out);
  EXPECT_EQ(r->exit_code, 0);
  EXPECT_GE(r->seconds, 0.9);
  std::ifstream ticks(out);
  EXPECT_EQ(std::count(std::istreambuf_iterator<char>(ticks), std::istreambuf_iterator<char>(), '\n'), 8);
}

// A job runner's compilers stay in its group, so that holding the runner's
// group holds them; elsewhere each child leads a group of its own.
TEST(ProcessTest, ChildrenKeptInTheGroupOfTheirParent) {
  auto dir = TempDir::Create("/tmp", "fusor-group-");
  ASSERT_TRUE(dir.ok());
  const std::string file = dir->path() + "/pgrp";
  // The child's process group and its own pid, as it sees them.
  const std::vector<std::string> report = {"sh", "-c", "cut -d' ' -f1,5 /proc/$$/stat > " + file};
  auto read = [&] {
    std::ifstream in(file);
    long pid = 0, group = 0;
    in >> pid >> group;
    return std::make_pair(pid, group);
  };
  ASSERT_TRUE(RunProcess(report, "", 10).ok());
  const auto [pid, group] = read();
  EXPECT_EQ(group, pid);
  auto forked = RunForked(
      [&](std::string*) {
        KeepChildrenInMyGroup();
        return RunProcess(report, "", 10).ok() ? 0 : 1;
      },
      20);
  ASSERT_TRUE(forked.ok()) << forked.status();
  EXPECT_EQ(forked->process.exit_code, 0);
  EXPECT_EQ(read().second, static_cast<long>(getpgrp()));
}

}  // namespace
}  // namespace fusor
