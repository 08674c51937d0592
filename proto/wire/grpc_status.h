// absl::Status <-> grpc::Status, the only place status codes cross the RPC
// boundary. Codes map one to one; messages are kept.
#pragma once

#include <grpcpp/grpcpp.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace fusor::wire {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// A retry hint (for RESOURCE_EXHAUSTED): an absl::Status payload inside
// fusor, the trailing metadata `retry-after-ms` (decimal) on the wire.
inline constexpr char kRetryAfterMetadata[] = "retry-after-ms";
absl::Status WithRetryAfter(absl::Status status, absl::Duration after);
std::optional<absl::Duration> RetryAfter(const absl::Status& status);

// At the server boundary: the status, its retry hint as trailing metadata.
grpc::Status ToGrpcStatus(const absl::Status& status, grpc::ServerContextBase* ctx);
// At the client: the status of a finished call, with the hint it carried.
absl::Status FromGrpcStatus(const grpc::Status& status, const grpc::ClientContext& ctx);

}  // namespace fusor::wire
