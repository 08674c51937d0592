// The database's job kinds and measurement statuses (server/db/states.h)
// as their fusor.v1 enums, for the scheduler's answers and the workers'
// reports.
#pragma once

#include <optional>

#include "fusor/v1/schedule.pb.h"
#include "fusor/v1/worker.pb.h"
#include "server/db/states.h"

namespace fusor::server {

v1::JobKind ToProto(db::JobKind kind);
v1::MeasurementStatus ToProto(db::MeasurementStatus status);
// None for MEASUREMENT_STATUS_UNSPECIFIED and values this fusor does not know.
std::optional<db::MeasurementStatus> MeasurementStatusFromProto(v1::MeasurementStatus status);

}  // namespace fusor::server
