// The phases about the stream loop (loop_nest_phases.h): the causal
// softmax's dropped tiles skipped, the loop split among blocks, and
// intermediates kept in registers across it.
#include "common/space/loop_nest_phases.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fusor::space::phases {
namespace {

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

}  // namespace fusor::space::phases
