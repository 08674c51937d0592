#include "proto/wire/retry.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "common/util/log.h"

namespace fusor::wire {

bool IsTlsHandshakeFailure(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE &&
         absl::StrContains(absl::AsciiStrToLower(status.error_message()), "handshake");
}

grpc::Status GrpcRetrier::Run(const std::string& what,
                              const std::function<grpc::Status(grpc::ClientContext&)>& attempt) const {
  absl::Duration backoff = policy_.initial_backoff;
  absl::Duration waited;
  grpc::Status status;
  attempts_made_ = 0;
  for (int i = 1; i <= policy_.max_attempts; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + policy_.attempt_deadline));
    status = attempt(ctx);
    attempts_made_ = i;
    if (status.ok() || !policy_.retry_on.count(status.error_code()) || IsTlsHandshakeFailure(status) ||
        i == policy_.max_attempts || waited + backoff > policy_.give_up_after) {
      return status;
    }
    Logger("rpc")->warn("{} failed ({}: {}); retry {}/{} in {}", what, static_cast<int>(status.error_code()),
                        status.error_message(), i, policy_.max_attempts - 1, absl::FormatDuration(backoff));
    sleep_(backoff);
    waited += backoff;
    backoff = std::min(backoff * 2, policy_.max_backoff);
  }
  return status;
}

}  // namespace fusor::wire
