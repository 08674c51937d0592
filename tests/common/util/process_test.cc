#include "worker/process.h"

#include <signal.h>

#include <gtest/gtest.h>

namespace fusor::worker {
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

}  // namespace
}  // namespace fusor::worker
