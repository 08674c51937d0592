// The emitter of the fused CPU kernel (cpu_codegen.h), internal to the CPU
// code generator. It walks the nest with NestWalker; its members are
// defined by concern:
//  - cpu_codegen.cc: the driver: the scratch plan and what each op reads in
//    place, the kernel's frame (the parallel block loop, the stream loop,
//    split partial sums), fusor_prepare for constant inputs, and the staging
//    bytes the cost model charges;
//  - cpu_pack.cc: staging: the A and B sides packed into panels (windows
//    over a convolution's rows, transposed and strided sides);
//  - cpu_micro_kernel.cc: the register-tile micro-kernels and the tile
//    product that calls them, sums stored and accumulated;
//  - cpu_epilogue.cc: map ops, epilogues on finished tiles, softmax rows
//    (plain and online) and results completed after the stream loop.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codegen/cpu/cpu_emit.h"
#include "common/codegen/emit.h"
#include "common/codegen/nest_walker.h"
#include "common/ir/chain.h"
#include "common/space/loop_nest.h"

namespace fusor::codegen::cpu {

using emit::CloseScopes;
using emit::Count;
using emit::ExprToC;
using emit::FlatIndex;
using emit::GlobalOffset;
using emit::GlobalStrides;
using emit::OpenPointLoops;
using emit::ProductToC;
using emit::StoreConvert;
using emit::Writer;
using ir::Access;
using ir::Chain;
using ir::Op;
using ir::TensorRole;

inline bool Contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// How a GEMM-shaped sum reads its A side: packed like B, or in place when
// it is one f32 access with one row dim and one reduced dim on the
// intrinsic (A[r][p] at base + r * row_stride + p * k_stride).
struct ASide {
  bool direct = false;
  int64_t row_stride = 1, k_stride = 1;  // elements; packed: 1 and mr
};

// A B side packed once for every point of an unmapped reduced dim r that
// it reads only as p + r, p the outermost column dim the tile spans (a
// convolution's window rows). Point r's panels are the pack shifted by r
// rows of p: the pack holds p's range plus r's less one rows of the later
// column dims, [batch][k][ld] row by row, instead of one pack per point.
struct Window {
  int dim = -1;        // r; -1: no window, B is packed per point
  int row = -1;        // p
  int64_t ld = 0;      // floats per k row of the pack
  int64_t floats = 0;  // of the pack
};

class FusedEmitter : public NestWalker {
 public:
  FusedEmitter(const Chain& chain, const space::LoopNest& nest);

  std::string Emit(const std::string& schedule_text, const std::string& mapping);

  // The prepared state, the walk that packs the constant sides, and
  // fusor_prepare / fusor_release. A block's packs are visited in the
  // same order by the walk and by fusor_body: the k-th visit of constant
  // side c in block blk reads slot k of base[c][blk]. Blocks that differ
  // only in block dims the side does not read share one buffer (the
  // first of them packs it): the key of a block is its tile along the
  // side's block dims, and its part of a split stream loop.
  std::string EmitPrepare();
  // Each constant side's key (see EmitPrepare) in the current block.
  std::vector<std::string> PackKeys() const;
  // fusor_run, and the entry points of a kernel that prepares constants
  // (fusor_run_prepared) or takes the sizes of ranged dims (*_dims), over
  // fusor_body.
  void EmitEntryPoints(bool prepared, const std::vector<int>& ranged);

  // What fusor_prepare packs: "W1 (B of H)", one per constant side.
  std::vector<std::string> ConstantPacks() const;

  struct ConstantPack {
    int op = -1;
    bool a_side = false;
    int64_t floats = 0;     // one pack (the side's buffer)
    std::vector<int> dims;  // that its factors read
  };

  // The scratch each thread allocates: the nest's, with the windows, slots
  // and slack this emitter adds.
  int64_t ScratchBytes() const { return std::max<int64_t>(64, (scratch_floats_ * 4 + 63) / 64 * 64); }

  // The index of op's constant side, or -1.
  int ConstantSide(int op, bool a_side) const;

  // What the kernel moves through the caches besides its micro-kernels'
  // operands, in bytes over all blocks: the packs it makes (not the sides
  // read in place, nor constants packed once by fusor_prepare), the
  // accumulator tiles it copies to their results (a copy whose stores are
  // strided counted kScatterCost times), and the passes of the maps no
  // micro-kernel applies. The cost model charges them on the CPU.
  double StagingBytes() const;

 private:
  // Whether map op `on` is applied by a sum's micro-kernels.
  bool Folded(const space::OpNest& on) const {
    return std::find(epilogue_.begin(), epilogue_.end(), &on) != epilogue_.end();
  }
  // Whether a loop over dim d encloses op `on`'s statements (a block, the
  // stream or an own loop).
  bool Looped(int d, const space::OpNest& on) const {
    return x_.IsBlock(d) || (d == nest_.stream_dim && on.region == space::Region::kStream) ||
           Contains(on.loops, d);
  }
  // The range of dim d in op `on`'s innermost tile.
  double Range(int d, const space::OpNest& on) const {
    return static_cast<double>(Looped(d, on) ? s_.tile[d] : chain_.dims[d].extent);
  }
  double Points(const std::vector<int>& dims, const space::OpNest& on) const {
    double points = 1;
    for (int d : dims) points *= Range(d, on);
    return points;
  }
  // How often a statement of `on` runs that sits inside its first `depth`
  // own loops (and the stream loop, unless hoisted out of it), over all
  // blocks.
  double Executions(const space::OpNest& on, int depth, bool hoisted = false) const;

  int64_t Temps(const space::OpNest& on) const {
    return on.acc_floats + on.pack_a_floats + BPackFloats(on) + on.row_floats + on.state_floats;
  }
  // The scratch of B's packs: none when B is read in place; with the points
  // in the micro-kernel, a slot for each point B is packed for.
  int64_t BPackFloats(const space::OpNest& on) const {
    if (b_direct_[on.op] > 0) return 0;
    const bool slots = points_[on.op] && on.b_per_point;
    return BSlotFloats(on) * (slots ? *ConstCount(PackPoints(on), on) : 1);
  }
  int64_t BSlotFloats(const space::OpNest& on) const {
    return window_[on.op].dim >= 0 ? window_[on.op].floats : on.pack_b_floats;
  }

  std::string Sfx(int o) const { return absl::StrCat(o); }

  // The range of dim d an op's statements see, when known at generation
  // time: the extent when nothing loops over d, the tile when it divides.
  std::optional<int64_t> ConstRange(int d, const space::OpNest& on) const;
  std::optional<int64_t> ConstCount(const std::vector<int>& dims, const space::OpNest& on) const;

  bool HasLocal(int tensor) const { return nest_.local[tensor].floats > 0; }
  bool ConstantInput(int tensor) const {
    return chain_.tensors[tensor].role == TensorRole::kInput && chain_.tensors[tensor].constant;
  }

  // How far an access's element moves per step of dim d (elements of its
  // block-local buffer, or of its tensor in global memory); kRuntimeStride
  // where that changes with the sizes of ranged dims (a tensor's axis
  // outside one a ranged dim sizes), which matches no stride a decision
  // looks for: such a side is packed, gathered or scattered, never read or
  // written in place by the micro-kernels.
  int64_t Stride(const Access& a, int d) const;
  static constexpr int64_t kRuntimeStride = INT64_MIN;
  // That stride as C.
  std::string StrideC(const Access& a, int d) const {
    return HasLocal(a.tensor) ? absl::StrCat(x_.LocalStride(a, d), "L") : emit::GlobalStrideC(a, d, n_);
  }

  // The lanes of an access whose dim d advances by one per lane.
  Lanes AccessLanes(const Access& a, int d) const;
  std::function<Lanes(const Access&)> LanesAlong(int d) const {
    return [this, d](const Access& a) { return AccessLanes(a, d); };
  }

  // The GEMM's one row dim that spans more than one point in the tile (a
  // batch of 1 in front of a model's rows spans one), or -1 when several
  // do. The rows are then that dim's, one stride apart.
  int RowDim(const space::OpNest& on) const;

  ASide ASideOf(const space::OpNest& on) const;

  // The largest range of dim d an op's statements see.
  int64_t MaxRange(int d, const space::OpNest& on) const {
    const std::optional<int64_t> r = ConstRange(d, on);
    return r ? *r : std::min(s_.tile[d], chain_.dims[d].extent);
  }

  // Where B's one factor (not a constant: those are packed once per call
  // anyway) reads p + r and r nowhere else, p in no other index, the column
  // dims before p one point each: the window over r (see Window).
  Window WindowOf(const space::OpNest& on) const;

  // Whether an access's element moves by the tile's flattened column index:
  // the last column dim adjacent, each earlier one the later ones' whole
  // ranges further (a convolution's p.q over whole rows of q). Column dims
  // of one point do not count.
  bool ColumnsFlat(const Access& a, const space::OpNest& on) const;

  // The micro-kernels read B where it is, rows of the returned stride
  // apart, when it is one block-local f32 buffer, one reduced dim on the
  // intrinsic, columns flat (see ColumnsFlat), not rescaled and not packed
  // per point. A tile's last panel may read past its columns: the scratch
  // has room after its last buffer, and those columns are never stored.
  int64_t BDirectStride(const space::OpNest& on) const;

  // Whether the micro-kernel sums its tile over every point of the unmapped
  // reduced dims (a convolution's r and s), C in registers throughout,
  // reading A and B at each point's offset: when there are a few such
  // points (known), A is read in place or packed once for all of them, and
  // B is not a constant packed per point.
  bool PointsFold(const space::OpNest& on) const;
  static constexpr int64_t kMaxPoints = 64;

  // The micro-kernels write C straight to the op's result (no accumulator
  // tile, no copy) when it is a plain f32 destination: the block-local
  // buffer of an intermediate, or an f32 output, neither accumulated across
  // the stream loop nor rescaled; one row dim, and columns flat in it (see
  // ColumnsFlat). The last panel of a tile whose columns are not whole
  // panels is written lane by lane. Returns the destination's row stride,
  // or 0.
  //
  // (Accumulating in place across the stream loop measured slower than
  // the tile plus an adding pass: 2-3% on BERT-base's FFN at 512 rows.)
  int64_t DirectCStride(const space::OpNest& on) const;

  // Whether C is written in place and the tile's columns may end inside a
  // panel.
  bool CTail(const space::OpNest& on) const {
    const std::optional<int64_t> cols = ConstCount(on.gemm.cols, on);
    return direct_c_[on.op] > 0 && !(cols && *cols % on.kernel.nr == 0);
  }

  // Whether an expression costs a few vector instructions a lane: sums,
  // products and ReLU, no division and no exp, erf or tanh.
  static bool Cheap(const ir::Expr& e);

  // Whether map op `m` is applied to the register tiles of sum `s` as they
  // complete (the sum's epilogue: a bias, a residual, a ReLU) instead of in
  // a pass of its own: `s`'s micro-kernels write C in place, its result is
  // an intermediate only `m` reads, element for element, and `m` follows it
  // in the same region, over the same dims. Only cheap maps: a GELU applied
  // in the micro-kernel measured 3.5% slower than its pass over the block
  // (GEMM 512x768x3072 + bias + GELU), while a bias or ReLU pass costs
  // 3.7-5% of the GEMM and nothing folded.
  bool FoldsInto(const space::OpNest& s, const space::OpNest& m) const;

  // Whether an expression is a product: accesses and constants multiplied.
  static bool Product(const ir::Expr& e) {
    using Kind = ir::Expr::Kind;
    if (e.kind == Kind::kAccess || e.kind == Kind::kConst) return true;
    return e.kind == Kind::kMul && Product(e.args[0]) && Product(e.args[1]);
  }

  // The sum op that divides plain softmax `on`'s rows by their sums, or -1:
  // the softmax's result is an intermediate read only by that sum, once,
  // element for element, as a factor of its product, and the sum reduces
  // the softmax's axis and keeps its rows. Its results are then the
  // unnormalized ones divided per row, and the softmax saves a pass over
  // its rows (0.59 to 0.53 ms on BERT's 4-head attention at 512 tokens).
  // The sum must store its tiles finished in this block, with no map
  // folded into its micro-kernels.
  int NormalizedBy(const space::OpNest& on) const;

  // A softmax's rows in one block (its running state's size).
  int64_t RowsPerBlock(const Op& sm) const {
    int64_t rows = 1;
    for (int d : SoftmaxRows(sm)) rows *= x_.IsBlock(d) ? s_.tile[d] : chain_.dims[d].extent;
    return rows;
  }

  void DeclareScratchPointers();

  // ------------------------------------------------- walker hooks ---

  void ZeroAccumulated(const space::OpNest& on) override {
    if (prep_mode_) return;  // the prepare walk: loops and constant packs only
    const int t = chain_.ops[on.op].output;
    w_.Line(absl::StrCat("memset(", n_.Local(t), ", 0, sizeof(float) * ", nest_.local[t].floats, ");"));
  }

  void ResetOnlineState(const space::OpNest& on) override {
    if (prep_mode_) return;  // the prepare walk: loops and constant packs only
    w_.Line(absl::StrCat("for (long i = 0; i < ", on.state_floats / 3, "L; ++i) { smax", Sfx(on.op),
                         "[i] = -INFINITY; ssum", Sfx(on.op), "[i] = 0.0f; }"));
  }

  const char* HoistedNote() const override { return ": packs hoisted out of the stream loop"; }

  bool ReadsAInPlace(const space::OpNest& on) const override { return a_[on.op].direct; }
  bool ReadsBInPlace(const space::OpNest& on) const override { return b_direct_[on.op] > 0; }
  int WindowDim(const space::OpNest& on) const override { return window_[on.op].dim; }
  bool PointsInKernel(const space::OpNest& on) const override { return points_[on.op]; }

  // The loop over the stream dim, or over this block's part of it when
  // the loop is split.
  void OpenStreamLoop() override;

  void EmitSoftmax(const Op& op, const space::OpNest& on) override;

  // After every block of a split stream loop: each accumulated output is
  // the sum of its parts' partial sums.
  void EmitPartialSums();

  // ------------------------------------------------------- pointwise ---

  int64_t ResultStride(const space::OpNest& on, int d) const {
    return Stride(ir::ResultAccess(chain_.ops[on.op]), d);
  }

  // The dim to vectorize a pass over `dims` along: the last one whose
  // destination elements are adjacent, else the last.
  int InnerDim(const std::vector<int>& dims, const std::function<int64_t(int)>& dest_stride) const;

  // Point loops over `dims`, the one over `inner` in vectors (and a
  // masked or scalar tail); `body(vector)` emits one step of lanes that
  // are independent of each other.
  void PointwiseLoops(const std::vector<int>& dims, int inner, const std::function<void(bool)>& body);

  // The vector form of NestIndex::Store: writes the fusor_vf `value` to the
  // op's result at the lanes along dim d.
  void StoreVector(const space::OpNest& on, int d, const std::string& value);

  void EmitMap(const Op& op, const space::OpNest& on) override;

  // ------------------------------------------------------------ sums ---

  struct GemmNames {
    std::string rows, cols, kc, nbatch, rows_pad, cols_pad, mr, nr;
  };

  // `packed_outside`: the names a side packed before the stream loop was
  // laid out with (a causal axis over its full extent there, bounded in
  // the loop).
  GemmNames Gemm(const space::OpNest& on, bool packed_outside = false) const;

  // The micro-kernel of op `on`: C[MR x nr] (=, or += unless FIRST) the
  // product of A[MR x kc] and the packed B panel [kc][nr] (rows of a
  // window's ld apart), C held in registers over the whole kc. A row r,
  // step p is at a[r * row_stride + p * k_stride]; constants are compiled
  // in where the nest knows them. With a column tail, C's first nc columns
  // are read and written (nc < nr in a tile's last panel).
  std::string MicroKernel(const space::OpNest& on) const;

  // One side of a GEMM-shaped sum as Pack writes it for the current tile.
  struct PackSide {
    bool a_side = false;
    std::vector<int> own;         // the panel's dims: A's rows or B's columns
    std::vector<Access> factors;  // whose product is packed
    double scale = 1;
    int width = 0;      // of a panel: mr or nr
    std::string buf;    // the packed buffer
    std::string value;  // the C expression of one element
  };

  // Packs one side of a GEMM-shaped sum for the current tile:
  // [batch][panel][k][mr or nr]. Columns past the tile in B's last panel
  // are zero; rows past it in A's are never read.
  void Pack(const space::OpNest& on, bool a_side) override;

  // Columns per row of a window's p: the later column dims' ranges.
  std::string WindowShift(const space::OpNest& on) const {
    const std::vector<int>& cols = on.gemm.cols;
    const auto p = std::find(cols.begin(), cols.end(), window_[on.op].row);
    return Count(std::vector<int>(p + 1, cols.end()), n_);
  }

  // B's window (see Window), before the loop over its dim r: every k row
  // holds p's range plus r's less one rows of the later column dims, and
  // zeros to ld.
  void PackWindow(const space::OpNest& on, const PackSide& side);

  // The product of the side's factors (scaled) at the lanes along dim d,
  // a fusor_vf.
  std::string VectorProduct(const PackSide& side, int d);

  // Writes the side's values along dim d to dst[var] for var in [0, count),
  // in vectors, the last one under a lane mask; `define` defines d's
  // indices from var.
  void CopyRun(const PackSide& side, int d, const std::string& var, const std::string& count,
               const std::string& define, const std::string& dst);

  // Opens the loop over the tile's panels of `own` (one dim, d) and defines
  // the current one's columns (cn) and start (panel).
  void OpenPanel(const PackSide& side);

  // Zeroes the columns of the current panel past the tile.
  void PadColumns(const PackSide& side) {
    w_.Line(absl::StrCat("for (long j = cn; j < ", side.width, "L; ++j) for (long p = 0; p < kc; ++p) panel[p * ",
                         side.width, "L + j] = 0.0f;"));
  }

  // Defines dim d's indices at column j of the current panel.
  std::string DefineOwn(int d) const {
    return absl::StrCat("const long ", n_.I(d), " = c0 + j, ", n_.V(d), " = ", n_.O(d), " + ", n_.I(d), ";");
  }

  // Packs a side whose panel axis is one dim: along the panel's columns
  // when they are adjacent in memory (a vector copy); along k when k is (a
  // transposition).
  void PackPanels(const space::OpNest& on, const PackSide& side);

  // One factor, k adjacent: transposed in registers (converted from f16 or
  // bf16 on the way).
  void PackTransposed(const space::OpNest& on, const PackSide& side, bool may_pad);

  // Columns adjacent: each step of k copies its row of the tile front to
  // back, a piece into every panel (rows read in one sweep).
  void PackRowByRow(const space::OpNest& on, const PackSide& side, bool may_pad);

  // Rows of the source are apart (a weight matrix's rows, say): the
  // hardware prefetcher does not cross into the next row's page, so the
  // rows a few steps of k ahead are asked for now.
  void PrefetchRowsAhead(const PackSide& side, int d, int k);

  // Several dims on the panel's axis (a convolution's p.q): a run of the
  // last one is adjacent in the panel unless it crosses into the next, and
  // copies as vectors where the source is adjacent too. No dim (a GEMV's
  // degenerate axis): one row of one element.
  void PackSeveralDims(const space::OpNest& on, const PackSide& side);

  // The micro-kernel variants a condition picks: {cond} when it is known
  // ("true" or "false"), else both.
  static std::vector<std::pair<std::string, std::string>> Variants(const std::string& cond) {
    if (cond == "true" || cond == "false") return {{cond, ""}};
    return {{"true", absl::StrCat("(", cond, ")")}, {"false", absl::StrCat("!(", cond, ")")}};
  }

  // The lambda the micro-kernels of `on` call with each finished register
  // tile (row and column in the tile, the vector of lanes along the
  // columns): the folded map's expression, its result stored as the map
  // stores it. Where the vectors are not fusor_vf's width, or a column
  // tail's last vector has fewer lanes (nl), lane by lane.
  void EmitEpilogue(const space::OpNest& on);

  // Declares `name`, the address of access `a`'s element with the `origin`
  // dims at their ranges' starts (a tile's first row, column or k).
  void DefineAtOrigin(const std::string& type, const std::string& name, const std::vector<int>& origin,
                      const Access& a, int lanes_dim);

  // Where each point of the unmapped reduced dims reads A and B, from the
  // tile's first: aoff[pt] and boff[pt] (B's slot and window row).
  void EmitPointOffsets(const space::OpNest& on);

  // The micro-kernel over the whole tile: every batch point, row strip and
  // column panel. `first`: a C bool, whether this is the first of the
  // partial sums the accumulator receives; `last`, whether the last (the
  // micro-kernels then apply the folded epilogue, if any).
  void EmitTileProduct(const space::OpNest& on, const std::string& first, const std::string& last);
  // One strip of `mr_value` rows across the tile's columns: per panel of
  // columns, the epilogue's operands and one micro-kernel call per variant,
  // each under the conditions that pick it; `args` is the call's argument
  // list.
  void EmitKernelCalls(const space::OpNest& on, const std::string& mr_value, const std::string& args,
                       const std::string& first, const std::string& last);

  // Packs sit just inside the own loops they depend on; a generic sum's
  // accumulator is cleared inside its output loops.
  void StageAtLevel(const space::OpNest& on, int level) override;

  // The micro-kernels over the whole tile. The first partial sum of a tile
  // is stored, later ones added.
  void TileProduct(const space::OpNest& on) override;

  // The softmax whose rows sum op `on` divides, or -1.
  int Normalizes(const space::OpNest& on) const {
    const auto it = std::find(normalizer_.begin(), normalizer_.end(), on.op);
    return it == normalizer_.end() ? -1 : static_cast<int>(it - normalizer_.begin());
  }

  // ` * ` the reciprocal sums of the softmax rows `on` divides, as lanes
  // along dim d (a float when d < 0); "" when it divides none.
  std::string RowFactor(const space::OpNest& on, int d) const;

  void StoreSum(const Op& op, const space::OpNest& on) override;

  // A sum no intrinsic takes: each point's reduction added to acc.
  void AccumulateSum(const Op& op, const space::OpNest& on) override;

  // --------------------------------------------------------- softmax ---

  std::vector<int> SoftmaxRows(const Op& op) const;

  std::string AxisVar(int ax) const {
    return absl::StrCat("const long ", n_.V(ax), " = ", n_.O(ax), " + ", n_.I(ax), ";");
  }

  // The softmax's inputs along its axis (within the current range) into
  // `row`, in vectors, and their maximum into the float `max`.
  void EmitRowValues(const Op& op, const std::string& row, const std::string& max);

  // Stores row[i] * `factor` (a C float, or "" for none) to the result.
  void EmitRowStore(const space::OpNest& on, const std::string& row, const std::string& factor);

  // Whether the softmax's row can be worked on where it is stored: its
  // result only in a block-local buffer, adjacent along the axis.
  bool RowInPlace(const Op& op) const {
    const Access self = ir::ResultAccess(op);
    return HasLocal(op.output) && chain_.tensors[op.output].role != TensorRole::kOutput &&
           x_.LocalStride(self, op.axis) == 1;
  }

  // Declares `row`, the row's scratch, or the result's row itself in place.
  std::string SoftmaxRow(const Op& op, const space::OpNest& on);

  void EmitPlainSoftmax(const Op& op, const space::OpNest& on);

  // One stream step of a softmax along the stream dim: the tile's
  // exponentials against the running max; the running sum, and the factor
  // by which the consumer rescales what it accumulated so far.
  void EmitOnlineSoftmax(const Op& op, const space::OpNest& on);

  // Where a result accumulated along the stream loop is written: the
  // output, or this part's partial sums when the loop is split.
  std::string OutputAt(const Op& op) const;
  // The lanes along dim d of an output's element `self` in `base` (its
  // global tensor, or OutputAt), stored as `dtype`.
  Lanes OutputLanes(const Access& self, int d, const std::string& base, ir::DType dtype) const;

  // After the stream loop: an accumulated result is complete; divide by
  // the online softmax's sums and write it out.
  void WriteComplete(const space::OpNest& on, bool output) override;

  std::vector<int64_t> local_offset_;
  std::vector<int64_t> temp_offset_;
  int64_t scratch_floats_ = 0;
  std::vector<ASide> a_;  // per op
  std::vector<Window> window_;  // per op
  std::vector<int64_t> b_direct_;  // per op: the row stride of B read in place, or 0
  std::vector<bool> points_;     // per op: the unmapped reduced dims looped in the micro-kernel
  std::vector<int64_t> direct_c_;  // per op: the row stride of C written in place, or 0
  std::vector<bool> c_tail_;       // per op: C in place, and a last panel of fewer columns
  std::vector<const space::OpNest*> epilogue_;  // per sum: the map its micro-kernels apply to finished tiles
  std::vector<int> normalizer_;   // per plain softmax: the sum op that divides its rows by their sums, or -1
  std::vector<int64_t> inv_offset_;  // per such softmax: its rows' reciprocal sums in the scratch (`sinv`)
  std::map<int, int64_t> partial_slot_;  // split stream: accumulated op -> its partial sums in `partials`
  std::vector<ConstantPack> constant_;
  bool prep_mode_ = false;  // emitting fusor_prep_walk: loops and constant packs only
};

}  // namespace fusor::codegen::cpu
