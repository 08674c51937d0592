// absl::Status <-> grpc::Status, the only place status codes cross the RPC
// boundary. Codes map one to one; messages are kept.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace fusor::wire {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace fusor::wire
