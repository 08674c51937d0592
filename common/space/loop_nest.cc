#include "common/space/loop_nest.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/space/loop_nest_phases.h"
#include "common/util/status_macros.h"

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

// True when `a` reads its tensor at the point `index` names, axis by axis.
bool ReadsAtPoint(const ir::Access& a, const std::vector<int>& index) {
  if (a.index.size() != index.size()) return false;
  for (size_t i = 0; i < index.size(); ++i) {
    if (!a.index[i].IsPlainDim() || a.index[i].terms[0].first != index[i]) return false;
  }
  return true;
}

// Why the nest cannot keep its intermediates in registers ("" when it
// can): the warp that computes 16 (or 32) rows of the first GEMM's tile
// must own them through the elementwise ops and the online softmax (if
// any), and feed them as the A fragments of the second GEMM, whose
// accumulator for those rows it keeps across the stream loop.
std::string RegisterResidentProblem(const ir::Chain& chain, const LoopNest& nest) {
  const int sd = nest.stream_dim, last = static_cast<int>(chain.ops.size()) - 1;
  if (sd < 0) return "needs a stream loop";
  if (last < 1) return "needs two GEMMs";
  const OpNest& first = nest.ops[0];
  const OpNest& second = nest.ops[last];
  for (const OpNest* on : {&first, &second}) {
    const ir::Op& op = chain.ops[on->op];
    if (op.kind != ir::OpKind::kSum || !on->gemm.ok) return "the first and the last op must be GEMM-shaped sums";
    if (on->mapping.intrinsic == nullptr || on->mapping.intrinsic->name.rfind("mma.sync.", 0) != 0) {
      return "both GEMMs must map onto mma.sync";
    }
    if (!on->loops.empty()) return "no op may have own loops";
    if (on->batch_tile != 1) return "batch dims must have tiles of 1";
    if (!on->gemm.outer_reduce.empty()) return "every reduced dim must be on the intrinsic";
    if (on->gemm.rows.size() != 1 || on->gemm.cols.size() != 1) return "rows and columns must be one dim each";
    if (on->gemm.a_side.size() != 1 || on->gemm.b_side.size() != 1) return "operands must be single accesses";
  }
  if (first.gemm.cols[0] != sd) return "the first GEMM's columns must be the stream dim";
  if (second.gemm.kdims != std::vector<int>{sd}) return "the last GEMM must reduce the stream dim alone";
  if (second.gemm.rows != first.gemm.rows) return "both GEMMs must share their rows";
  const std::vector<int>& point = chain.ops[0].index;
  int softmax = -1;
  for (int o = 1; o < last; ++o) {
    const ir::Op& op = chain.ops[o];
    if (op.kind == ir::OpKind::kSum) return "only elementwise ops and one softmax may sit between the GEMMs";
    if (op.kind == ir::OpKind::kSoftmax) {
      if (softmax >= 0 || !nest.ops[o].online) return "needs at most one softmax, online along the stream loop";
      if (op.Causal() && op.causal_row != first.gemm.rows[0]) return "a causal softmax's rows must be the GEMMs' rows";
      softmax = o;
    }
    if (op.index != point) return "the ops between the GEMMs must span the first GEMM's points";
  }
  if (second.online_softmax != softmax) return "needs at most one softmax, online along the stream loop";
  // The last GEMM's A operand: the softmax's result, else the op before it.
  const int feed = softmax >= 0 ? softmax : last - 1;
  // Every intermediate is read at the point it was produced; the last GEMM
  // reads only the feed (checked below).
  for (int o = 0; o < last; ++o) {
    const int t = chain.ops[o].output;
    if (chain.tensors[t].role == ir::TensorRole::kOutput) return "an intermediate is a chain output";
    bool elsewhere = false;
    for (int r = o + 1; r <= last; ++r) {
      ir::ForEachAccess(chain.ops[r].body, [&](const ir::Access& a) {
        if (a.tensor == t) elsewhere |= r == last ? o != feed : !ReadsAtPoint(a, point);
      });
    }
    if (elsewhere) return "an intermediate is read at another point";
  }
  const ir::Access& p = second.gemm.a_side[0];
  if (p.tensor != chain.ops[feed].output || !ReadsAtPoint(p, point)) {
    return "the last GEMM must read the softmax's result (or the op before it) at its points";
  }
  for (const OpNest* on : {&first, &second}) {
    for (const std::vector<ir::Access>* side : {&on->gemm.a_side, &on->gemm.b_side}) {
      if (side == &second.gemm.a_side) continue;
      if (chain.tensors[(*side)[0].tensor].producer >= 0) return "the GEMMs' other operands must be chain inputs";
    }
  }
  // A warp owns one row fragment of 16 rows, or two (32 rows) so that
  // each B fragment it reads feeds two mma.
  const int warps = WarpsOf(nest.schedule);
  const int64_t fragments = RowFragmentsPerWarp(first.rows_pad, warps);
  if (first.rows_pad > 32 * warps) return "the row tile exceeds 32 rows per warp";
  if (fragments == 2 && first.rows_pad % 32 != 0) {
    return "with two row fragments per warp the row tile must be a multiple of 32";
  }
  // A thread's share of its warp's fragments: S and O (f32) and S's A
  // operand, per row fragment; beyond 200 of the 255 registers ptxas
  // would spill (the indices and the softmax state need the rest).
  int64_t k = 1;
  for (int d : first.gemm.kdims) k *= chain.dims[d].extent;
  const int64_t registers = fragments * (first.cols_pad / 2 + second.cols_pad / 2 +
                                         (k + 15) / 16 * 16 * ir::DTypeBytes(chain.dtype) / 8);
  if (registers > 200) {
    return absl::StrCat("the warp's fragments need ", registers, " registers a thread (more than 200)");
  }
  return "";
}

// Why the nest's stream loop cannot be split among blocks ("" when it
// can): its accumulated results must be chain outputs nothing reads, and
// nothing may need them within a block.
std::string SplitProblem(const ir::Chain& chain, const hw::TargetDesc& target, const LoopNest& nest) {
  const int sd = nest.stream_dim;
  if (sd < 0) return "there is no stream loop";
  if (nest.schedule.split > nest.trips[sd]) return "more parts than the loop has steps";
  for (const ir::Op& op : chain.ops) {
    if (op.Causal()) return "a causal softmax ends each row's work at the diagonal";
  }
  if (target.backend != hw::Backend::kCpu) {
    // On a GPU the tile's last part to finish combines the parts; every
    // part has steps, so every part's block stages a first tile. The
    // register-resident kernel also combines softmax row states; a nest
    // in shared memory follows the rules below.
    const int64_t per_part = (nest.trips[sd] + nest.schedule.split - 1) / nest.schedule.split;
    if ((nest.schedule.split - 1) * per_part >= nest.trips[sd]) return "a part would have no steps";
    if (nest.schedule.registers) return "";
  }
  bool accumulated = false;
  for (const OpNest& on : nest.ops) {
    const ir::Op& op = chain.ops[on.op];
    if (on.online) return "a softmax is online along it";
    if (on.region == Region::kAfter) return "an op runs after it";
    if (!on.accumulates) continue;
    accumulated = true;
    if (chain.tensors[op.output].role != ir::TensorRole::kOutput) return "what accumulates along it is not an output";
    for (const ir::Op& reader : chain.ops) {
      for (int t : ir::TensorsRead(reader)) {
        if (t == op.output) return "an accumulated result is read";
      }
    }
  }
  return accumulated ? "" : "nothing accumulates along it";
}

// Whether `e` is a product with `factor` among its factors.
bool HasFactor(const ir::Expr& e, const ir::Access& factor) {
  if (e.kind == ir::Expr::Kind::kAccess) return e.access.tensor == factor.tensor && e.access.index == factor.index;
  if (e.kind != ir::Expr::Kind::kMul) return false;
  for (const ir::Expr& arg : e.args) {
    if (HasFactor(arg, factor)) return true;
  }
  return false;
}

// The causal softmax whose dropped entries nothing needs: its result is no
// output, every other op over its axis feeds it (never reads its result,
// no output) or sums along the axis a product of its result, and every op
// over the axis reads the results over it at the current key (a shifted
// read would reach past a block's last key); -1 if none.
int SkippableCausalSoftmax(const ir::Chain& chain) {
  int c = -1;
  for (int o = 0; o < static_cast<int>(chain.ops.size()); ++o) {
    if (!chain.ops[o].Causal()) continue;
    if (c >= 0) return -1;
    c = o;
  }
  if (c < 0) return -1;
  const ir::Op& softmax = chain.ops[c];
  const int axis = softmax.axis;
  if (chain.tensors[softmax.output].role == ir::TensorRole::kOutput) return -1;
  const ir::Access p = ir::ResultAccess(softmax);
  std::vector<bool> over_axis(chain.tensors.size(), false);
  for (const ir::Op& op : chain.ops) {
    if (Contains(op.index, axis)) over_axis[op.output] = true;
  }
  for (int o = 0; o < static_cast<int>(chain.ops.size()); ++o) {
    const ir::Op& op = chain.ops[o];
    bool shifted = false;
    ir::ForEachAccess(op.body, [&](const ir::Access& a) {
      if (chain.tensors[a.tensor].producer < 0) return;
      for (const ir::AffineExpr& e : a.index) shifted = shifted || (e.DependsOn(axis) && !(e == ir::AffineExpr::OfDim(axis)));
    });
    if (shifted) return -1;
    if (o == c) continue;
    const std::vector<int> reads = ir::TensorsRead(op);
    if (Contains(op.reduce, axis)) {
      if (!HasFactor(op.body, p)) return -1;
    } else if (Contains(op.index, axis)) {
      if (Contains(reads, softmax.output) || chain.tensors[op.output].role == ir::TensorRole::kOutput) return -1;
    } else {
      for (int t : reads) {
        if (over_axis[t]) return -1;
      }
    }
  }
  return c;
}

// Whether statement `st` does work along dim `axis`: a loop over it
// encloses it, or it loads or stores a tile over the axis's range, or it
// is an op's computation (`main`: its first compute statement, not an
// online rescaling after it) over that range.
bool OverAxis(const ir::Chain& chain, const Statement& st, int axis, bool main) {
  if (Contains(st.loops, axis)) return true;
  if (st.op < 0) return false;
  const ir::Op& op = chain.ops[st.op];
  if (st.kind == StmtKind::kCompute) return main && (Contains(op.index, axis) || Contains(op.reduce, axis));
  if (st.tensor == op.output) return Contains(op.index, axis);
  bool along = false;
  ir::ForEachAccess(op.body, [&](const ir::Access& a) {
    if (a.tensor == st.tensor) along = along || AccessDependsOn(a, axis);
  });
  return along;
}

}  // namespace

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

namespace phases {
namespace {

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

void SkipCausalTiles(const ir::Chain& chain, const hw::TargetDesc& target, LoopNest& nest) {
  const int c = SkippableCausalSoftmax(chain);
  if (c < 0) return;
  const ir::Op& softmax = chain.ops[c];
  const int axis = softmax.axis, row = softmax.causal_row;
  const bool cpu = target.backend == hw::Backend::kCpu;
  const bool block = Contains(nest.schedule.block, row), streamed = row == nest.stream_dim;
  // A GPU kernel's tiles are whole tiles: the axis must be tiled.
  if (!(block || (cpu && streamed)) || (!cpu && nest.trips[axis] == 1)) return;
  // Row tile b runs the axis up to entry last_row + offset: the tiles up
  // to that entry's, or (untiled) the keys up to it.
  const int64_t rows = chain.dims[row].extent, row_tile = nest.schedule.tile[row];
  const int64_t keys = chain.dims[axis].extent, tile = nest.schedule.tile[axis], trips = nest.trips[axis];
  double kept = 0;
  for (int64_t b = 0; b < nest.trips[row]; ++b) {
    const int64_t last = std::min(rows, (b + 1) * row_tile) - 1 + softmax.causal_offset;
    kept += trips == 1 ? static_cast<double>(std::min(keys, last + 1)) / static_cast<double>(keys)
                       : static_cast<double>(std::min(trips, last / tile + 1)) / static_cast<double>(trips);
  }
  const double share = kept / static_cast<double>(nest.trips[row]);
  if (share >= 1) return;
  nest.causal_softmax = c;
  nest.causal_share = share;
  // The statements over the axis in a block (streamed rows: in the stream
  // loop) run that share of their work: fewer trips of the axis's loops,
  // or a shorter untiled range.
  double padded_skipped = 0;
  std::vector<bool> computed(chain.ops.size(), false);
  for (Statement& st : nest.statements) {
    const bool main = st.kind == StmtKind::kCompute && st.op >= 0 && !computed[st.op];
    if (main) computed[st.op] = true;
    if (!OverAxis(chain, st, axis, main) || (streamed && !Contains(st.loops, row))) continue;
    if (st.kind == StmtKind::kCompute && chain.ops[st.op].kind == ir::OpKind::kSum) {
      padded_skipped += st.flops * st.executions * (1 - share);
    }
    st.executions *= share;
  }
  const double kept_flops = 1 - padded_skipped / nest.padded_flops;
  nest.padded_flops *= kept_flops;
  nest.useful_flops *= kept_flops;
}

absl::Status SplitStreamLoop(const ir::Chain& chain, const hw::TargetDesc& target, LoopNest& nest) {
  const int split = nest.schedule.split;
  if (split <= 1) return absl::OkStatus();
  const std::string why = SplitProblem(chain, target, nest);
  if (!why.empty()) return Illegal(absl::StrCat("the stream loop cannot be split: ", why));
  nest.split = split;
  nest.num_blocks *= split;
  // What runs outside the stream loop runs once per part.
  for (Statement& st : nest.statements) {
    if (!Contains(st.loops, nest.stream_dim)) st.executions *= split;
  }
  // Then the partial sums of each accumulated output are added up.
  for (const OpNest& on : nest.ops) {
    if (!on.accumulates) continue;
    const int output = chain.ops[on.op].output;
    const ir::Tensor& out = chain.tensors[output];
    const double elements = static_cast<double>(out.NumElements());
    AddStatement(chain, nest, StmtKind::kLoad, on.op, output, elements * 4 * split, 0, {});
    nest.statements.back().label = absl::StrCat("L(", out.name, " partials)");
    nest.statements.back().partials = true;
    AddStatement(chain, nest, StmtKind::kStore, on.op, output, elements * ir::DTypeBytes(chain.dtype), 0, {});
  }
  return absl::OkStatus();
}

absl::Status CheckRegisters(const ir::Chain& chain, const LoopNest& nest) {
  if (!nest.schedule.registers) return absl::OkStatus();
  if (std::string why = RegisterResidentProblem(chain, nest); !why.empty()) {
    return Illegal(absl::StrCat("intermediates cannot live in registers: ", why));
  }
  return absl::OkStatus();
}

}  // namespace phases

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
