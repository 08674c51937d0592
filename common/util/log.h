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

// "text": `2026-12-07T10:00:00.123+01:00 info [scheduler] message`;
// "json": one object per line, {"time", "level", "logger", "message"}
// (the same local time with its UTC offset). For every logger, those made
// before included; false if unknown.
bool SetLogFormat(const std::string& format);

}  // namespace fusor
