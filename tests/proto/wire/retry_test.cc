#include "proto/wire/retry.h"

#include <gtest/gtest.h>

namespace fusor::wire {
namespace {

TEST(GrpcRetrierTest, RetriesUnavailableWithGrowingBackoffAndFreshContexts) {
  std::vector<absl::Duration> sleeps;
  RetryPolicy policy;
  policy.max_attempts = 4;
  policy.initial_backoff = absl::Milliseconds(10);
  policy.max_backoff = absl::Milliseconds(25);
  GrpcRetrier retrier(policy, [&](absl::Duration d) { sleeps.push_back(d); });
  std::set<grpc::ClientContext*> contexts;
  int calls = 0;
  grpc::Status st = retrier.Run("test", [&](grpc::ClientContext& ctx) {
    contexts.insert(&ctx);
    EXPECT_GT(ctx.deadline(), std::chrono::system_clock::now());
    return ++calls < 3 ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "down") : grpc::Status::OK;
  });
  EXPECT_TRUE(st.ok());
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(retrier.attempts_made(), 3);
  EXPECT_EQ(sleeps, (std::vector<absl::Duration>{absl::Milliseconds(10), absl::Milliseconds(20)}));
}

TEST(GrpcRetrierTest, GivesUpOnOtherCodesAndAfterMaxAttempts) {
  RetryPolicy policy;
  policy.max_attempts = 3;
  int sleeps = 0;
  GrpcRetrier retrier(policy, [&](absl::Duration) { ++sleeps; });
  int calls = 0;
  grpc::Status st = retrier.Run("test", [&](grpc::ClientContext&) {
    ++calls;
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad");
  });
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(calls, 1);
  calls = 0;
  st = retrier.Run("test", [&](grpc::ClientContext&) {
    ++calls;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "down");
  });
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(sleeps, 2);
  // A TLS handshake that failed is a setting to fix: said at once.
  calls = 0;
  st = retrier.Run("test", [&](grpc::ClientContext&) {
    ++calls;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Ssl handshake "
                        "failed: SSL_ERROR_SSL: certificate verify failed");
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(sleeps, 2);
}

TEST(GrpcRetrierTest, GivesUpWhenTheBackoffWouldPassTheTimeLimit) {
  RetryPolicy policy;
  policy.max_attempts = 1000;
  policy.initial_backoff = absl::Milliseconds(100);
  policy.max_backoff = absl::Milliseconds(400);
  policy.give_up_after = absl::Seconds(1);
  policy.retry_on = {grpc::StatusCode::RESOURCE_EXHAUSTED};
  absl::Duration slept;
  GrpcRetrier retrier(policy, [&](absl::Duration d) { slept += d; });
  grpc::Status st = retrier.Run("test", [&](grpc::ClientContext&) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "disk full");
  });
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(slept, absl::Milliseconds(100 + 200 + 400));  // a fourth sleep of 400 ms would pass 1 s
  EXPECT_EQ(retrier.attempts_made(), 4);
}

}  // namespace
}  // namespace fusor::wire
