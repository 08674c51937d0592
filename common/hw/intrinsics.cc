// The intrinsic registry: one entry per intrinsic.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/hw/intrinsic.h"

namespace fusor::hw {
namespace {

constexpr int kI = 0, kJ = 1, kK = 2;

std::vector<IntrinsicAxis> Axes(int m, int n, int k) {
  return {{"i", AxisKind::kSpatial, m}, {"j", AxisKind::kSpatial, n}, {"k", AxisKind::kReduction, k}};
}

// A CPU SIMD FMA outer product: C (mr x nr, in registers) += one column of
// packed A (broadcast) times one row of packed B (vector loads), per k step.
Intrinsic CpuFma(const std::string& name, const std::string& isa, int lanes, int mr, int nr, double rate) {
  Intrinsic x;
  x.name = name;
  x.backend = Backend::kCpu;
  x.isa_feature = isa;
  x.axes = Axes(mr, nr, 1);
  x.inputs = {{"A", {kI, kK}, "f32", "broadcast", "register", "register", "col", 4, 1},
              {"B", {kK, kJ}, "f32", "vector load", "register", "register", "row", 4, lanes}};
  x.output = {"C", {kI, kJ}, "f32", "vector load/store", "register", "register", "row", 4, lanes};
  x.lanes = lanes;
  x.rate = rate;
  x.codegen = true;
  return x;
}

// mma.sync.aligned.mMnNkK.row.col: A row-major and B column-major
// fragments loaded from shared memory by ldmatrix (16-byte rows).
Intrinsic MmaSync(int m, int n, int k, const std::string& in, double rate) {
  Intrinsic x;
  x.name = absl::StrCat("mma.sync.m", m, "n", n, "k", k, ".", in);
  x.backend = Backend::kCuda;
  x.archs = {"sm_80", "sm_86", "sm_89", "sm_90"};
  x.axes = Axes(m, n, k);
  const bool tf32 = in == "tf32";
  x.inputs = {{"A", {kI, kK}, in, tf32 ? "ld.shared.b32" : "ldmatrix.x4", "shared", "fragment", "row", 16, 8},
              {"B", {kK, kJ}, in, tf32 ? "ld.shared.b32" : "ldmatrix.x2", "shared", "fragment", "col", 16, 8}};
  x.output = {"C", {kI, kJ}, "f32", "st.global.v2.f32", "fragment", "global", "row", 8, 2};
  x.rate = rate;
  x.codegen = true;
  return x;
}

// WMMA (sm_70+): fragments loaded with load_matrix_sync, ldm a multiple of 8.
Intrinsic Wmma(int m, int n, int k) {
  Intrinsic x;
  x.name = absl::StrCat("wmma.m", m, "n", n, "k", k, ".f16");
  x.backend = Backend::kCuda;
  x.archs = {"sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90"};
  x.axes = Axes(m, n, k);
  x.inputs = {{"A", {kI, kK}, "f16", "wmma.load_matrix_sync", "shared", "fragment", "row", 32, 8},
              {"B", {kK, kJ}, "f16", "wmma.load_matrix_sync", "shared", "fragment", "row", 32, 8}};
  x.output = {"C", {kI, kJ}, "f32", "wmma.store_matrix_sync", "fragment", "shared", "row", 32, 4};
  x.rate = 0.6;
  return x;
}

// sm_90 warpgroup MMA: wgmma.mma_async.m64nNk16, A and B described by
// shared-memory matrix descriptors (swizzled, 128-byte aligned).
Intrinsic Wgmma(int n, const std::string& in) {
  Intrinsic x;
  x.name = absl::StrCat("wgmma.m64n", n, "k16.", in);
  x.backend = Backend::kCuda;
  x.archs = {"sm_90"};
  x.axes = Axes(64, n, 16);
  x.inputs = {{"A", {kI, kK}, in, "smem descriptor", "shared", "tensor core", "row", 128, 8},
              {"B", {kK, kJ}, in, "smem descriptor", "shared", "tensor core", "col", 128, 8}};
  x.output = {"C", {kI, kJ}, "f32", "st.global.v2.f32", "register", "global", "row", 8, 2};
  x.rate = 1.0;
  return x;
}

std::vector<Intrinsic> Build() {
  std::vector<Intrinsic> all = {
      CpuFma("fma.avx512.8x32", "avx512f", 16, 8, 32, 1.0),
      CpuFma("fma.avx2.6x16", "avx2", 8, 6, 16, 1.0),
      CpuFma("simd4.4x8", "", 4, 4, 8, 1.0),
      CpuFma("scalar.4x4", "", 1, 4, 4, 1.0),
      MmaSync(16, 8, 16, "f16", 0.65),
      MmaSync(16, 8, 16, "bf16", 0.65),
      MmaSync(16, 8, 8, "tf32", 0.32),
      Wmma(16, 16, 16),
      Wmma(32, 8, 16),
      Wmma(8, 32, 16),
  };
  for (int n : {64, 128, 256}) {
    all.push_back(Wgmma(n, "f16"));
    all.push_back(Wgmma(n, "bf16"));
  }
  return all;
}

}  // namespace

const std::vector<Intrinsic>& AllIntrinsics() {
  static const auto* all = new std::vector<Intrinsic>(Build());
  return *all;
}

const Intrinsic* FindIntrinsic(absl::string_view name) {
  for (const Intrinsic& x : AllIntrinsics()) {
    if (x.name == name) return &x;
  }
  return nullptr;
}

std::vector<const Intrinsic*> IntrinsicsFor(const TargetDesc& target) {
  std::vector<const Intrinsic*> out;
  for (const Intrinsic& x : AllIntrinsics()) {
    if (x.backend != target.backend) continue;
    if (x.backend == Backend::kCuda) {
      if (std::find(x.archs.begin(), x.archs.end(), target.arch) == x.archs.end()) continue;
    } else {
      if (!x.isa_feature.empty() && !target.HasFeature(x.isa_feature)) continue;
      if (x.isa_feature == "avx2" && !target.HasFeature("fma")) continue;
      if (x.lanes > 1 && x.lanes > std::max(target.vector_lanes_f32, 1)) continue;
    }
    out.push_back(&x);
  }
  // On a CPU the widest vectors come first; the rate of a narrower unit is
  // its share of the calibrated (widest) peak.
  std::stable_sort(out.begin(), out.end(), [](const Intrinsic* a, const Intrinsic* b) { return a->lanes > b->lanes; });
  return out;
}

MicroKernel KernelOf(const Intrinsic& x) { return {x.name, x.lanes, x.Extent(0), x.Extent(1)}; }

}  // namespace fusor::hw
