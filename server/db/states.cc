#include "server/db/states.h"

#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/util/enum_names.h"

namespace fusor::db {
namespace {

// The database's text of each value.
constexpr EnumName<TaskState> kTaskStateNames[] = {
    {TaskState::kRunning, "running"}, {TaskState::kDone, "done"}, {TaskState::kFailed, "failed"}};
constexpr EnumName<JobState> kJobStateNames[] = {
    {JobState::kQueued, "queued"}, {JobState::kLeased, "leased"}, {JobState::kDone, "done"},
    {JobState::kFailed, "failed"}};
constexpr EnumName<WorkerState> kWorkerStateNames[] = {{WorkerState::kAlive, "alive"}, {WorkerState::kLost, "lost"}};
constexpr EnumName<SweepState> kSweepStateNames[] = {{SweepState::kRunning, "running"}, {SweepState::kDone, "done"}};
constexpr EnumName<SweepChainState> kSweepChainStateNames[] = {
    {SweepChainState::kPending, "pending"}, {SweepChainState::kTuning, "tuning"},
    {SweepChainState::kDone, "done"}, {SweepChainState::kFailed, "failed"}};
constexpr EnumName<JobKind> kJobKindNames[] = {
    {JobKind::kCandidate, "candidate"}, {JobKind::kBaseline, "baseline"}, {JobKind::kConfirm, "confirm"}};
constexpr EnumName<MeasurementStatus> kMeasurementStatusNames[] = {
    {MeasurementStatus::kOk, "ok"}, {MeasurementStatus::kCompileError, "compile_error"},
    {MeasurementStatus::kInvalidResult, "invalid_result"}, {MeasurementStatus::kTimeout, "timeout"},
    {MeasurementStatus::kCrash, "crash"}, {MeasurementStatus::kRuntimeError, "runtime_error"},
    {MeasurementStatus::kNoisy, "noisy"}};

// Each k...s array and each name table has as many entries as its enum has
// values, and every value of the array has a name.
template <typename T, size_t N, size_t M>
constexpr bool Complete(const T (&all)[N], const EnumName<T> (&names)[M], T last) {
  if (N != static_cast<size_t>(last) + 1 || M != N) return false;
  for (T value : all) {
    bool named = false;
    for (const auto& [v, name] : names) named = named || v == value;
    if (!named) return false;
  }
  return true;
}
static_assert(Complete(kTaskStates, kTaskStateNames, TaskState::kFailed));
static_assert(Complete(kJobStates, kJobStateNames, JobState::kFailed));
static_assert(Complete(kWorkerStates, kWorkerStateNames, WorkerState::kLost));
static_assert(Complete(kSweepStates, kSweepStateNames, SweepState::kDone));
static_assert(Complete(kSweepChainStates, kSweepChainStateNames, SweepChainState::kFailed));
static_assert(Complete(kJobKinds, kJobKindNames, JobKind::kConfirm));
static_assert(Complete(kMeasurementStatuses, kMeasurementStatusNames, MeasurementStatus::kNoisy));


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

absl::string_view Name(TaskState state) { return NameIn(state, kTaskStateNames); }
absl::string_view Name(JobState state) { return NameIn(state, kJobStateNames); }
absl::string_view Name(WorkerState state) { return NameIn(state, kWorkerStateNames); }
absl::string_view Name(SweepState state) { return NameIn(state, kSweepStateNames); }
absl::string_view Name(SweepChainState state) { return NameIn(state, kSweepChainStateNames); }
absl::string_view Name(JobKind kind) { return NameIn(kind, kJobKindNames); }
absl::string_view Name(MeasurementStatus status) { return NameIn(status, kMeasurementStatusNames); }

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
