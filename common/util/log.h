// Named spdlog loggers, one per component ("scheduler", "worker", ...).
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace fusor {

// The logger called `name`, created on first use, writing to stderr at the
// process-wide level (which main() sets with SetLogLevel).
std::shared_ptr<spdlog::logger> Logger(const std::string& name);

// "trace", "debug", "info", "warn", "error", "off"; false if unknown.
bool SetLogLevel(const std::string& level);

}  // namespace fusor
