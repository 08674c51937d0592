// Human-readable output of the CLI.
#pragma once

#include <string>

#include "fusor/v1/scheduler.pb.h"

namespace fusor::client {

// The result block `fusor tune` ends with: schedule, predicted vs measured
// time, speedup over the unfused baseline, and where the answer came from.
std::string FormatResult(const std::string& workload_name, const v1::TuneResult& result);
// Why a lookup has no record of its own: the nearest record and what differs.
std::string FormatExplanation(const std::string& workload_name, const v1::Explanation& why);

// One progress line: a bar of candidates measured out of the budget, the
// failures and the best time so far.
std::string FormatProgress(const v1::TuneProgress& progress);

std::string FormatWorkers(const v1::ListWorkersResponse& workers, int64_t now_ms);

std::string FormatTask(const v1::TaskInfo& task);

// "1.234 ms", "56.7 us", "2.10 s".
std::string FormatSeconds(double seconds);

}  // namespace fusor::client
