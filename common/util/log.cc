#include "common/util/log.h"

#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace fusor {

std::shared_ptr<spdlog::logger> Logger(const std::string& name) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (auto existing = spdlog::get(name)) return existing;
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ [%n] %v");
  return logger;
}

bool SetLogLevel(const std::string& level) {
  spdlog::level::level_enum l = spdlog::level::from_str(level);
  if (l == spdlog::level::off && level != "off") return false;
  spdlog::set_level(l);
  return true;
}

}  // namespace fusor
