// The runtime prelude for host code: the same conversions the emitted
// kernels use, so inputs, outputs and kernels agree bit for bit.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "absl/strings/string_view.h"

namespace fusor::codegen::rt {
#include "common/codegen/cpu/prelude.inc"
}  // namespace fusor::codegen::rt

namespace fusor::codegen {
// The text of prelude.inc, for embedding in emitted sources.
absl::string_view CpuPreludeSource();
// The text of simd.inc: vector helpers (exp, erf, f16/bf16 conversions,
// softmax rows) that only emitted kernels include, after the prelude.
absl::string_view CpuSimdSource();
}  // namespace fusor::codegen
