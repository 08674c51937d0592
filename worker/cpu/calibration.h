// Short microbenchmarks that give the cost model its W and P for this CPU.
#pragma once

#include <string>

#include "common/codegen/cpu/cpu_codegen.h"
#include "common/hw/target.h"

namespace fusor::worker {

// A kernel source exporting
//   double fusor_peak_flops(int threads, double seconds);   // FMA FLOP/s
//   double fusor_bandwidth(int threads, double seconds);    // triad bytes/s
// compiled with the same flags as the candidates, so P reflects the vector
// ISA they use.
codegen::KernelSource CalibrationKernel(const hw::TargetDesc& target);

}  // namespace fusor::worker
