#include "proto/wire/grpc_status.h"

#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace fusor::wire {
namespace {

// absl and gRPC share the canonical code numbering; the table makes the
// correspondence explicit (and is what the test checks).
constexpr char kRetryAfterPayload[] = "type.fusor.dev/retry-after-ms";

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
  // A message travels in the trailers, which clients refuse past 16 KiB by
  // default (and then see RESOURCE_EXHAUSTED instead of the real error):
  // one that echoes a long input is cut, on a character's boundary.
  constexpr size_t kMaxMessageBytes = 2048;
  std::string message(status.message());
  if (message.size() > kMaxMessageBytes) {
    size_t cut = kMaxMessageBytes;
    while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xc0) == 0x80) --cut;
    message = absl::StrCat(message.substr(0, cut), "... (", message.size(), " bytes)");
  }
  for (const auto& [a, g] : kCodes) {
    if (status.code() == a) return grpc::Status(g, message);
  }
  return grpc::Status(grpc::StatusCode::UNKNOWN, message);
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  for (const auto& [a, g] : kCodes) {
    if (status.error_code() == g) return absl::Status(a, status.error_message());
  }
  return absl::Status(absl::StatusCode::kUnknown, status.error_message());
}

absl::Status WithRetryAfter(absl::Status status, absl::Duration after) {
  status.SetPayload(kRetryAfterPayload, absl::Cord(std::to_string(absl::ToInt64Milliseconds(after))));
  return status;
}

std::optional<absl::Duration> RetryAfter(const absl::Status& status) {
  auto payload = status.GetPayload(kRetryAfterPayload);
  int64_t ms = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &ms) || ms < 0) return std::nullopt;
  return absl::Milliseconds(ms);
}

grpc::Status ToGrpcStatus(const absl::Status& status, grpc::ServerContextBase* ctx) {
  if (std::optional<absl::Duration> after = RetryAfter(status)) {
    ctx->AddTrailingMetadata(kRetryAfterMetadata, std::to_string(absl::ToInt64Milliseconds(*after)));
  }
  return ToGrpcStatus(status);
}

absl::Status FromGrpcStatus(const grpc::Status& status, const grpc::ClientContext& ctx) {
  absl::Status out = FromGrpcStatus(status);
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find(kRetryAfterMetadata);
  int64_t ms = 0;
  if (it != trailers.end() && absl::SimpleAtoi(std::string(it->second.data(), it->second.size()), &ms) && ms >= 0) {
    out = WithRetryAfter(std::move(out), absl::Milliseconds(ms));
  }
  return out;
}

}  // namespace fusor::wire
