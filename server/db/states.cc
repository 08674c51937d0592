#include "server/db/states.h"

#include <iterator>

#include "absl/strings/str_cat.h"

namespace fusor::db {
namespace {

// Each k...s array has as many values as its enum.
static_assert(std::size(kTaskStates) == static_cast<size_t>(TaskState::kFailed) + 1);
static_assert(std::size(kJobStates) == static_cast<size_t>(JobState::kFailed) + 1);
static_assert(std::size(kWorkerStates) == static_cast<size_t>(WorkerState::kLost) + 1);
static_assert(std::size(kSweepStates) == static_cast<size_t>(SweepState::kDone) + 1);
static_assert(std::size(kSweepChainStates) == static_cast<size_t>(SweepChainState::kFailed) + 1);
static_assert(std::size(kJobKinds) == static_cast<size_t>(JobKind::kConfirm) + 1);
static_assert(std::size(kMeasurementStatuses) == static_cast<size_t>(MeasurementStatus::kNoisy) + 1);

// The value of `all` named `text`; else DATA_LOSS naming `what` (what the
// text is, and where it is stored), the text and the names known.
template <typename T, size_t N>
absl::StatusOr<T> ParseOf(absl::string_view text, const T (&all)[N], absl::string_view what) {
  std::string known;
  for (T value : all) {
    if (Name(value) == text) return value;
    absl::StrAppend(&known, known.empty() ? "" : ", ", Name(value));
  }
  return absl::DataLossError(absl::StrCat("unknown ", what, " '", text, "' (this fusor knows ", known, ")"));
}

}  // namespace

absl::string_view Name(TaskState state) {
  switch (state) {
    case TaskState::kRunning: return "running";
    case TaskState::kDone: return "done";
    case TaskState::kFailed: return "failed";
  }
  return "";
}

absl::string_view Name(JobState state) {
  switch (state) {
    case JobState::kQueued: return "queued";
    case JobState::kLeased: return "leased";
    case JobState::kDone: return "done";
    case JobState::kFailed: return "failed";
  }
  return "";
}

absl::string_view Name(WorkerState state) {
  switch (state) {
    case WorkerState::kAlive: return "alive";
    case WorkerState::kLost: return "lost";
  }
  return "";
}

absl::string_view Name(SweepState state) {
  switch (state) {
    case SweepState::kRunning: return "running";
    case SweepState::kDone: return "done";
  }
  return "";
}

absl::string_view Name(SweepChainState state) {
  switch (state) {
    case SweepChainState::kPending: return "pending";
    case SweepChainState::kTuning: return "tuning";
    case SweepChainState::kDone: return "done";
    case SweepChainState::kFailed: return "failed";
  }
  return "";
}

absl::string_view Name(JobKind kind) {
  switch (kind) {
    case JobKind::kCandidate: return "candidate";
    case JobKind::kBaseline: return "baseline";
    case JobKind::kConfirm: return "confirm";
  }
  return "";
}

absl::string_view Name(MeasurementStatus status) {
  switch (status) {
    case MeasurementStatus::kOk: return "ok";
    case MeasurementStatus::kCompileError: return "compile_error";
    case MeasurementStatus::kInvalidResult: return "invalid_result";
    case MeasurementStatus::kTimeout: return "timeout";
    case MeasurementStatus::kCrash: return "crash";
    case MeasurementStatus::kRuntimeError: return "runtime_error";
    case MeasurementStatus::kNoisy: return "noisy";
  }
  return "";
}

template <>
absl::StatusOr<TaskState> Parse<TaskState>(absl::string_view text) {
  return ParseOf(text, kTaskStates, "task state (tasks.state)");
}

template <>
absl::StatusOr<JobState> Parse<JobState>(absl::string_view text) {
  return ParseOf(text, kJobStates, "job state (jobs.state)");
}

template <>
absl::StatusOr<WorkerState> Parse<WorkerState>(absl::string_view text) {
  return ParseOf(text, kWorkerStates, "worker state (workers.state)");
}

template <>
absl::StatusOr<SweepState> Parse<SweepState>(absl::string_view text) {
  return ParseOf(text, kSweepStates, "sweep state (sweeps.state)");
}

template <>
absl::StatusOr<SweepChainState> Parse<SweepChainState>(absl::string_view text) {
  return ParseOf(text, kSweepChainStates, "sweep chain state (sweep_chains.state)");
}

template <>
absl::StatusOr<JobKind> Parse<JobKind>(absl::string_view text) {
  return ParseOf(text, kJobKinds, "job kind (jobs.kind, measurements.kind)");
}

template <>
absl::StatusOr<MeasurementStatus> Parse<MeasurementStatus>(absl::string_view text) {
  return ParseOf(text, kMeasurementStatuses, "measurement status (measurements.status)");
}

}  // namespace fusor::db
