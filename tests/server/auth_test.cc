// Bearer tokens: roles, revocation, and how long a valid token is
// remembered without reading the database again.
#include "server/auth.h"

#include <chrono>
#include <filesystem>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fusor::server {
namespace {

using ::testing::HasSubstr;

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("fusor-auth-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    auto db = db::TuningDb::Open((dir_ / "t.db").string());
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = std::move(*db);
  }
  void TearDown() override {
    db_.reset();
    std::filesystem::remove_all(dir_);
  }
  // A new token of `role`: its id and the "Bearer ..." header value.
  std::pair<std::string, std::string> Create(Role role, const std::string& name) {
    auto created = CreateToken(*db_, role, name, 1);
    EXPECT_TRUE(created.ok()) << created.status();
    return {created->first.id, "Bearer " + created->second};
  }

  std::filesystem::path dir_;
  std::unique_ptr<db::TuningDb> db_;
};

TEST_F(AuthTest, RolesAndRefusals) {
  Authenticator auth(db_.get());
  const auto [client_id, client] = Create(Role::kClient, "alice");
  const auto [admin_id, admin] = Create(Role::kAdmin, "ops");
  Caller caller;
  EXPECT_TRUE(auth.CheckAuthorization(client, {Role::kClient}, &caller).ok());
  EXPECT_EQ(caller.id, client_id);
  EXPECT_EQ(caller.name, "alice");
  EXPECT_TRUE(auth.CheckAuthorization(admin, {Role::kClient}).ok());  // admin counts as client

  grpc::Status st = auth.CheckAuthorization(client, {Role::kWorker});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(st.error_message(), HasSubstr("token 'alice' has role client; this call needs worker"));
  EXPECT_EQ(auth.CheckAuthorization(std::nullopt, {Role::kClient}).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(auth.CheckAuthorization(client.substr(7), {Role::kClient}).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);  // no "Bearer "
  st = auth.CheckAuthorization("Bearer fusor_0123", {Role::kClient});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(st.error_message(), HasSubstr("unknown or revoked token"));
}

TEST_F(AuthTest, RevocationIsSeenAtOnceAfterForgetAndWithinTheRecheckOtherwise) {
  Authenticator auth(db_.get());
  const auto [id, client] = Create(Role::kClient, "bob");
  ASSERT_TRUE(auth.CheckAuthorization(client, {Role::kClient}).ok());  // now remembered

  // Revoked in the database behind the authenticator's back (as
  // `fusor --db ... admin token revoke` does): still remembered for a while,
  // refused once the recheck is due.
  ASSERT_TRUE(db_->RevokeToken(id, 2).ok());
  const auto revoked_at = std::chrono::steady_clock::now();
  grpc::Status st;
  while ((st = auth.CheckAuthorization(client, {Role::kClient})).ok() &&
         std::chrono::steady_clock::now() - revoked_at < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_LE(std::chrono::steady_clock::now() - revoked_at,
            absl::ToChronoMilliseconds(Authenticator::kTokenRecheck) + std::chrono::seconds(3));  // slack for a loaded machine

  // Revoked through the scheduler (the Admin service calls Forget): refused
  // on the very next call.
  const auto [id2, carol] = Create(Role::kClient, "carol");
  ASSERT_TRUE(auth.CheckAuthorization(carol, {Role::kClient}).ok());
  ASSERT_TRUE(db_->RevokeToken(id2, 3).ok());
  auth.Forget();
  EXPECT_EQ(auth.CheckAuthorization(carol, {Role::kClient}).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

}  // namespace
}  // namespace fusor::server
