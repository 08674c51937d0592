#include "proto/wire/grpc_status.h"

#include <utility>

namespace fusor::wire {
namespace {

// absl and gRPC share the canonical code numbering; the table makes the
// correspondence explicit (and is what the test checks).
constexpr std::pair<absl::StatusCode, grpc::StatusCode> kCodes[] = {
    {absl::StatusCode::kOk, grpc::StatusCode::OK},
    {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
    {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
    {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
    {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
    {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
    {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
    {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
    {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
    {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
    {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
    {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
    {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
    {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
    {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
    {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
    {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  for (const auto& [a, g] : kCodes) {
    if (status.code() == a) return grpc::Status(g, std::string(status.message()));
  }
  return grpc::Status(grpc::StatusCode::UNKNOWN, std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  for (const auto& [a, g] : kCodes) {
    if (status.error_code() == g) return absl::Status(a, status.error_message());
  }
  return absl::Status(absl::StatusCode::kUnknown, status.error_message());
}

}  // namespace fusor::wire
