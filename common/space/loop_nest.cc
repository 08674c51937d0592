#include "common/space/loop_nest.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"

namespace fusor::space {
namespace {

bool Contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

bool AccessDependsOn(const ir::Access& a, int dim) {
  for (const ir::AffineExpr& e : a.index) {
    if (e.DependsOn(dim)) return true;
  }
  return false;
}

bool SideDependsOn(const std::vector<ir::Access>& side, int dim) {
  for (const ir::Access& a : side) {
    if (AccessDependsOn(a, dim)) return true;
  }
  return false;
}

bool ProductFactors(const ir::Expr& e, double& scale, std::vector<ir::Access>& factors) {
  switch (e.kind) {
    case ir::Expr::Kind::kMul:
      return ProductFactors(e.args[0], scale, factors) && ProductFactors(e.args[1], scale, factors);
    case ir::Expr::Kind::kConst: scale *= e.value; return true;
    case ir::Expr::Kind::kNeg: scale = -scale; return ProductFactors(e.args[0], scale, factors);
    case ir::Expr::Kind::kAccess: factors.push_back(e.access); return true;
    default: return false;
  }
}

// Bytes of the part of `a`'s tensor that `a` touches while each dim d ranges
// over range[d] consecutive values.
double Footprint(const ir::Access& a, const ir::Chain& chain, const std::vector<int64_t>& range) {
  const ir::Tensor& t = chain.tensors[a.tensor];
  double elems = 1;
  for (size_t axis = 0; axis < a.index.size(); ++axis) {
    int64_t span = 1;
    for (const auto& [d, c] : a.index[axis].terms) span += (c < 0 ? -c : c) * (range[d] - 1);
    elems *= static_cast<double>(std::min(span, t.shape[axis]));
  }
  return elems * ir::DTypeBytes(chain.dtype);
}

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

bool NeedsLocalBuffer(const ir::Chain& chain, int t) {
  if (chain.tensors[t].role == ir::TensorRole::kInput) return false;
  bool read = false;
  for (const ir::Op& op : chain.ops) {
    ir::ForEachAccess(op.body, [&](const ir::Access& a) { read = read || a.tensor == t; });
  }
  return read;
}

std::vector<int> FusableDims(const ir::Chain& chain) {
  std::vector<int> result;
  for (int d = 0; d < static_cast<int>(chain.dims.size()); ++d) {
    bool ok = true;
    for (const ir::Op& op : chain.ops) {
      if (!Contains(op.index, d) || op.axis == d) ok = false;
      ir::ForEachAccess(op.body, [&](const ir::Access& a) {
        const ir::Tensor& t = chain.tensors[a.tensor];
        if (t.role == ir::TensorRole::kInput) return;
        const std::vector<int>& producer_index = chain.ops[t.producer].index;
        for (size_t axis = 0; axis < a.index.size(); ++axis) {
          bool is_d_axis = producer_index[axis] == d;
          if (is_d_axis && !(a.index[axis] == ir::AffineExpr::OfDim(d))) ok = false;
          if (!is_d_axis && a.index[axis].DependsOn(d)) ok = false;
        }
      });
      if (!ok) break;
    }
    if (ok) result.push_back(d);
  }
  return result;
}

GemmForm AnalyzeGemmForm(const ir::Op& op, const ir::Chain& chain) {
  GemmForm g;
  if (op.kind != ir::OpKind::kSum) return g;
  std::vector<ir::Access> factors;
  if (!ProductFactors(op.body, g.scale, factors)) return g;
  int vector_dim = op.index.back();
  for (ir::Access& a : factors) {
    (AccessDependsOn(a, vector_dim) ? g.b_side : g.a_side).push_back(std::move(a));
  }
  if (g.b_side.empty()) return g;
  for (int d : op.index) {
    bool in_a = SideDependsOn(g.a_side, d);
    bool in_b = SideDependsOn(g.b_side, d);
    if (in_a && in_b) {
      g.batch.push_back(d);
    } else if (in_b) {
      g.cols.push_back(d);
    } else {
      g.rows.push_back(d);
    }
  }
  g.ok = true;
  return g;
}

absl::StatusOr<LoopNest> BuildLoopNest(const ir::Chain& chain, const Schedule& schedule,
                                       const hw::CpuMicroKernel& kernel) {
  const int num_dims = static_cast<int>(chain.dims.size());
  if (static_cast<int>(schedule.tile.size()) != num_dims) {
    return absl::InvalidArgumentError("schedule has the wrong number of tile sizes");
  }
  std::vector<int> fusable = FusableDims(chain);
  std::set<int> block_set;
  for (int d : schedule.block_dims) {
    if (d < 0 || d >= num_dims) return absl::InvalidArgumentError("schedule: block dim out of range");
    if (!Contains(fusable, d)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule: dim '", chain.dims[d].name, "' cannot be a block dim (not fusable)"));
    }
    if (!block_set.insert(d).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule: block dim '", chain.dims[d].name, "' appears twice"));
    }
  }

  LoopNest nest;
  nest.schedule = schedule;
  nest.kernel = kernel;
  nest.trips.resize(num_dims);
  for (int d = 0; d < num_dims; ++d) {
    int64_t tile = schedule.tile[d];
    if (tile < 1 || tile > chain.dims[d].extent) {
      return absl::InvalidArgumentError(absl::StrCat("schedule: tile ", tile, " of dim '",
                                                     chain.dims[d].name, "' out of range"));
    }
    nest.trips[d] = (chain.dims[d].extent + tile - 1) / tile;
  }
  for (int d : schedule.block_dims) nest.num_blocks *= nest.trips[d];
  auto is_block = [&](int d) { return block_set.count(d) > 0; };

  // The range one block covers along each dim: its tile for block dims, the
  // full extent otherwise (per-op loops narrow it further below).
  std::vector<int64_t> block_range(num_dims);
  for (int d = 0; d < num_dims; ++d) block_range[d] = is_block(d) ? schedule.tile[d] : chain.dims[d].extent;

  // Block-local buffers of intermediates.
  nest.local_floats.assign(chain.tensors.size(), 0);
  int64_t locals = 0;
  for (size_t t = 0; t < chain.tensors.size(); ++t) {
    if (!NeedsLocalBuffer(chain, static_cast<int>(t))) continue;
    int64_t floats = 1;
    for (int d : chain.ops[chain.tensors[t].producer].index) floats *= block_range[d];
    nest.local_floats[t] = floats;
    locals += floats;
  }

  // Adds a statement; C statements are named after the op's output.
  auto add_statement = [&](StmtKind kind, int op, int tensor, double bytes, double flops, std::vector<int> loops) {
    Statement s;
    s.kind = kind;
    s.op = op;
    s.tensor = tensor;
    const char* prefix = kind == StmtKind::kLoad ? "L(" : kind == StmtKind::kCompute ? "C(" : "S(";
    s.label = absl::StrCat(prefix, chain.tensors[tensor >= 0 ? tensor : chain.ops[op].output].name, ")");
    s.bytes = bytes;
    s.flops = flops;
    s.executions = 1;
    for (int d : loops) s.executions *= static_cast<double>(nest.trips[d]);
    s.loops = std::move(loops);
    nest.statements.push_back(std::move(s));
  };
  // Loads of the inputs among `reads` (intermediates are block-local).
  auto add_loads = [&](int op, const std::vector<ir::Access>& reads, const std::vector<int64_t>& range,
                       const std::vector<int>& loops) {
    for (const ir::Access& a : reads) {
      if (chain.tensors[a.tensor].role != ir::TensorRole::kInput) continue;
      add_statement(StmtKind::kLoad, op, a.tensor, Footprint(a, chain, range), 0, loops);
    }
  };
  auto points_of = [](const std::vector<int>& dims, const std::vector<int64_t>& range) {
    double points = 1;
    for (int d : dims) points *= static_cast<double>(range[d]);
    return points;
  };
  const std::vector<int>& block_loops = schedule.block_dims;

  int64_t max_temp = 0;
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    const ir::Op& op = chain.ops[o];
    OpNest on;
    on.op = static_cast<int>(o);
    const bool global_out = chain.tensors[op.output].role == ir::TensorRole::kOutput;

    if (op.kind == ir::OpKind::kSum) {
      on.gemm = AnalyzeGemmForm(op, chain);
      for (int d : op.index) {
        if (!is_block(d) && nest.trips[d] > 1) on.loops.push_back(d);
      }
      on.num_out_loops = static_cast<int>(on.loops.size());
      for (int d : op.reduce) {
        if (nest.trips[d] > 1) on.loops.push_back(d);
      }
      // The range of every dim inside the innermost loop.
      std::vector<int64_t> range = block_range;
      for (int d : op.index) range[d] = schedule.tile[d];
      for (int d : op.reduce) range[d] = schedule.tile[d];

      // A pack covers batch x (rows or cols) x reduced dims; it sits just
      // inside the innermost loop over one of those.
      auto depth_of = [&](const std::vector<int>& own) {
        int depth = 0;
        for (int i = 0; i < static_cast<int>(on.loops.size()); ++i) {
          int d = on.loops[i];
          if (Contains(on.gemm.batch, d) || Contains(own, d) || Contains(op.reduce, d)) depth = i + 1;
        }
        return depth;
      };
      auto loops_to = [&](int depth) {
        std::vector<int> loops = block_loops;
        loops.insert(loops.end(), on.loops.begin(), on.loops.begin() + depth);
        return loops;
      };

      double flops;
      if (on.gemm.ok) {
        for (int d : on.gemm.batch) on.batch_tile *= range[d];
        for (int d : on.gemm.rows) on.rows_tile *= range[d];
        for (int d : on.gemm.cols) on.cols_tile *= range[d];
        for (int d : op.reduce) on.k_tile *= range[d];
        on.rows_pad = RoundUp(on.rows_tile, kernel.mr);
        on.cols_pad = RoundUp(on.cols_tile, kernel.nr);
        on.acc_floats = on.batch_tile * on.rows_pad * on.cols_pad;
        on.pack_a_floats = on.batch_tile * on.k_tile * on.rows_pad;
        on.pack_b_floats = on.batch_tile * on.k_tile * on.cols_pad;
        on.a_depth = depth_of(on.gemm.rows);
        on.b_depth = depth_of(on.gemm.cols);
        add_loads(on.op, on.gemm.a_side, range, loops_to(on.a_depth));
        add_loads(on.op, on.gemm.b_side, range, loops_to(on.b_depth));
        flops = 2.0 * static_cast<double>(on.acc_floats) * static_cast<double>(on.k_tile);
      } else {
        std::vector<ir::Access> reads;
        ir::ForEachAccess(op.body, [&](const ir::Access& a) { reads.push_back(a); });
        add_loads(on.op, reads, range, loops_to(static_cast<int>(on.loops.size())));
        on.acc_floats = static_cast<int64_t>(points_of(op.index, range));
        flops = 2.0 * points_of(op.index, range) * points_of(op.reduce, range);
      }
      add_statement(StmtKind::kCompute, on.op, -1, 0, flops, loops_to(static_cast<int>(on.loops.size())));
      if (global_out) {
        add_statement(StmtKind::kStore, on.op, op.output, points_of(op.index, range) * ir::DTypeBytes(chain.dtype),
                      0, loops_to(on.num_out_loops));
      }
    } else {
      // Map and softmax ops sweep the block's whole range in one go.
      std::vector<ir::Access> reads;
      ir::ForEachAccess(op.body, [&](const ir::Access& a) { reads.push_back(a); });
      add_loads(on.op, reads, block_range, block_loops);
      const double points = points_of(op.index, block_range);
      int nodes = 0;
      std::vector<const ir::Expr*> stack = {&op.body};
      while (!stack.empty()) {
        const ir::Expr* e = stack.back();
        stack.pop_back();
        if (e->kind != ir::Expr::Kind::kAccess && e->kind != ir::Expr::Kind::kConst) ++nodes;
        for (const ir::Expr& arg : e->args) stack.push_back(&arg);
      }
      const double per_point = std::max(nodes, 1) + (op.kind == ir::OpKind::kSoftmax ? 4 : 0);
      add_statement(StmtKind::kCompute, on.op, -1, 0, points * per_point, block_loops);
      if (global_out) {
        add_statement(StmtKind::kStore, on.op, op.output, points * ir::DTypeBytes(chain.dtype), 0, block_loops);
      }
    if (op.kind == ir::OpKind::kSoftmax) on.row_floats = chain.dims[op.axis].extent;
    }
    max_temp = std::max(max_temp, on.acc_floats + on.pack_a_floats + on.pack_b_floats + on.row_floats);
    nest.ops.push_back(std::move(on));
  }
  nest.scratch_bytes = (locals + max_temp) * static_cast<int64_t>(sizeof(float));
  return nest;
}

}  // namespace fusor::space
