// The CPU targets several tests build nests and kernels for.
#pragma once

#include "common/hw/target.h"

namespace fusor::testing {

// Two cores with AVX2 and FMA: 8 f32 lanes, the fma.avx2.6x16 micro-kernel.
inline hw::TargetDesc Avx2Target() {
  hw::TargetDesc t;
  t.compute_units = 2;
  t.vector_lanes_f32 = 8;
  t.isa_features = {"avx2", "fma"};
  return t;
}

// Two cores with AVX-512: 16 f32 lanes, the fma.avx512.8x32 micro-kernel.
inline hw::TargetDesc Avx512Target() {
  hw::TargetDesc t = Avx2Target();
  t.isa_features = {"avx512f"};
  t.vector_lanes_f32 = 16;
  return t;
}

}  // namespace fusor::testing
