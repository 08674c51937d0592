// The scheduler core's own types (database rows and states, targets and
// selectors, results, progress, tasks, workers, leased jobs, reports,
// sweeps) as fusor.v1 messages and back: the conversions of the service
// edge, the only place where the core's values meet protos.
#pragma once

#include <optional>

#include "fusor/v1/schedule.pb.h"
#include "fusor/v1/scheduler.pb.h"
#include "fusor/v1/worker.pb.h"
#include "server/db/states.h"
#include "server/db/tuning_db.h"
#include "server/scheduler.h"
#include "server/sweeps.h"

namespace fusor::server {

v1::JobKind ToProto(db::JobKind kind);
v1::MeasurementStatus ToProto(db::MeasurementStatus status);
// None for MEASUREMENT_STATUS_UNSPECIFIED and values this fusor does not know.
std::optional<db::MeasurementStatus> MeasurementStatusFromProto(v1::MeasurementStatus status);

// A registered target under the fingerprint it is stored by (not one
// computed again: records imported from an older fusor keep theirs).
v1::Target TargetProto(const hw::TargetDesc& target, const std::string& fingerprint);

// The candidate as a worker and a result see it (no intrinsic: set by the
// caller where it is known).
v1::Candidate CandidateProto(const db::CandidateRow& candidate);
v1::Measurement MeasurementProto(const db::MeasurementRow& measurement);
// What a worker measured: status, error, samples, median, errors and the
// compile record. INVALID_ARGUMENT without a status.
absl::StatusOr<db::MeasurementRow> MeasurementFromProto(const v1::Measurement& measurement);

// INVALID_ARGUMENT for a backend this fusor does not know.
absl::StatusOr<TargetSelector> TargetSelectorFromProto(const v1::TargetSelector& selector);
TuneOptions TuneOptionsFromProto(const v1::TuneOptions& options);
v1::TaskStarted TaskStartedProto(const TaskStarted& started);
v1::TuneProgress TuneProgressProto(const TuneProgress& progress);
v1::TuneResult TuneResultProto(const TuneResult& result);
v1::Explanation ExplanationProto(const Explanation& why);
v1::CompileResponse CompileResponseProto(const CompileResult& compiled);
// A task as GetTask answers it: its snapshot (any version) and its row.
v1::TaskInfo TaskInfoProto(const TaskSnapshot& snapshot, const db::TaskRow& row);
// A registered worker; its target when that is readable.
v1::WorkerInfo WorkerInfoProto(const db::WorkerRow& worker, const absl::StatusOr<hw::TargetDesc>& target);

// Each entry's chain is read here; a bad one is reported by SweepRunner::Start
// naming its entry.
absl::StatusOr<SweepRequest> SweepRequestFromProto(const v1::SweepRequest& request);
v1::SweepStarted SweepStartedProto(const SweepStarted& started);
v1::SweepProgress SweepProgressProto(const SweepProgress& progress);
v1::SweepReport SweepReportProto(const SweepReport& report);

v1::MeasureOptions MeasureOptionsProto(const MeasureOptions& options);
v1::Job JobProto(const LeasedJob& leased, const MeasureOptions& measure);
absl::StatusOr<JobReport> JobReportFromProto(const v1::ReportRequest& request);

}  // namespace fusor::server
