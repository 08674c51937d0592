#include "common/codegen/cuda/cuda_emitter.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace fusor::codegen::cuda {

using emit::GlobalStrides;
using ir::Access;
using ir::Op;
using ir::OpKind;

absl::Status CudaEmitter::Layout() {
  int64_t offset = 0;
  auto take = [&](int64_t bytes) {
    int64_t at = offset;
    offset += RoundUp(std::max<int64_t>(bytes, 0), 16);
    return at;
  };
  local_offset_.assign(chain_.tensors.size(), -1);
  for (size_t t = 0; t < chain_.tensors.size(); ++t) {
    if (nest_.local[t].floats > 0) local_offset_[t] = take(4 * nest_.local[t].floats);
  }
  gemm_.assign(chain_.ops.size(), {});
  temp_offset_.assign(chain_.ops.size(), 0);
  std::vector<int64_t> temp_bytes(chain_.ops.size(), 0);
  for (const space::OpNest& on : nest_.ops) {
    const Op& op = chain_.ops[on.op];
    int64_t bytes = 4 * (on.acc_floats + on.state_floats);
    if (op.kind == OpKind::kSum && on.gemm.ok) {
      RETURN_IF_ERROR(PlanGemm(on, gemm_[on.op]));
      GemmLayout& g = gemm_[on.op];
      auto stage = [&](SideLayout& side, int depth, bool hoisted, bool per_point) {
        // Depth 0 and not hoisted inside the stream loop: the tile changes
        // with the stream dim; depth d > 0: with own loop d - 1.
        if (depth > 0) {
          side.loop_dim = on.loops[depth - 1];
        } else if (on.region == space::Region::kStream) {
          side.loop_dim = nest_.stream_dim;
        }
        side.pipelined = stages_ >= 2 && side.loop_dim >= 0 && side.contiguous >= 0 && !hoisted && !per_point;
        side.stage_elems = RoundUp(side.bytes, 16) / g.elem_bytes;
        side.offset = bytes;
        bytes += RoundUp(side.bytes, 16) * (side.pipelined ? stages_ : 1);
      };
      stage(g.a, on.a_depth, on.a_hoisted, on.a_per_point);
      stage(g.b, on.b_depth, on.b_hoisted, on.b_per_point);
    }
    temp_bytes[on.op] = bytes;
  }
  // Ops inside the stream loop keep their temporaries across iterations
  // (hoisted packs, accumulators); the others take turns in one area.
  for (const space::OpNest& on : nest_.ops) {
    if (on.region == space::Region::kStream) temp_offset_[on.op] = take(temp_bytes[on.op]);
  }
  int64_t shared_area = 0;
  for (const space::OpNest& on : nest_.ops) {
    if (on.region != space::Region::kStream) shared_area = std::max(shared_area, temp_bytes[on.op]);
  }
  const int64_t shared_at = take(shared_area);
  for (const space::OpNest& on : nest_.ops) {
    if (on.region != space::Region::kStream) temp_offset_[on.op] = shared_at;
  }
  shared_bytes_ = std::max<int64_t>(offset, 16);
  return absl::OkStatus();
}

absl::Status CudaEmitter::PlanGemm(const space::OpNest& on, GemmLayout& g) const {
  const hw::Intrinsic& x = *on.mapping.intrinsic;
  const std::string& in = x.inputs[0].dtype;
  if (x.backend != hw::Backend::kCuda || x.name.rfind("mma.sync.", 0) != 0) {
    return absl::UnimplementedError(absl::StrCat("no CUDA code generation for intrinsic ", x.name,
                                                 " (the CUDA backend emits mma.sync)"));
  }
  g.kind = in == "tf32" ? MmaKind::kTF32 : in == "bf16" ? MmaKind::kBF16 : MmaKind::kF16;
  const bool tf32 = g.kind == MmaKind::kTF32;
  g.elem_bytes = tf32 ? 4 : 2;
  g.kstep = x.Extent(2);
  g.k_pad = RoundUp(on.k_tile, g.kstep);
  const int64_t cols_pad = on.cols_pad;
  g.nf = cols_pad % 32 == 0 ? 4 : cols_pad % 16 == 0 ? 2 : 1;
  const int skew = tf32 ? 4 : 8;
  auto plan_side = [&](SideLayout& side, const std::vector<ir::Access>& accesses, const std::vector<int>& own,
                       int64_t own_pad) {
    side.own_pad = own_pad;
    side.k_major = true;
    const Access* single = accesses.size() == 1 && local_offset_[accesses[0].tensor] < 0 ? &accesses[0] : nullptr;
    std::map<int, int64_t> strides;
    int64_t constant = 0;
    if (single != nullptr) strides = GlobalStrides(*single, chain_, &constant);
    auto stride = [&](int d) {
      auto it = strides.find(d);
      return it == strides.end() ? int64_t{0} : it->second;
    };
    if (single != nullptr && !own.empty() && stride(own.back()) == 1 &&
        (on.gemm.kdims.empty() || stride(on.gemm.kdims.back()) != 1)) {
      side.k_major = false;
    }
    side.ld = (side.k_major ? g.k_pad : own_pad) + skew;
    side.bytes = on.batch_tile * (side.k_major ? own_pad : g.k_pad) * side.ld * g.elem_bytes;
    // cp.async: one dim along the staged row with unit stride, its tile
    // origins and every other stride 16-byte aligned. f32 is copied as
    // is: the tf32 unit ignores the low mantissa bits.
    const std::vector<int>& row_dims = side.k_major ? on.gemm.kdims : own;
    if (single == nullptr || row_dims.size() != 1) return;
    const int c = row_dims[0], chunk = 16 / g.elem_bytes;
    if (stride(c) != 1 || constant % chunk != 0) return;
    for (const auto& [d, st] : strides) {
      if (d != c && st % chunk != 0) return;
    }
    if (s_.tile[c] % chunk != 0 && s_.tile[c] != chain_.dims[c].extent) return;
    side.contiguous = c;
  };
  plan_side(g.a, on.gemm.a_side, on.gemm.rows, on.rows_pad);
  plan_side(g.b, on.gemm.b_side, on.gemm.cols, cols_pad);
  return absl::OkStatus();
}

void CudaEmitter::DeclareSharedPointers() {
  for (size_t t = 0; t < chain_.tensors.size(); ++t) {
    if (local_offset_[t] < 0) continue;
    w_.Line(absl::StrCat("float* const ", n_.Local(static_cast<int>(t)), " = (float*)(fusor_smem + ",
                         local_offset_[t], ");"));
  }
  for (const space::OpNest& on : nest_.ops) {
    const std::string o = absl::StrCat(on.op);
    int64_t at = temp_offset_[on.op];
    auto ptr = [&](const std::string& type, const char* name, int64_t offset) {
      w_.Line(absl::StrCat(type, "* const ", name, o, " = (", type, "*)(fusor_smem + ", offset, "); (void)", name,
                           o, ";"));
    };
    if (on.acc_floats > 0) ptr("float", "acc", at);
    at += 4 * on.acc_floats;
    if (on.state_floats > 0) {
      const int64_t rows = on.state_floats / 3;
      ptr("float", "smax", at);
      ptr("float", "ssum", at + 4 * rows);
      ptr("float", "sscale", at + 8 * rows);
    }
    if (chain_.ops[on.op].kind == OpKind::kSum && on.gemm.ok) {
      const GemmLayout& g = gemm_[on.op];
      const std::string type = StageType(on);
      for (const auto& [side, name] : {std::pair{&g.a, "pa"}, std::pair{&g.b, "pb"}}) {
        if (side->pipelined) {  // the op picks its stage inside the stream loop
          w_.Line(absl::StrCat(type, "* const ", name, o, "_stages = (", type, "*)(fusor_smem + ",
                               temp_offset_[on.op] + side->offset, ");"));
        } else {
          ptr(type, name, temp_offset_[on.op] + side->offset);
        }
      }
    }
  }
}

// Schedule "registers" (cuda_softmax.cc): shared memory holds only the
// GEMMs' staged tiles, S's A and B and O's B.
absl::Status CudaEmitter::RegisterLayout() {
  const int last = LastOp();
  local_offset_.assign(chain_.tensors.size(), -1);
  gemm_.assign(chain_.ops.size(), {});
  temp_offset_.assign(chain_.ops.size(), 0);
  RETURN_IF_ERROR(PlanGemm(nest_.ops[0], gemm_[0]));
  RETURN_IF_ERROR(PlanGemm(nest_.ops[last], gemm_[last]));
  int64_t offset = 0;
  auto place = [&](SideLayout& side, int elem_bytes, bool per_step) {
    side.loop_dim = per_step ? nest_.stream_dim : -1;
    side.pipelined = per_step && stages_ >= 2 && side.contiguous >= 0;
    side.stage_elems = RoundUp(side.bytes, 16) / elem_bytes;
    side.offset = offset;
    offset += RoundUp(side.bytes, 16) * (side.pipelined ? stages_ : 1);
  };
  place(gemm_[0].a, gemm_[0].elem_bytes, false);
  place(gemm_[0].b, gemm_[0].elem_bytes, true);
  place(gemm_[last].b, gemm_[last].elem_bytes, true);
  shared_bytes_ = std::max<int64_t>(offset, 16);
  return absl::OkStatus();
}

}  // namespace fusor::codegen::cuda
