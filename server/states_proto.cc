#include "server/states_proto.h"

namespace fusor::server {

v1::JobKind ToProto(db::JobKind kind) {
  switch (kind) {
    case db::JobKind::kCandidate: return v1::JOB_KIND_CANDIDATE;
    case db::JobKind::kBaseline: return v1::JOB_KIND_BASELINE;
    case db::JobKind::kConfirm: return v1::JOB_KIND_CONFIRM;
  }
  return v1::JOB_KIND_UNSPECIFIED;
}

v1::MeasurementStatus ToProto(db::MeasurementStatus status) {
  switch (status) {
    case db::MeasurementStatus::kOk: return v1::MEASUREMENT_STATUS_OK;
    case db::MeasurementStatus::kCompileError: return v1::MEASUREMENT_STATUS_COMPILE_ERROR;
    case db::MeasurementStatus::kInvalidResult: return v1::MEASUREMENT_STATUS_INVALID_RESULT;
    case db::MeasurementStatus::kTimeout: return v1::MEASUREMENT_STATUS_TIMEOUT;
    case db::MeasurementStatus::kCrash: return v1::MEASUREMENT_STATUS_CRASH;
    case db::MeasurementStatus::kRuntimeError: return v1::MEASUREMENT_STATUS_RUNTIME_ERROR;
    case db::MeasurementStatus::kNoisy: return v1::MEASUREMENT_STATUS_NOISY;
  }
  return v1::MEASUREMENT_STATUS_UNSPECIFIED;
}

std::optional<db::MeasurementStatus> MeasurementStatusFromProto(v1::MeasurementStatus status) {
  for (db::MeasurementStatus s : db::kMeasurementStatuses) {
    if (ToProto(s) == status) return s;
  }
  return std::nullopt;
}

}  // namespace fusor::server
