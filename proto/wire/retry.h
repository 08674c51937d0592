// Retrying a gRPC call: a fresh context and deadline per attempt,
// exponential backoff between attempts, one warning line per retry.
// Only for idempotent calls.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <set>
#include <string>

#include "absl/time/time.h"

namespace fusor::wire {

struct RetryPolicy {
  int max_attempts = 5;
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(5);
  absl::Duration attempt_deadline = absl::Seconds(30);
  std::set<grpc::StatusCode> retry_on = {grpc::StatusCode::UNAVAILABLE};
  // Retries stop once their backoff sleeps together would pass this.
  absl::Duration give_up_after = absl::InfiniteDuration();
};

// An UNAVAILABLE that is a failed TLS handshake (a certificate not trusted
// or not presented): a setting to fix, which is never retried.
bool IsTlsHandshakeFailure(const grpc::Status& status);

class GrpcRetrier {
 public:
  // `sleep` is injectable for tests.
  explicit GrpcRetrier(RetryPolicy policy, std::function<void(absl::Duration)> sleep = absl::SleepFor)
      : policy_(std::move(policy)), sleep_(std::move(sleep)) {}

  // Calls `attempt` with a fresh context until it succeeds, fails with a
  // code not in retry_on (or a TLS handshake failure), or max_attempts or
  // give_up_after is reached; returns the last status.
  grpc::Status Run(const std::string& what, const std::function<grpc::Status(grpc::ClientContext&)>& attempt) const;
  int attempts_made() const { return attempts_made_; }

 private:
  RetryPolicy policy_;
  std::function<void(absl::Duration)> sleep_;
  mutable int attempts_made_ = 0;
};

}  // namespace fusor::wire
