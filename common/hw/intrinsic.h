// The hardware abstraction of AMOS: an intrinsic is a compute abstraction
// (iteration axes with kinds and extents, the operands' index expressions
// over them, dtypes) and a memory abstraction (how each operand tile moves
// between scopes, its layout, stride and alignment constraints).
//
// Every intrinsic here computes C[i, j] += A[i, k] * B[k, j] over one tile
// of its axes: the GEMM-shaped units of GPUs (mma.sync, WMMA, wgmma) and
// CPUs (a SIMD FMA outer product over a register block; the k axis is one
// step per instruction). The registry is one list in intrinsics.cc: adding
// an intrinsic is adding one entry there.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/hw/target.h"

namespace fusor::hw {

enum class AxisKind { kSpatial, kReduction };

struct IntrinsicAxis {
  std::string name;  // "i", "j", "k"
  AxisKind kind = AxisKind::kSpatial;
  int extent = 1;
};

struct IntrinsicOperand {
  std::string name;            // "A", "B", "C"
  std::vector<int> dims;       // the intrinsic axis indexing each dim of the tile
  std::string dtype;           // "f16", "bf16", "tf32", "f32"
  // Memory abstraction: the instruction that moves a tile between scopes.
  std::string op;              // e.g. "ldmatrix.x4", "wmma.load_matrix_sync", "vector load"
  std::string from_scope;      // "global", "shared", "register"
  std::string to_scope;        // "fragment", "register", "shared"
  std::string layout;          // "row" or "col": which tile dim is contiguous in the source
  int alignment_bytes = 0;     // of each row (or column) of the source tile
  int stride_multiple = 1;     // the source's leading dimension, in elements, must be a multiple
};

struct Intrinsic {
  std::string name;
  Backend backend = Backend::kCpu;
  std::vector<std::string> archs;  // CUDA: the archs that have it
  std::string isa_feature;         // CPU: the feature it needs ("" : any CPU)
  std::vector<IntrinsicAxis> axes;           // i, j (spatial), k (reduction)
  std::vector<IntrinsicOperand> inputs;      // A[i, k], B[k, j]
  IntrinsicOperand output;                   // C[i, j], the accumulator
  int lanes = 1;                   // CPU: f32 lanes per vector register
  // Fraction of the target's peak rate P this intrinsic reaches (P is the
  // widest unit's: a CPU calibrates with its widest vectors, a GPU's table
  // gives its dense f16 tensor rate).
  double rate = 1;
  bool codegen = false;            // fusor emits code for it (else: model and mappings only)

  int Extent(int axis) const { return axes[axis].extent; }
};

// Every registered intrinsic, in registration order.
const std::vector<Intrinsic>& AllIntrinsics();
// nullptr if unknown.
const Intrinsic* FindIntrinsic(absl::string_view name);
// The intrinsics a target can run, best first (widest CPU vectors; GPU in
// registration order).
std::vector<const Intrinsic*> IntrinsicsFor(const TargetDesc& target);

// The CPU code generator's view of an intrinsic: an mr x nr register block.
MicroKernel KernelOf(const Intrinsic& intrinsic);

}  // namespace fusor::hw
