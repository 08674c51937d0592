// Dialing a scheduler: which addresses count as this machine (no warning
// for a plaintext token there) and clear errors for bad TLS files.
#include "proto/wire/channel.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fusor::wire {
namespace {

using ::testing::HasSubstr;

TEST(ChannelTest, LoopbackAddresses) {
  for (const char* a : {"127.0.0.1:7788", "localhost:1", "[::1]:7788", "ipv4:127.0.0.2:5", "unix:/tmp/s"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"10.0.0.1:7788", "scheduler:7788", "[2001:db8::1]:7788", "0.0.0.0:7788"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

TEST(ChannelTest, BadTlsFilesAreClearErrors) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("fusor-channel-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string text = (dir / "not.pem").string();
  std::ofstream(text) << "hello\n";
  const std::string pem = (dir / "ok.pem").string();
  std::ofstream(pem) << "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";

  ClientTls missing;
  missing.ca_file = (dir / "absent.pem").string();
  auto a = Dial("127.0.0.1:1", "", missing);
  ASSERT_TRUE(absl::IsInvalidArgument(a.status())) << a.status();
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("--tls-ca: cannot read"));

  ClientTls not_pem;
  not_pem.ca_file = text;
  auto b = Dial("127.0.0.1:1", "", not_pem);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("is not PEM"));

  ClientTls half;
  half.ca_file = pem;
  half.cert_file = pem;
  auto c = Dial("127.0.0.1:1", "", half);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("needs both --tls-cert and --tls-key"));

  ClientTls system_roots;
  system_roots.enabled = true;
  EXPECT_TRUE(Dial("127.0.0.1:1", "t", system_roots).ok());
  EXPECT_TRUE(Dial("127.0.0.1:1", "t").ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fusor::wire
