// The phases that lay out the nest's buffers and place its packs and
// statements (loop_nest_phases.h).
#include "common/space/loop_nest_phases.h"

#include <algorithm>

namespace fusor::space::phases {
namespace {

bool SideDependsOn(const std::vector<ir::Access>& side, int dim) {
  for (const ir::Access& a : side) {
    if (AccessDependsOn(a, dim)) return true;
  }
  return false;
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

// The range an op sees of each dim inside all its loops.
std::vector<int64_t> RangeOf(const ir::Chain& chain, const LoopNest& nest, int o) {
  const Schedule& s = nest.schedule;
  std::vector<int64_t> range(chain.dims.size());
  for (int d = 0; d < static_cast<int>(chain.dims.size()); ++d) {
    bool tiled = Contains(s.block, d) || (d == nest.stream_dim && nest.ops[o].region == Region::kStream) ||
                 Contains(s.own[o], d);
    range[d] = tiled ? s.tile[d] : chain.dims[d].extent;
  }
  return range;
}

// The points an op's tile spans over `dims`.
double PointsOf(const std::vector<int>& dims, const std::vector<int64_t>& range) {
  double points = 1;
  for (int d : dims) points *= static_cast<double>(range[d]);
  return points;
}

// A load of each chain input among `reads`.
void AddLoads(const ir::Chain& chain, LoopNest& nest, int op, const std::vector<ir::Access>& reads,
              const std::vector<int64_t>& range, const std::vector<int>& loops) {
  for (const ir::Access& a : reads) {
    if (chain.tensors[a.tensor].role != ir::TensorRole::kInput) continue;
    AddStatement(chain, nest, StmtKind::kLoad, op, a.tensor, Footprint(a, chain, range), 0, loops);
  }
}

// Every access in the op's body, in order.
std::vector<ir::Access> AccessesOf(const ir::Op& op) {
  std::vector<ir::Access> reads;
  ir::ForEachAccess(op.body, [&](const ir::Access& a) { reads.push_back(a); });
  return reads;
}

// `outer` then the first `own_depth` of the op's own loops.
std::vector<int> LoopsTo(const std::vector<int>& outer, const OpNest& on, int own_depth) {
  std::vector<int> loops = outer;
  loops.insert(loops.end(), on.loops.begin(), on.loops.begin() + own_depth);
  return loops;
}

struct PackPlacement {
  int depth = 0;
  bool hoisted = false;
  bool per_point = false;
};

// A pack covers batch x (rows or cols) x mapped reduced dims and sits just
// inside the innermost loop over one of them; a side that depends on an
// unmapped reduced dim is packed per point of those.
PackPlacement PlacePack(const OpNest& on, int sd, const std::vector<int>& own_side,
                        const std::vector<ir::Access>& side) {
  const GemmForm& g = on.gemm;
  const bool in_stream = on.region == Region::kStream;
  int d_own = 0;
  for (int i = 0; i < static_cast<int>(on.loops.size()); ++i) {
    int d = on.loops[i];
    if (Contains(g.batch, d) || Contains(own_side, d) || Contains(g.kdims, d)) d_own = i + 1;
  }
  PackPlacement p;
  for (int d : g.outer_reduce) p.per_point = p.per_point || SideDependsOn(side, d);
  if (p.per_point) d_own = static_cast<int>(on.loops.size());
  bool needs_stream = in_stream && (Contains(g.batch, sd) || Contains(own_side, sd) || Contains(g.kdims, sd) ||
                                    (p.per_point && Contains(g.outer_reduce, sd)));
  p.depth = d_own;
  p.hoisted = in_stream && d_own == 0 && !needs_stream && !p.per_point;
  return p;
}

struct SumFlops {
  double padded = 0;
  double useful = 0;
};

// A sum mapped onto its intrinsic: the GEMM view of its tile, its scratch,
// where its packs sit and their loads; its compute per execution.
SumFlops PlaceGemm(const ir::Chain& chain, LoopNest& nest, int o, const std::vector<int64_t>& range,
                   const std::vector<int>& outer) {
  OpNest& on = nest.ops[o];
  const GemmForm& g = on.gemm;
  const hw::Intrinsic& x = *on.mapping.intrinsic;
  for (int d : g.batch) on.batch_tile *= range[d];
  for (int d : g.rows) on.rows_tile *= range[d];
  for (int d : g.cols) on.cols_tile *= range[d];
  for (int d : g.kdims) on.k_tile *= range[d];
  int64_t outer_points = 1;
  for (int d : g.outer_reduce) outer_points *= range[d];
  on.rows_pad = RoundUp(on.rows_tile, x.Extent(0));
  on.cols_pad = RoundUp(on.cols_tile, x.Extent(1));
  on.acc_floats = on.batch_tile * on.rows_pad * on.cols_pad;
  on.pack_a_floats = on.batch_tile * on.k_tile * on.rows_pad;
  on.pack_b_floats = on.batch_tile * on.k_tile * on.cols_pad;
  const PackPlacement a = PlacePack(on, nest.stream_dim, g.rows, g.a_side);
  const PackPlacement b = PlacePack(on, nest.stream_dim, g.cols, g.b_side);
  on.a_depth = a.depth;
  on.a_hoisted = a.hoisted;
  on.a_per_point = a.per_point;
  on.b_depth = b.depth;
  on.b_hoisted = b.hoisted;
  on.b_per_point = b.per_point;
  auto pack_loops = [&](int depth, bool hoisted) {
    std::vector<int> loops = LoopsTo(outer, on, depth);
    if (hoisted) loops.pop_back();  // the stream dim, last of `outer`
    return loops;
  };
  AddLoads(chain, nest, on.op, g.a_side, range, pack_loops(on.a_depth, on.a_hoisted));
  AddLoads(chain, nest, on.op, g.b_side, range, pack_loops(on.b_depth, on.b_hoisted));
  SumFlops f;
  f.padded = 2.0 * static_cast<double>(on.acc_floats) * static_cast<double>(RoundUp(on.k_tile, x.Extent(2))) *
             static_cast<double>(outer_points);
  f.useful = 2.0 * static_cast<double>(on.batch_tile * on.rows_tile * on.cols_tile * on.k_tile) *
             static_cast<double>(outer_points);
  return f;
}

// A sum op's statements: its loads, its compute (with the rescaling of an
// online softmax's consumer) and, for a chain output, its store.
void PlaceSum(const ir::Chain& chain, LoopNest& nest, int o, const std::vector<int>& outer) {
  const Schedule& s = nest.schedule;
  const ir::Op& op = chain.ops[o];
  OpNest& on = nest.ops[o];
  const std::vector<int64_t> range = RangeOf(chain, nest, o);
  std::vector<int> all = outer;
  all.insert(all.end(), on.loops.begin(), on.loops.end());
  SumFlops f;
  if (on.gemm.ok) {
    f = PlaceGemm(chain, nest, o, range, outer);
  } else {
    AddLoads(chain, nest, on.op, AccessesOf(op), range, all);
    on.acc_floats = static_cast<int64_t>(PointsOf(op.index, range));
    f.padded = 2.0 * PointsOf(op.index, range) * PointsOf(op.reduce, range);
    f.useful = f.padded;
  }
  AddStatement(chain, nest, StmtKind::kCompute, on.op, -1, 0, f.padded, all);
  nest.statements.back().rate = on.rate;
  nest.padded_flops += f.padded * nest.statements.back().executions;
  nest.useful_flops += f.useful * nest.statements.back().executions;
  if (on.online_softmax >= 0) {
    // Rescaling the accumulator at every stream step, dividing once after.
    const double elems = static_cast<double>(nest.local[op.output].floats);
    AddStatement(chain, nest, StmtKind::kCompute, on.op, -1, 0, 2 * elems, outer);
    AddStatement(chain, nest, StmtKind::kCompute, on.op, -1, 0, elems, s.block);
  }
  if (chain.tensors[op.output].role == ir::TensorRole::kOutput) {
    // An output accumulated across the stream loop is written once per
    // block, all of the block's part at once (its own loops' tiles
    // included); any other once per tile.
    const double points =
        on.accumulates ? static_cast<double>(nest.local[op.output].floats) : PointsOf(op.index, range);
    AddStatement(chain, nest, StmtKind::kStore, on.op, op.output, points * ir::DTypeBytes(chain.dtype), 0,
                 on.accumulates ? s.block : LoopsTo(outer, on, on.num_out_loops));
  }
}

// An elementwise or softmax op's statements (loads, compute and, for a
// chain output, store, all at the op's outer loops) and its row scratch.
void PlaceMap(const ir::Chain& chain, LoopNest& nest, int o, const std::vector<int>& outer) {
  const ir::Op& op = chain.ops[o];
  OpNest& on = nest.ops[o];
  const std::vector<int64_t> range = RangeOf(chain, nest, o);
  AddLoads(chain, nest, on.op, AccessesOf(op), range, outer);
  const double points = PointsOf(op.index, range);
  int nodes = 0;
  std::vector<const ir::Expr*> stack = {&op.body};
  while (!stack.empty()) {
    const ir::Expr* e = stack.back();
    stack.pop_back();
    if (e->kind != ir::Expr::Kind::kAccess && e->kind != ir::Expr::Kind::kConst) ++nodes;
    for (const ir::Expr& arg : e->args) stack.push_back(&arg);
  }
  const double per_point = std::max(nodes, 1) + (op.kind == ir::OpKind::kSoftmax ? 4 : 0);
  AddStatement(chain, nest, StmtKind::kCompute, on.op, -1, 0, points * per_point, outer);
  if (chain.tensors[op.output].role == ir::TensorRole::kOutput) {
    AddStatement(chain, nest, StmtKind::kStore, on.op, op.output, points * ir::DTypeBytes(chain.dtype), 0, outer);
  }
  if (op.kind == ir::OpKind::kSoftmax) {
    on.row_floats = range[op.axis];
    if (on.online) {
      int64_t rows = 1;
      for (int d : op.index) rows *= d == op.axis ? 1 : range[d];
      on.state_floats = 3 * rows;  // running max, running sum, rescale
    }
  }
}

}  // namespace

void LayOutBuffers(const ir::Chain& chain, LoopNest& nest) {
  const Schedule& s = nest.schedule;
  nest.local.resize(chain.tensors.size());
  std::vector<bool> read(chain.tensors.size(), false);
  for (const ir::Op& op : chain.ops) {
    for (int t : ir::TensorsRead(op)) read[t] = true;
  }
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    const ir::Op& op = chain.ops[o];
    const OpNest& on = nest.ops[o];
    if (!read[op.output] && !on.accumulates) continue;
    LocalBuffer& b = nest.local[op.output];
    b.floats = 1;
    for (int d : op.index) {
      bool tile_axis =
          Contains(s.block, d) || (d == nest.stream_dim && on.region == Region::kStream && !on.accumulates);
      b.shape.push_back(tile_axis ? s.tile[d] : chain.dims[d].extent);
      b.relative.push_back(tile_axis);
      b.floats *= b.shape.back();
    }
    nest.intermediate_bytes += b.floats * static_cast<int64_t>(sizeof(float));
  }
}

void PlaceStatements(const ir::Chain& chain, LoopNest& nest) {
  const Schedule& s = nest.schedule;
  int64_t stream_temps = 0, shared_temps = 0;
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    const ir::Op& op = chain.ops[o];
    OpNest& on = nest.ops[o];
    const bool in_stream = on.region == Region::kStream;
    // The loops around this op's work: block, then stream, then own.
    std::vector<int> outer = s.block;
    if (in_stream) outer.push_back(nest.stream_dim);
    on.loops = s.own[o];
    for (int d : on.loops) on.num_out_loops += Contains(op.index, d);
    if (op.kind == ir::OpKind::kSum) {
      PlaceSum(chain, nest, static_cast<int>(o), outer);
    } else {
      PlaceMap(chain, nest, static_cast<int>(o), outer);
    }
    const int64_t temps = on.acc_floats + on.pack_a_floats + on.pack_b_floats + on.row_floats + on.state_floats;
    if (in_stream) {
      stream_temps += temps;
    } else {
      shared_temps = std::max(shared_temps, temps);
    }
  }
  nest.scratch_bytes = nest.intermediate_bytes + (stream_temps + shared_temps) * static_cast<int64_t>(sizeof(float));
}

}  // namespace fusor::space::phases
