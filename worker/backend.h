// The seam between fusor and a kind of machine. A backend describes and
// calibrates its machine, builds a candidate (emits its kernel and compiles
// it), validates and times what it built, and renders what Compile answers
// for a tuned schedule. As in TVM meta_schedule, building (Build: needs no
// device) is apart from running (Run: on the device), so a worker compiles
// the next candidates while the device measures this one.
//
// The CPU backend lives in worker/cpu (its code generator in
// common/codegen/cpu), the CUDA backend in worker/cuda (common/codegen/cuda).
// The worker's jobs and the scheduler's Compile answers dispatch on
// BackendFor; a new backend implements this interface in its own folders
// and adds itself to BackendFor (worker/backend.cc) and to hw::Backend.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/hw/target.h"
#include "common/ir/chain.h"
#include "common/space/loop_nest.h"
#include "worker/job.h"

namespace fusor::worker {

// What Compile returns for a tuned schedule: everything needed to run the
// kernel without fusor.
struct KernelAnswer {
  std::string language;       // "c++", "cuda"
  std::string source;         // self-contained: no fusor header is needed
  std::string entry_point;    // the function or __global__ kernel to call
  std::string metadata_json;  // arguments, shapes, launch shape, build flags
  std::string binary;         // e.g. a cubin for the target's arch; may be empty
  std::string binary_format;  // "cubin"; empty without a binary
};

// How a worker finds its machine.
struct MachineOptions {
  std::string compiler = "c++";  // CPU: the C++ compiler candidates are built with
  std::string scratch_dir;       // where probes may write
  int device = 0;                // GPU: the device ordinal
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual hw::Backend kind() const = 0;
  virtual const char* name() const = 0;  // "cpu", "cuda"

  // The machine as a target, W and P left 0 (Calibrate measures them);
  // FAILED_PRECONDITION when this backend has no usable machine here.
  virtual absl::StatusOr<hw::TargetDesc> Describe(const MachineOptions& options) const = 0;
  // One line for the log: the machine and what the worker will do.
  virtual std::string Summary(const hw::TargetDesc& target) const = 0;
  // How many jobs a worker compiles ahead of the one being measured, by
  // default.
  virtual int DefaultCompileAhead() const = 0;
  // Whether jobs may compile while another is measured: false where the
  // compiler would take cores from the measurement (a CPU); the jobs
  // compiled ahead then compile together before the next measurement.
  virtual bool CompilesDuringMeasurement() const = 0;

  // In a job's child process (worker/job.h). Calibrate measures W and P;
  // Build emits and compiles the job's kernel (or baseline) into `dir`;
  // Run validates and times what Build left in `dir`.
  virtual JobOutcome Calibrate(const JobSpec& spec, const std::string& dir) const = 0;
  virtual JobOutcome Build(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) const = 0;
  virtual JobOutcome Run(const JobSpec& spec, const ir::Chain& chain, const std::string& dir) const = 0;

  // The Compile answer for `chain` under `nest` (needs no device).
  virtual absl::StatusOr<KernelAnswer> Answer(const ir::Chain& chain, const space::LoopNest& nest,
                                              const std::string& schedule_text, const std::string& mapping,
                                              const hw::TargetDesc& target) const = 0;
  // The Compile answer of a schedule text that is not one fused kernel
  // (space/split.h): the chain unfused through a library, or split in two
  // parts; UNIMPLEMENTED where the answer's form cannot carry them.
  virtual absl::StatusOr<KernelAnswer> AnswerComposite(const ir::Chain& chain, const std::string& schedule_text,
                                                       const hw::TargetDesc& target) const = 0;
};

// The backend of targets of `kind`.
const Backend& BackendFor(hw::Backend kind);

// The backends built in (worker/cpu, worker/cuda).
const Backend& CpuBackend();
const Backend& CudaBackend();

}  // namespace fusor::worker
