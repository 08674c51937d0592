#include "common/util/log.h"

#include <cstdio>
#include <mutex>
#include <string_view>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace fusor {
namespace {

std::mutex mu;
bool json = false;  // guarded by mu

// %* : the message as the inside of a JSON string.
class JsonEscapedMessage : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    for (char c : std::string_view(msg.payload.data(), msg.payload.size())) {
      switch (c) {
        case '"': dest.append(std::string_view("\\\"")); break;
        case '\\': dest.append(std::string_view("\\\\")); break;
        case '\n': dest.append(std::string_view("\\n")); break;
        case '\r': dest.append(std::string_view("\\r")); break;
        case '\t': dest.append(std::string_view("\\t")); break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char hex[8];
            std::snprintf(hex, sizeof(hex), "\\u%04x", static_cast<unsigned>(c));
            dest.append(std::string_view(hex));
          } else {
            dest.push_back(c);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JsonEscapedMessage>(); }
};

// Local time with its offset from UTC, to the millisecond.
std::unique_ptr<spdlog::formatter> Formatter() {
  auto f = std::make_unique<spdlog::pattern_formatter>();
  if (json) {
    f->add_flag<JsonEscapedMessage>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","logger":"%n","message":"%*"})");
  } else {
    f->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ [%n] %v");
  }
  return f;
}

}  // namespace

std::shared_ptr<spdlog::logger> Logger(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu);
  if (auto existing = spdlog::get(name)) return existing;
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_formatter(Formatter());
  return logger;
}

bool SetLogLevel(const std::string& level) {
  spdlog::level::level_enum l = spdlog::level::from_str(level);
  if (l == spdlog::level::off && level != "off") return false;
  spdlog::set_level(l);
  return true;
}

bool SetLogFormat(const std::string& format) {
  if (format != "text" && format != "json") return false;
  std::lock_guard<std::mutex> lock(mu);
  json = format == "json";
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->set_formatter(Formatter()); });
  return true;
}

}  // namespace fusor
