#include "proto/wire/grpc_status.h"

#include <gtest/gtest.h>


namespace fusor::wire {
namespace {

struct Row {
  absl::StatusCode absl_code;
  grpc::StatusCode grpc_code;
};

class StatusConversionTest : public ::testing::TestWithParam<Row> {};

TEST_P(StatusConversionTest, MapsBothWaysKeepingTheMessage) {
  const Row& row = GetParam();
  grpc::Status g = ToGrpcStatus(absl::Status(row.absl_code, row.absl_code == absl::StatusCode::kOk ? "" : "why"));
  EXPECT_EQ(g.error_code(), row.grpc_code);
  absl::Status back = FromGrpcStatus(g);
  EXPECT_EQ(back.code(), row.absl_code);
  if (row.absl_code != absl::StatusCode::kOk) {
    EXPECT_EQ(back.message(), "why");
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllCodes, StatusConversionTest,
    ::testing::Values(Row{absl::StatusCode::kOk, grpc::StatusCode::OK},
                      Row{absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
                      Row{absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
                      Row{absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
                      Row{absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
                      Row{absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
                      Row{absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
                      Row{absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
                      Row{absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
                      Row{absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
                      Row{absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
                      Row{absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
                      Row{absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
                      Row{absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
                      Row{absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
                      Row{absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
                      Row{absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED}));

TEST(RetryAfterTest, TheHintRidesOnTheStatus) {
  absl::Status busy = WithRetryAfter(absl::ResourceExhaustedError("over quota"), absl::Milliseconds(1500));
  ASSERT_TRUE(RetryAfter(busy).has_value());
  EXPECT_EQ(*RetryAfter(busy), absl::Milliseconds(1500));
  EXPECT_EQ(busy.message(), "over quota");
  EXPECT_FALSE(RetryAfter(absl::ResourceExhaustedError("message too large")).has_value());
  EXPECT_FALSE(RetryAfter(FromGrpcStatus(ToGrpcStatus(busy))).has_value());  // the wire needs the metadata
}

}  // namespace
}  // namespace fusor::wire
