#include "proto/wire/retry.h"

#include <algorithm>

#include "common/util/log.h"

namespace fusor::wire {

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
    if (status.ok() || !policy_.retry_on.count(status.error_code()) || i == policy_.max_attempts ||
        waited + backoff > policy_.give_up_after) {
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
