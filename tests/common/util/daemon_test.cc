// What the scheduler and worker programs share as services: the YAML
// --config file under the command line, JSON logs, systemd readiness.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/util/build_info.h"
#include "common/util/config_file.h"
#include "common/util/log.h"
#include "common/util/notify.h"

namespace fusor {
namespace {

using ::testing::HasSubstr;

struct Parsed {
  std::optional<int> rc;  // ParseCommandLine's: nullopt to go on
  std::string listen;
  double drain = 5;
  bool insecure = false;
  std::vector<std::string> vary;
};

class ConfigFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    const std::string path = ::testing::TempDir() + "/config-" + std::to_string(++files_) + ".yaml";
    std::ofstream(path) << text;
    return path;
  }
  Parsed Parse(std::vector<std::string> args) {
    Parsed p;
    CLI::App app{"test"};
    app.add_option("--listen", p.listen);
    app.add_option("--drain-seconds", p.drain);
    app.add_flag("--insecure", p.insecure);
    app.add_option("--vary", p.vary);
    AddConfigFile(app);
    args.insert(args.begin(), "prog");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    p.rc = ParseCommandLine(app, "prog", static_cast<int>(argv.size()), argv.data());
    return p;
  }
  int files_ = 0;
};

TEST_F(ConfigFileTest, ValuesComeFromTheFileAndFlagsOverrideThem) {
  const std::string config =
      Write("# a comment\nlisten: 0.0.0.0:7788\ndrain-seconds: 2.5\ninsecure: true\nvary: [batch, seq]\n");
  Parsed p = Parse({"--config", config});
  ASSERT_FALSE(p.rc.has_value());
  EXPECT_EQ(p.listen, "0.0.0.0:7788");
  EXPECT_EQ(p.drain, 2.5);
  EXPECT_TRUE(p.insecure);
  EXPECT_THAT(p.vary, ::testing::ElementsAre("batch", "seq"));

  p = Parse({"--config", config, "--listen", "127.0.0.1:1"});
  ASSERT_FALSE(p.rc.has_value());
  EXPECT_EQ(p.listen, "127.0.0.1:1");
  EXPECT_EQ(p.drain, 2.5);

  // What the app's values write out as a config file reads back the same.
  {
    CLI::App app{"test"};
    std::string listen = "a:1";
    std::vector<std::string> vary;
    app.add_option("--listen", listen);
    app.add_option("--vary", vary);
    AddConfigFile(app);
    std::vector<std::string> args = {"prog", "--listen", "h:2", "--vary", "x", "--vary", "y"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    ASSERT_FALSE(ParseCommandLine(app, "prog", static_cast<int>(argv.size()), argv.data()).has_value());
    const std::string written = app.config_to_str(true, true);
    p = Parse({"--config", Write(written)});
    ASSERT_FALSE(p.rc.has_value()) << written;
    EXPECT_EQ(p.listen, "h:2");
    EXPECT_THAT(p.vary, ::testing::ElementsAre("x", "y"));
  }

  p = Parse({"--config", Write("")});  // empty: nothing set
  ASSERT_FALSE(p.rc.has_value());
  EXPECT_EQ(p.listen, "");
}

TEST_F(ConfigFileTest, ABadFileIsAUsageErrorNamingTheLine) {
  const std::pair<std::string, std::string> cases[] = {
      {"listen: a\nlisen: b\n", "lisen"},                                         // an unknown name
      {"listen: a\ntls:\n  cert: x\n", "--config line 3: 'tls' needs a value"},  // a nested map
      {"listen: [a\n", "--config line 2"},                                      // YAML that does not parse
      {"- listen\n", "expected a map"},
  };
  for (const auto& [text, said] : cases) {
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(Parse({"--config", Write(text)}).rc, std::optional<int>(2)) << text;
    EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr(said));
  }
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(Parse({"--config", ::testing::TempDir() + "/no-such.yaml"}).rc, std::optional<int>(2));
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr("no-such.yaml"));
}

// One JSON object per line, whatever the message holds; the time carries
// its offset from UTC, in either format.
TEST(LogTest, JsonLinesWithTheTimeZone) {
  auto log = Logger("daemon-test");
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(SetLogFormat("json"));
  log->warn("a \"quoted\" path C:\\x\nsecond line\ttab \x01");
  log->flush();
  ASSERT_TRUE(SetLogFormat("text"));
  log->info("plain");
  log->flush();
  const std::string out = ::testing::internal::GetCapturedStderr();
  std::istringstream lines(out);
  std::string first, second;
  std::getline(lines, first);
  std::getline(lines, second);
  const nlohmann::json j = nlohmann::json::parse(first);
  EXPECT_EQ(j["level"], "warning");
  EXPECT_EQ(j["logger"], "daemon-test");
  EXPECT_EQ(j["message"], "a \"quoted\" path C:\\x\nsecond line\ttab \x01");
  const std::regex time(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d)");
  EXPECT_TRUE(std::regex_match(j["time"].get<std::string>(), time)) << j["time"];
  EXPECT_TRUE(std::regex_search(second, std::regex(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d info \[daemon-test\] plain$)")))
      << second;
  EXPECT_FALSE(SetLogFormat("xml"));
}

// sd_notify: READY=1 with a status reaches $NOTIFY_SOCKET; without it, nothing happens.
TEST(NotifyTest, ReadinessReachesTheNotifySocket) {
  unsetenv("NOTIFY_SOCKET");
  NotifyReady("no socket");  // a no-op
  const std::string path = ::testing::TempDir() + "/notify-" + std::to_string(getpid());
  std::filesystem::remove(path);
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof(addr.sun_path));
  std::copy(path.begin(), path.end(), addr.sun_path);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  setenv("NOTIFY_SOCKET", path.c_str(), 1);
  NotifyReady("serving on port 7788");
  NotifyStopping();
  unsetenv("NOTIFY_SOCKET");
  char buf[256];
  const timeval limit{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  ssize_t n = recv(fd, buf, sizeof(buf), 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, n), "READY=1\nSTATUS=serving on port 7788");
  n = recv(fd, buf, sizeof(buf), 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, n), "STOPPING=1");
  close(fd);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace fusor
