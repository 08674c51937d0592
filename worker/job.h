// A unit of work for a worker (measure a candidate, measure the unfused
// baseline, or calibrate), and the isolated child process that does it.
//
// The parent writes the JobSpec as JSON into a fresh directory and starts
// its own executable with `__run-job <dir>`; the child compiles, validates
// and measures, and writes outcome.json. Whatever the child does — crash,
// hang, exhaust memory — the parent gets a JobOutcome.
//
// A candidate or baseline job may also run in two children: one compiles
// into an artifact directory (kCompile), a later one measures what it
// finds there (kMeasure), so that the worker compiles the next candidates
// while the device measures this one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/hw/target.h"
#include "common/util/timing.h"
#include "worker/validate.h"

namespace fusor::worker {

// kConfirm: a candidate measured again, timed together with the unfused
// baseline (on CPUs; a GPU measures it as a candidate).
enum class JobKind { kCandidate, kBaseline, kCalibrate, kConfirm };
// kAll: compile and measure in one child.
enum class JobPhase { kAll, kCompile, kMeasure };

// Mirrors fusor.v1.MeasurementStatus. kNoisy: validated and timed, but the
// samples spread too far to trust (common/util/timing.h).
enum class OutcomeStatus { kOk, kCompileError, kInvalidResult, kTimeout, kCrash, kRuntimeError, kNoisy };
const char* OutcomeStatusName(OutcomeStatus s);

struct JobSpec {
  JobKind kind = JobKind::kCandidate;
  JobPhase phase = JobPhase::kAll;
  std::string artifact_dir;   // kCompile writes the compiled code here, kMeasure reads it
  std::string chain_json;     // the chain, as ir::ChainToJson writes it
  std::string schedule_text;  // kCandidate
  std::string mapping;        // kCandidate, for the kernel's header comment
  hw::TargetDesc target;
  TimingOptions timing;
  std::string compiler = "c++";
  std::string blas_dir;  // where the baseline's libopenblas is; empty: the linker's default
  double compile_timeout_s = 120;
  double run_timeout_s = 120;  // validation + timing, after compiling
  uint64_t seed = 1;          // of the validation inputs (TaskInputSeed: one of the task's sets)
  // What the worker keeps across jobs (empty: nothing): references/ (CachedReference),
  // preamble/ (CompileKernel's precompiled preamble) and objects/ (its compiled kernels).
  std::string cache_dir;
  int device = 0;  // CUDA targets: the GPU's ordinal
};

struct JobOutcome {
  OutcomeStatus status = OutcomeStatus::kRuntimeError;
  std::string error;
  std::vector<double> samples_s;
  double median_s = 0;
  double spread = 0;  // (p90 - p10) / median
  double max_abs_error = 0;
  double max_rel_error = 0;
  double compile_s = 0;
  std::string compile_flags;
  int64_t code_bytes = 0;
  // GPU kernels: ptxas's report and the launch shape, as JSON. CPU
  // baselines: the BLAS kept and each one's median. CPU confirmations: the
  // baseline timed beside the candidate ({"beside": {"baseline", "status",
  // "median_s", "spread", "samples_s"}}).
  std::string resources_json;
  // kCalibrate
  double bandwidth_bytes_per_s = 0;
  double peak_flops = 0;
};

// An outcome that says only what went wrong.
JobOutcome FailedOutcome(OutcomeStatus status, std::string error);

// Records a validation's errors in `out`; false when the kernel could not
// be checked (runtime error) or computed a wrong result (invalid result),
// with the status and error set.
bool RecordValidation(const absl::StatusOr<Validation>& valid, JobOutcome& out);

// Records a trusted timing's samples, median and spread in `out`: status
// ok, or noisy (with the reason in `error`).
void RecordTiming(const TrustedTiming& timing, JobOutcome& out);

// Copies what compiling recorded (time, flags, size, resources) from a
// kCompile outcome into the kMeasure outcome of the same job.
void MergeCompileRecord(const JobOutcome& compiled, JobOutcome& measured);

absl::StatusOr<std::string> JobSpecToJson(const JobSpec& spec);
absl::StatusOr<JobSpec> JobSpecFromJson(const std::string& json);
std::string JobOutcomeToJson(const JobOutcome& outcome);
absl::StatusOr<JobOutcome> JobOutcomeFromJson(const std::string& json);

// In the child: does the job in `dir` (reads dir/job.json, writes
// dir/outcome.json). Returns the process exit code.
int RunJobMain(const std::string& dir);

// In the parent: runs `spec` in a child started as `self_exe __run-job DIR`
// inside a fresh directory under `scratch_dir`, killing it after the
// phase's timeout (compile, run, or both for kAll).
JobOutcome RunJobIsolated(const JobSpec& spec, const std::string& self_exe, const std::string& scratch_dir);

}  // namespace fusor::worker
