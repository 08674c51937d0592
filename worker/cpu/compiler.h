// Compiles an emitted CPU kernel into a shared object with the system
// compiler, in a child process with a time limit.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/codegen/cpu/cpu_codegen.h"

namespace fusor::worker {

struct CompileOutcome {
  bool ok = false;
  std::string so_path;
  std::string error;    // the compiler's output (tail) or the reason
  double seconds = 0;
  std::string flags;    // the full command line, minus file names
  int64_t code_bytes = 0;  // size of the shared object
  bool cached = false;     // copied from the object cache, not compiled
};

// Writes kernel.cc (and the kernel's extra files) into `workdir` and runs `compiler` on it; the kernel's
// link libraries are searched first in `lib_dir` (when not empty), which is
// also the run-time path. Never fails as a Status: a compile error, a
// missing compiler or a timeout is reported in the outcome.
//
// With `pch_dir`, a kernel that starts with codegen::CpuKernelPreamble()
// (after its title comment) includes a copy of it there instead, compiled
// once as a precompiled header for this compiler and these flags (GCC
// takes it from the .gch beside it; 0.5 s -> 0.24 s for the FFN block's
// kernel). The object code is the same; when the header cannot be built
// the kernel compiles as written.
//
// With `object_dir`, the shared object is kept there, keyed by the command
// line and every file it compiles, and a kernel compiled before is copied
// from it instead (`cached`, 0 seconds): a confirmation compiles its
// candidate and the task's baselines again. At most kObjectCacheBytes, the
// least recently used removed first.
inline constexpr int64_t kObjectCacheBytes = int64_t{256} << 20;
CompileOutcome CompileKernel(const codegen::KernelSource& kernel, const std::string& workdir,
                             const std::string& compiler, double timeout_s, const std::string& lib_dir = "",
                             const std::string& pch_dir = "", const std::string& object_dir = "");

// The first line of `compiler --version`, e.g. "c++ (Debian 12.2.0-14) 12.2.0".
absl::StatusOr<std::string> CompilerVersion(const std::string& compiler, const std::string& workdir);

}  // namespace fusor::worker
