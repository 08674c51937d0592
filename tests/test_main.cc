// gtest main for tests that start worker jobs: the job runner re-executes
// the current binary as `<binary> __run-job DIR`.
#include <gtest/gtest.h>

#include <string>

#include "worker/job.h"

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "__run-job") return fusor::worker::RunJobMain(argv[2]);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
