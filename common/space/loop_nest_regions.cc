// The phases that shape the nest (loop_nest_phases.h): the schedule's
// tiles, the loops, the ops' regions, the mappings, the online softmax.
#include "common/space/loop_nest_phases.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fusor::space::phases {

absl::StatusOr<LoopNest> StartNest(const ir::Chain& chain, const Schedule& input, const hw::TargetDesc& target) {
  const int num_dims = static_cast<int>(chain.dims.size());
  if (static_cast<int>(input.tile.size()) != num_dims) return Illegal("wrong number of tile sizes");
  for (int d = 0; d < num_dims; ++d) {
    if (input.tile[d] < 1 || input.tile[d] > chain.dims[d].extent) {
      return Illegal(absl::StrCat("tile ", input.tile[d], " of '", chain.dims[d].name, "' out of range"));
    }
  }
  if (input.own.size() > chain.ops.size()) return Illegal("loops given for more ops than the chain has");
  const Schedule s = Canonical(input, chain);
  if ((s.warps > 0 || s.stages > 0 || s.registers) && target.backend != hw::Backend::kCuda) {
    return Illegal("warps, stages and registers apply to CUDA targets only");
  }
  // A third stage keeps two steps in flight only where each step is one
  // commit group: the register-resident kernel stages its per-step tiles
  // together; a shared-memory nest commits per op.
  if (s.stages == 3 && !s.registers) return Illegal("three stages apply to intermediates in registers only");
  LoopNest nest;
  nest.schedule = s;
  nest.trips.resize(num_dims);
  for (int d = 0; d < num_dims; ++d) nest.trips[d] = (chain.dims[d].extent + s.tile[d] - 1) / s.tile[d];
  return nest;
}

absl::Status PlaceLoops(const ir::Chain& chain, const NestContext& context, LoopNest& nest) {
  const Schedule& s = nest.schedule;
  // Block loops.
  for (int d : s.block) {
    if (!Contains(context.block_eligible, d)) {
      return Illegal(absl::StrCat("'", chain.dims[d].name,
                                         "' cannot be a block loop: an output lacks it, an op reduces or normalizes "
                                         "along it, or a result is read across it"));
    }
    nest.num_blocks *= nest.trips[d];
  }
  // The stream loop.
  if (s.stream.size() > 1) return Illegal("at most one stream loop");
  const int sd = s.stream.empty() ? -1 : s.stream[0];
  nest.stream_dim = sd;
  if (sd >= 0 && Contains(s.block, sd)) return Illegal("a dim cannot be both a block and a stream loop");
  // Own loops.
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    const ir::Op& op = chain.ops[o];
    const std::vector<int>& own = s.own[o];
    if (!own.empty() && op.kind != ir::OpKind::kSum) {
      return Illegal(absl::StrCat("only sum ops have own loops ('", chain.tensors[op.output].name, "')"));
    }
    bool seen_reduce = false;
    for (int d : own) {
      bool out = Contains(op.index, d), red = Contains(op.reduce, d);
      if (!out && !red) {
        return Illegal(absl::StrCat("'", chain.dims[d].name, "' is not a loop of '",
                                           chain.tensors[op.output].name, "'"));
      }
      if (Contains(s.block, d) || d == sd) {
        return Illegal(absl::StrCat("'", chain.dims[d].name, "' is already a block or stream loop"));
      }
      if (out && seen_reduce) {
        return Illegal(absl::StrCat("loops of '", chain.tensors[op.output].name,
                                           "': output dims come before reduced dims"));
      }
      seen_reduce = seen_reduce || red;
    }
  }
  return absl::OkStatus();
}

absl::Status PlaceRegions(const ir::Chain& chain, LoopNest& nest) {
  const int sd = nest.stream_dim;
  nest.ops.resize(chain.ops.size());
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    const ir::Op& op = chain.ops[o];
    OpNest& on = nest.ops[o];
    on.op = static_cast<int>(o);
    bool uses_stream = sd >= 0 && (Contains(op.index, sd) || Contains(op.reduce, sd));
    bool tile_read = false, needs_after = false;
    std::string tile_tensor;
    bool aligned = true;
    ir::ForEachAccess(op.body, [&](const ir::Access& a) {
      const ir::Tensor& t = chain.tensors[a.tensor];
      if (t.role == ir::TensorRole::kInput) return;
      const OpNest& p = nest.ops[t.producer];
      if (p.region == Region::kAfter || (p.region == Region::kStream && p.accumulates)) needs_after = true;
      if (p.region == Region::kStream && !p.accumulates) {
        tile_read = true;
        tile_tensor = t.name;
        aligned = aligned && ReadsAlong(chain, a, sd);
      }
    });
    if (needs_after && tile_read) {
      return Illegal(absl::StrCat("'", chain.tensors[op.output].name, "' needs both a result complete after the '",
                                         chain.dims[sd].name, "' loop and a tile of '", tile_tensor, "' made inside it"));
    }
    if (tile_read && !aligned) {
      return Illegal(absl::StrCat("'", chain.tensors[op.output].name, "' reads '", tile_tensor, "' across the '",
                                         chain.dims[sd].name, "' loop"));
    }
    on.region = needs_after ? Region::kAfter : (uses_stream || tile_read) ? Region::kStream : Region::kBefore;
    on.accumulates = on.region == Region::kStream && Contains(op.reduce, sd);
    on.online = on.region == Region::kStream && op.kind == ir::OpKind::kSoftmax && op.axis == sd;
  }
  return absl::OkStatus();
}

absl::Status ResolveMappings(const ir::Chain& chain, const NestContext& context, LoopNest& nest) {
  const Schedule& s = nest.schedule;
  // The schedule's mapping, validated, or the default onto the target's
  // best intrinsic; a sum that maps onto nothing runs as scalar code.
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    OpNest& on = nest.ops[o];
    on.rate = context.scalar_rate;
    if (chain.ops[o].kind != ir::OpKind::kSum) continue;
    const std::string& name = chain.tensors[chain.ops[o].output].name;
    const std::optional<mapping::SoftwareOp>& sw = context.views[o];
    std::optional<mapping::Mapping> m;
    if (s.maps[o].intrinsic != nullptr) {
      if (!sw) return Illegal(absl::StrCat("'", name, "' cannot be mapped: it is not a product of tensors"));
      if (std::find(context.usable.begin(), context.usable.end(), s.maps[o].intrinsic) == context.usable.end()) {
        return Illegal(absl::StrCat("the target cannot use ", s.maps[o].intrinsic->name, " for ",
                                           ir::DTypeName(chain.dtype)));
      }
      mapping::Verdict v = mapping::Validate(chain, *sw, s.maps[o], /*degenerate=*/true);
      if (!v.valid) return Illegal(absl::StrCat("mapping of '", name, "' is invalid: ", v.reason));
      m = s.maps[o];
    } else {
      m = context.defaults[o];
    }
    if (!m) continue;
    on.mapping = *m;
    on.kernel = hw::KernelOf(*m->intrinsic);
    on.rate = m->intrinsic->backend == hw::Backend::kCuda
                  ? m->intrinsic->rate
                  : m->intrinsic->rate * m->intrinsic->lanes / context.widest_lanes;
    on.gemm = FormOf(chain, *sw, *m);
  }
  return absl::OkStatus();
}

absl::Status CheckStreamLoopFuses(const ir::Chain& chain, const LoopNest& nest) {
  // A stream loop must fuse something: ops that only loop over it alone.
  if (nest.stream_dim < 0) return absl::OkStatus();
  int in_stream = 0;
  for (const OpNest& on : nest.ops) in_stream += on.region == Region::kStream;
  if (in_stream < 2) {
    const std::string& name = chain.dims[nest.stream_dim].name;
    return Illegal(absl::StrCat("the '", name, "' stream loop encloses fewer than two ops"));
  }
  return absl::OkStatus();
}

absl::Status LinkOnlineSoftmax(const ir::Chain& chain, LoopNest& nest) {
  // An online softmax feeds exactly one sum that accumulates along its axis
  // with the softmax as a factor, and whose output holds the softmax rows.
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    if (!nest.ops[o].online) continue;
    const ir::Op& sm = chain.ops[o];
    const std::string& name = chain.tensors[sm.output].name;
    if (chain.tensors[sm.output].role == ir::TensorRole::kOutput) {
      return Illegal(absl::StrCat("softmax '", name, "' along the stream loop is an output; it cannot be online"));
    }
    int consumer = -1, reads = 0;
    for (size_t c = o + 1; c < chain.ops.size(); ++c) {
      for (int t : ir::TensorsRead(chain.ops[c])) {
        if (t == sm.output) {
          ++reads;
          consumer = static_cast<int>(c);
        }
      }
    }
    bool ok = reads == 1 && nest.ops[consumer].accumulates;
    if (ok) {
      const GemmForm& g = nest.ops[consumer].gemm;
      int as_factor = 0;
      for (const auto* side : {&g.a_side, &g.b_side}) {
        for (const ir::Access& a : *side) as_factor += a.tensor == sm.output;
      }
      ok = g.ok && as_factor == 1;
      for (int d : sm.index) ok = ok && (d == sm.axis || Contains(chain.ops[consumer].index, d));
    }
    if (!ok) {
      return Illegal(absl::StrCat("softmax '", name, "' along the stream loop must feed exactly one sum over '",
                                         chain.dims[nest.stream_dim].name, "' as a factor"));
    }
    nest.ops[consumer].online_softmax = static_cast<int>(o);
  }
  return absl::OkStatus();
}

}  // namespace fusor::space::phases
