#include "common/space/loop_nest.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/space/loop_nest_phases.h"
#include "common/util/status_macros.h"

namespace fusor::space::phases {

bool AccessDependsOn(const ir::Access& a, int dim) {
  for (const ir::AffineExpr& e : a.index) {
    if (e.DependsOn(dim)) return true;
  }
  return false;
}

// Whether every read of a result of `chain` along `dim` is the plain dim at
// the producer's axis of `dim` (and no other axis depends on it).
bool ReadsAlong(const ir::Chain& chain, const ir::Access& a, int dim) {
  const ir::Tensor& t = chain.tensors[a.tensor];
  if (t.role == ir::TensorRole::kInput) return true;
  const std::vector<int>& producer_index = chain.ops[t.producer].index;
  for (size_t axis = 0; axis < a.index.size(); ++axis) {
    bool is_dim_axis = producer_index[axis] == dim;
    if (is_dim_axis && !(a.index[axis] == ir::AffineExpr::OfDim(dim))) return false;
    if (!is_dim_axis && a.index[axis].DependsOn(dim)) return false;
  }
  return true;
}

absl::Status Illegal(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("schedule: ", message));
}

// Appends a statement of `op` (a load or store of `tensor`, or with -1 its
// compute), run once per iteration of `loops`.
void AddStatement(const ir::Chain& chain, LoopNest& nest, StmtKind kind, int op, int tensor, double bytes,
                  double flops, std::vector<int> loops) {
  Statement st;
  st.kind = kind;
  st.op = op;
  st.tensor = tensor;
  const char* prefix = kind == StmtKind::kLoad ? "L(" : kind == StmtKind::kCompute ? "C(" : "S(";
  st.label = absl::StrCat(prefix, chain.tensors[tensor >= 0 ? tensor : chain.ops[op].output].name, ")");
  st.bytes = bytes;
  st.flops = flops;
  st.executions = 1;
  for (int d : loops) st.executions *= static_cast<double>(nest.trips[d]);
  st.loops = std::move(loops);
  nest.statements.push_back(std::move(st));
}

}  // namespace fusor::space::phases

namespace fusor::space {

using phases::Contains;
using phases::ReadsAlong;

std::vector<int> BlockEligibleDims(const ir::Chain& chain) {
  std::vector<int> result;
  for (int d = 0; d < static_cast<int>(chain.dims.size()); ++d) {
    bool ok = true;
    for (int t : chain.outputs) ok = ok && Contains(chain.ops[chain.tensors[t].producer].index, d);
    for (const ir::Op& op : chain.ops) {
      if (Contains(op.reduce, d) || op.axis == d) ok = false;
      ir::ForEachAccess(op.body, [&](const ir::Access& a) { ok = ok && ReadsAlong(chain, a, d); });
    }
    if (ok) result.push_back(d);
  }
  return result;
}

GemmForm FormOf(const ir::Chain& chain, const mapping::SoftwareOp& sw, const mapping::Mapping& m) {
  const ir::Op& op = chain.ops[sw.op];
  GemmForm g;
  g.ok = true;
  g.scale = sw.scale;
  g.a_side = m.swapped ? sw.b_side : sw.a_side;
  g.b_side = m.swapped ? sw.a_side : sw.b_side;
  for (int d : op.index) {
    if (Contains(m.axes[0], d)) {
      g.rows.push_back(d);
    } else if (Contains(m.axes[1], d)) {
      g.cols.push_back(d);
    } else {
      g.batch.push_back(d);
    }
  }
  for (int d : op.reduce) (Contains(m.axes[2], d) ? g.kdims : g.outer_reduce).push_back(d);
  return g;
}

std::optional<Schedule> RegisterResidentVariant(const ir::Chain& chain, const Schedule& schedule,
                                                const hw::TargetDesc& target) {
  Schedule s = schedule;
  s.registers = true;
  s.own.assign(chain.ops.size(), {});
  s.warps = 16;
  auto nest = BuildLoopNest(chain, s, target);
  if (!nest.ok()) return std::nullopt;
  // Two row fragments (32 rows) per warp where the row tile and the
  // registers allow, else one.
  const int64_t rows = nest->ops[0].rows_pad;
  for (int64_t per_warp : {32, 16}) {
    if (rows % per_warp != 0) continue;  // 32 a warp needs whole pairs of fragments
    int warps = 1;
    while (warps < 16 && per_warp * warps < rows) warps *= 2;
    s.warps = warps;
    if (BuildLoopNest(chain, s, target).ok()) return Canonical(s, chain);
  }
  return std::nullopt;
}

std::vector<const hw::Intrinsic*> UsableIntrinsics(const ir::Chain& chain, const hw::TargetDesc& target) {
  std::vector<const hw::Intrinsic*> out = hw::IntrinsicsFor(target);
  if (target.backend != hw::Backend::kCuda) return out;
  const std::string dtype = chain.dtype == ir::DType::kF32 ? "tf32" : std::string(ir::DTypeName(chain.dtype));
  std::erase_if(out, [&](const hw::Intrinsic* x) { return x->inputs[0].dtype != dtype || !x->codegen; });
  std::stable_sort(out.begin(), out.end(), [](const hw::Intrinsic* a, const hw::Intrinsic* b) { return a->rate > b->rate; });
  return out;
}

std::optional<mapping::Mapping> DefaultMappingFor(const ir::Chain& chain, int op, const hw::TargetDesc& target) {
  auto sw = mapping::ViewOp(chain, op);
  if (!sw.ok()) return std::nullopt;
  for (const hw::Intrinsic* x : UsableIntrinsics(chain, target)) {
    if (auto m = mapping::DefaultMapping(chain, *sw, *x)) return m;
  }
  return std::nullopt;
}

std::string DescribeMappings(const ir::Chain& written, const LoopNest& nest) {
  const ir::Chain& chain = NestChain(written, nest);
  std::vector<std::string> parts;
  for (const OpNest& on : nest.ops) {
    const ir::Op& op = chain.ops[on.op];
    if (op.kind != ir::OpKind::kSum) continue;
    parts.push_back(absl::StrCat(chain.tensors[op.output].name, "=",
                                 on.gemm.ok ? mapping::MappingToText(on.mapping, chain) : "scalar"));
  }
  return absl::StrJoin(parts, " ");
}

NestContext MakeNestContext(const ir::Chain& chain, const hw::TargetDesc& target) {
  NestContext c;
  c.block_eligible = BlockEligibleDims(chain);
  c.usable = UsableIntrinsics(chain, target);
  // A CPU's P is calibrated with its widest vectors (usable's first): a
  // narrower unit, or scalar code, reaches its share of it. On a GPU scalar
  // code runs on the CUDA cores next to the tensor cores.
  if (target.backend == hw::Backend::kCuda) {
    c.scalar_rate = 1.0 / 16;
  } else {
    c.widest_lanes = c.usable.empty() ? 1 : c.usable[0]->lanes;
    c.scalar_rate = 1.0 / c.widest_lanes;
  }
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    auto sw = mapping::ViewOp(chain, static_cast<int>(o));
    c.views.push_back(sw.ok() ? std::optional<mapping::SoftwareOp>(*sw) : std::nullopt);
    c.defaults.push_back(sw.ok() ? DefaultMappingFor(chain, static_cast<int>(o), target) : std::nullopt);
  }
  return c;
}

bool CausalBounded(const ir::Chain& chain, const LoopNest& nest, int d, const OpNest* on, bool in_stream) {
  if (nest.causal_softmax < 0 || chain.ops[nest.causal_softmax].axis != d) return false;
  const int row = chain.ops[nest.causal_softmax].causal_row;
  if (Contains(nest.schedule.block, row)) return true;
  return in_stream && on != nullptr && on->region == Region::kStream;
}

absl::StatusOr<LoopNest> BuildLoopNest(const ir::Chain& chain, const Schedule& input, const hw::TargetDesc& target,
                                       const NestContext* context) {
  if (!input.regroup.empty()) {
    absl::StatusOr<ir::Chain> c = ir::ApplyRegroup(chain, input.regroup);
    if (!c.ok()) return c.status();
    auto regrouped = std::make_shared<const ir::Chain>(std::move(*c));
    Schedule rest = input;
    rest.regroup = {};
    absl::StatusOr<LoopNest> nest = BuildLoopNest(*regrouped, rest, target, context);
    if (!nest.ok()) return nest.status();
    nest->schedule.regroup = input.regroup;
    nest->regrouped = std::move(regrouped);
    return nest;
  }
  std::optional<NestContext> own_context;
  if (context == nullptr) context = &own_context.emplace(MakeNestContext(chain, target));
  ASSIGN_OR_RETURN(LoopNest nest, phases::StartNest(chain, input, target));
  RETURN_IF_ERROR(phases::PlaceLoops(chain, *context, nest));
  RETURN_IF_ERROR(phases::PlaceRegions(chain, nest));
  RETURN_IF_ERROR(phases::ResolveMappings(chain, *context, nest));
  RETURN_IF_ERROR(phases::CheckStreamLoopFuses(chain, nest));
  RETURN_IF_ERROR(phases::LinkOnlineSoftmax(chain, nest));
  phases::LayOutBuffers(chain, nest);
  phases::PlaceStatements(chain, nest);
  phases::SkipCausalTiles(chain, target, nest);
  RETURN_IF_ERROR(phases::SplitStreamLoop(chain, target, nest));
  RETURN_IF_ERROR(phases::CheckRegisters(chain, nest));
  return nest;
}

}  // namespace fusor::space

