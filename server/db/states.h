// The states and kinds the tuning database stores as text: of tasks, jobs,
// workers, sweeps and their chains, job kinds and measurement statuses.
//
// Name gives a value's text in the database; Parse reads it back, and
// refuses text it does not know (DATA_LOSS naming the column and the text).
// The texts are the database's: changing one is a schema migration, and a
// new value is one too (older fusor refuses text it does not know, so the
// migration's compatible_version must leave it out). Each k...s array lists
// every value of its enum, in declaration order.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusor::db {

// The value whose Name is `text`.
template <typename T>
absl::StatusOr<T> Parse(absl::string_view text);

// tasks.state: "running", "done", "failed".
enum class TaskState { kRunning, kDone, kFailed };
inline constexpr TaskState kTaskStates[] = {TaskState::kRunning, TaskState::kDone, TaskState::kFailed};
absl::string_view Name(TaskState state);
template <>
absl::StatusOr<TaskState> Parse<TaskState>(absl::string_view text);

// jobs.state: "queued", "leased", "done", "failed".
enum class JobState { kQueued, kLeased, kDone, kFailed };
inline constexpr JobState kJobStates[] = {JobState::kQueued, JobState::kLeased, JobState::kDone, JobState::kFailed};
absl::string_view Name(JobState state);
template <>
absl::StatusOr<JobState> Parse<JobState>(absl::string_view text);

// workers.state: "alive", "lost".
enum class WorkerState { kAlive, kLost };
inline constexpr WorkerState kWorkerStates[] = {WorkerState::kAlive, WorkerState::kLost};
absl::string_view Name(WorkerState state);
template <>
absl::StatusOr<WorkerState> Parse<WorkerState>(absl::string_view text);

// sweeps.state: "running", "done".
enum class SweepState { kRunning, kDone };
inline constexpr SweepState kSweepStates[] = {SweepState::kRunning, SweepState::kDone};
absl::string_view Name(SweepState state);
template <>
absl::StatusOr<SweepState> Parse<SweepState>(absl::string_view text);

// sweep_chains.state, where a sweep stands with one of its distinct chains:
// "pending", "tuning", "done", "failed".
enum class SweepChainState { kPending, kTuning, kDone, kFailed };
inline constexpr SweepChainState kSweepChainStates[] = {SweepChainState::kPending, SweepChainState::kTuning,
                                                        SweepChainState::kDone, SweepChainState::kFailed};
absl::string_view Name(SweepChainState state);
template <>
absl::StatusOr<SweepChainState> Parse<SweepChainState>(absl::string_view text);

// jobs.kind and measurements.kind (a measurement has its job's kind), what
// a job measures: a candidate; the unfused chain; the task's best candidate
// again at its end. "candidate", "baseline", "confirm".
enum class JobKind { kCandidate, kBaseline, kConfirm };
inline constexpr JobKind kJobKinds[] = {JobKind::kCandidate, JobKind::kBaseline, JobKind::kConfirm};
absl::string_view Name(JobKind kind);
template <>
absl::StatusOr<JobKind> Parse<JobKind>(absl::string_view text);

// measurements.status: fusor.v1.MeasurementStatus but UNSPECIFIED (see
// server/wire_rows.h), its name without the prefix in lower case: "ok",
// "compile_error", "invalid_result", "timeout", "crash", "runtime_error",
// "noisy" (validated and timed, but the samples spread too far to trust).
enum class MeasurementStatus { kOk, kCompileError, kInvalidResult, kTimeout, kCrash, kRuntimeError, kNoisy };
inline constexpr MeasurementStatus kMeasurementStatuses[] = {
    MeasurementStatus::kOk,      MeasurementStatus::kCompileError, MeasurementStatus::kInvalidResult,
    MeasurementStatus::kTimeout, MeasurementStatus::kCrash,        MeasurementStatus::kRuntimeError,
    MeasurementStatus::kNoisy};
absl::string_view Name(MeasurementStatus status);
template <>
absl::StatusOr<MeasurementStatus> Parse<MeasurementStatus>(absl::string_view text);

}  // namespace fusor::db
