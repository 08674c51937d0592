// Conversions between the wire contract (fusor.v1 messages) and fusor_core
// types. The one place where proto messages meet the IR.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/hw/target.h"
#include "common/ir/chain.h"
#include "common/ir/spec.h"
#include "fusor/v1/schedule.pb.h"
#include "fusor/v1/target.pb.h"
#include "fusor/v1/workload.pb.h"

namespace fusor::wire {

// Parses either source of a Workload. INVALID_ARGUMENT with the line and
// column (text) or the field (structured chain) of the first problem.
absl::StatusOr<ir::Chain> ChainFromWorkload(const v1::Workload& workload,
                                            const ir::Limits& limits = ir::Limits());
v1::Chain ChainToProto(const ir::Chain& chain);

hw::TargetDesc TargetFromProto(const v1::Target& target);
v1::Target TargetToProto(const hw::TargetDesc& target);
std::string BackendName(v1::Backend backend);  // "cpu", "cuda", "unspecified"

// "ok", "compile_error", "invalid_result", "timeout", "crash", "runtime_error".
std::string MeasurementStatusName(v1::MeasurementStatus status);
v1::MeasurementStatus MeasurementStatusFromName(const std::string& name);

}  // namespace fusor::wire
