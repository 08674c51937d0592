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

// The one codec of a target description. TargetToProto sets the
// fingerprint. Wherever a target is written down as text (the database's
// targets.description_json, the records a team exchanges, a worker's job
// spec) it is this proto's JSON, with every field printed.
hw::TargetDesc TargetFromProto(const v1::Target& target);
v1::Target TargetToProto(const hw::TargetDesc& target);
// INTERNAL when a text field is not UTF-8.
absl::StatusOr<std::string> TargetToJson(const hw::TargetDesc& target);
// DATA_LOSS when `json` is not a target's JSON.
absl::StatusOr<hw::TargetDesc> TargetFromJson(const std::string& json);
std::string BackendName(v1::Backend backend);  // "cpu", "cuda", "unspecified"

// "ok", "compile_error", "invalid_result", "timeout", "crash",
// "runtime_error", "noisy" (the database's text: server/db/states.h).
std::string MeasurementStatusName(v1::MeasurementStatus status);

}  // namespace fusor::wire
