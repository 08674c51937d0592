#include "common/codegen/cpu/cpu_codegen.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codegen/cpu/cpu_emit.h"
#include "common/codegen/emit.h"
#include "common/codegen/nest_walker.h"

namespace fusor::codegen {
namespace {

using cpu::Lanes;
using cpu::VectorExpr;
using cpu::VectorLoad;
using cpu::VectorLoop;
using cpu::VectorStore;
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

bool Contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// typedef of the micro-kernel vector type of `lanes` floats, unaligned
// loads allowed.
std::string VectorType(int lanes) {
  if (lanes <= 1) return "typedef float fusor_v1;\n";
  return absl::StrCat("typedef float fusor_v", lanes, " __attribute__((vector_size(", 4 * lanes, "), aligned(4)));\n");
}

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
  FusedEmitter(const Chain& chain, const space::LoopNest& nest) : NestWalker(chain, nest) {
    for (const space::OpNest& on : nest.ops) {
      a_.push_back(ASideOf(on));
      b_direct_.push_back(BDirectStride(on));
      window_.push_back(WindowOf(on));
      points_.push_back(PointsFold(on));
    }
    // Scratch layout: block-local buffers, then the temporaries of the ops
    // inside the stream loop (each its own: hoisted packs live across
    // iterations), then one area the other ops share in turn.
    int64_t offset = 0;
    auto take = [&](int64_t floats) {
      int64_t at = offset;
      offset += (floats + 15) / 16 * 16;
      return at;
    };
    local_offset_.assign(chain.tensors.size(), -1);
    for (size_t t = 0; t < chain.tensors.size(); ++t) {
      if (nest.local[t].floats > 0) local_offset_[t] = take(nest.local[t].floats);
    }
    for (const space::OpNest& on : nest.ops) {
      direct_c_.push_back(DirectCStride(on));
      c_tail_.push_back(CTail(on));
    }
    epilogue_.assign(chain.ops.size(), nullptr);
    for (size_t i = 0; i + 1 < nest.ops.size(); ++i) {
      if (FoldsInto(nest.ops[i], nest.ops[i + 1])) epilogue_[nest.ops[i].op] = &nest.ops[i + 1];
    }
    // A plain softmax whose rows its consumer divides: their reciprocal
    // sums live from the softmax to the consumer's store.
    normalizer_.assign(chain.ops.size(), -1);
    inv_offset_.assign(chain.ops.size(), -1);
    for (const space::OpNest& on : nest.ops) {
      const int c = NormalizedBy(on);
      if (c < 0 || Contains(normalizer_, c)) continue;  // a product divides by one softmax's sums
      normalizer_[on.op] = c;
      inv_offset_[on.op] = take(RowsPerBlock(chain.ops[on.op]));
    }
    temp_offset_.assign(chain.ops.size(), 0);
    for (const space::OpNest& on : nest.ops) {
      if (on.region == space::Region::kStream) temp_offset_[on.op] = take(Temps(on));
    }
    const int64_t shared = offset;
    int64_t shared_floats = 0;
    for (const space::OpNest& on : nest.ops) {
      if (on.region != space::Region::kStream) {
        temp_offset_[on.op] = shared;
        shared_floats = std::max(shared_floats, Temps(on));
      }
    }
    // B read in place may be read a panel past its tile's last column.
    scratch_floats_ = shared + shared_floats + 64;
    // The packed sides whose every factor is a constant input: packed once
    // by fusor_prepare, for every visit of every block.
    for (const space::OpNest& on : nest.ops) {
      if (!on.gemm.ok) continue;
      for (bool a_side : {true, false}) {
        const int64_t floats = a_side ? on.pack_a_floats : on.pack_b_floats;
        const std::vector<Access>& factors = a_side ? on.gemm.a_side : on.gemm.b_side;
        if ((a_side && a_[on.op].direct) || (!a_side && b_direct_[on.op] > 0) || floats == 0 || factors.empty()) {
          continue;
        }
        ConstantPack c{on.op, a_side, floats, {}};
        bool constant = true;
        for (const Access& a : factors) {
          constant = constant && ConstantInput(a.tensor);
          for (const ir::AffineExpr& e : a.index) {
            for (const auto& [d, coef] : e.terms) {
              if (!Contains(c.dims, d)) c.dims.push_back(d);
            }
          }
        }
        // Packed once per visit: a loop around the pack over a dim the side
        // does not read would store the same pack once per trip (an FFN's
        // weight under its rows' loop), so such a side is packed per call.
        std::vector<int> around;
        const bool hoisted = a_side ? on.a_hoisted : on.b_hoisted;
        const bool per_point = a_side ? on.a_per_point : on.b_per_point;
        if (!hoisted) {
          const int depth = per_point ? static_cast<int>(on.loops.size()) : (a_side ? on.a_depth : on.b_depth);
          around.assign(on.loops.begin(), on.loops.begin() + std::min<int>(depth, on.loops.size()));
          if (on.region == space::Region::kStream) around.push_back(nest.stream_dim);
        }
        for (int d : around) constant = constant && Contains(c.dims, d);
        if (constant) constant_.push_back(std::move(c));
      }
    }
  }

  std::string Emit(const std::string& schedule_text, const std::string& mapping) {
    std::string title = absl::StrCat(
        "// fusor fused CPU kernel for chain '", chain_.name, "'\n", "// schedule: ", schedule_text, "  (",
        space::TilingExpression(s_, chain_), ")\n", "// mapping:  ", mapping, "\n", "// blocks: ", nest_.num_blocks,
        ", scratch per thread: ", ScratchBytes(), " bytes\n", "// chain:\n");
    for (const Op& op : chain_.ops) absl::StrAppend(&title, "//   ", ir::OpToString(op, chain_), "\n");
    std::string out = cpu::Preamble(title + "\n");
    std::set<int> lanes;
    for (const space::OpNest& on : nest_.ops) {
      if (on.gemm.ok) lanes.insert(on.kernel.lanes);
    }
    for (int l : lanes) out += VectorType(l);
    for (const space::OpNest& on : nest_.ops) {
      if (on.gemm.ok) out += MicroKernel(on);
    }
    out += "\n";

    const bool prepared = !constant_.empty();
    if (prepared) out += EmitPrepare();
    Writer& w = w_;
    w.Open(prepared ? "static int fusor_body(const fusor_prep_t* fusor_prep, const void* const* fusor_inputs, "
                      "void* const* fusor_outputs, int num_threads)"
                    : "extern \"C\" int fusor_run(const void* const* fusor_inputs, void* const* fusor_outputs, "
                      "int num_threads)");
    cpu::DeclareArguments(w, chain_, n_);
    const int64_t scratch_bytes = ScratchBytes();
    if (nest_.split > 1) {
      // Per accumulated output, one partial sum per part of the split stream.
      int64_t floats = 0;
      for (const space::OpNest& on : nest_.ops) {
        if (!on.accumulates) continue;
        partial_slot_[on.op] = floats;
        floats += chain_.tensors[chain_.ops[on.op].output].NumElements() * nest_.split;
      }
      w.Line(absl::StrCat("float* const partials = fusor_partials(", floats * 4, "UL);"));
      w.Line("if (!partials) return 1;");
    }
    w.Line("int failed = 0;");
    w.Line(absl::StrCat("#pragma omp parallel num_threads(num_threads > 0 ? num_threads : 1) if (",
                        nest_.num_blocks, " > 1)"));
    w.Open("");
    w.Line(absl::StrCat("float* const scratch = fusor_scratch(", scratch_bytes, ");"));
    w.Open("if (!scratch)");
    w.Line("#pragma omp atomic write");
    w.Line("failed = 1;");
    w.Close();
    w.Line("#pragma omp for schedule(dynamic, 1)");
    w.Open(absl::StrCat("for (long blk = 0; blk < ", nest_.num_blocks, "L; ++blk)"));
    w.Line("if (!scratch) continue;");
    DeclareScratchPointers();
    if (prepared) w.Line(absl::StrCat("long fusor_visit[", constant_.size(), "] = {0};"));
    if (nest_.split > 1) {
      w.Line(absl::StrCat("const long part = blk % ", nest_.split, "L;"));
      x_.DefineBlockOrigins(w, absl::StrCat("blk / ", nest_.split, "L"));
    } else {
      x_.DefineBlockOrigins(w, "blk");
    }
    WalkBlock();
    w.Close();  // block loop
    if (nest_.split > 1) EmitPartialSums();
    w.Close();  // parallel
    w.Line("return failed;");
    w.Close();
    if (prepared) {
      w.Line("");
      w.Line("extern \"C\" int fusor_run(const void* const* fusor_inputs, void* const* fusor_outputs, int num_threads) {");
      w.Line("  return fusor_body(0, fusor_inputs, fusor_outputs, num_threads);");
      w.Line("}");
      w.Line("");
      w.Line("// The same, with the constant inputs' packs from fusor_prepare; every input is passed as to fusor_run");
      w.Line("// (a constant one is still read where it is not packed, a bias say).");
      w.Line("extern \"C\" int fusor_run_prepared(const void* prepared, const void* const* fusor_inputs,");
      w.Line("                                    void* const* fusor_outputs, int num_threads) {");
      w.Line("  return fusor_body((const fusor_prep_t*)prepared, fusor_inputs, fusor_outputs, num_threads);");
      w.Line("}");
    }
    return out + w.Take();
  }

  // The prepared state, the walk that packs the constant sides, and
  // fusor_prepare / fusor_release. A block's packs are visited in the
  // same order by the walk and by fusor_body: the k-th visit of constant
  // side c in block blk reads slot k of base[c][blk]. Blocks that differ
  // only in block dims the side does not read share one buffer (the
  // first of them packs it): the key of a block is its tile along the
  // side's block dims, and its part of a split stream loop.
  std::string EmitPrepare() {
    const size_t sides = constant_.size();
    const int64_t blocks = nest_.num_blocks;
    Writer& w = w_;
    w.Line("#include <stdlib.h>");
    w.Line("");
    w.Line(absl::StrCat("// Packed constant sides: ", sides, ", over ", blocks, " blocks."));
    w.Open("struct fusor_prep_t");
    w.Line(absl::StrCat("float* base[", sides, "][", blocks, "];  // where each block's packs of each side start"));
    w.Line(absl::StrCat("float* owned[", sides, "][", blocks, "];  // the buffers, by key"));
    w.Line(absl::StrCat("long visits[", sides, "][", blocks, "];  // how many packs each key holds"));
    w.Close(";");
    w.Line("");
    w.Open("static void fusor_prep_walk(const void* const* fusor_inputs, void* const* fusor_outputs, long blk, "
           "float* const* fusor_dst, long* fusor_visits, long* fusor_keys)");
    cpu::DeclareArguments(w, chain_, n_);
    if (nest_.split > 1) {
      w.Line(absl::StrCat("const long part = blk % ", nest_.split, "L;"));
      x_.DefineBlockOrigins(w, absl::StrCat("blk / ", nest_.split, "L"));
    } else {
      x_.DefineBlockOrigins(w, "blk");
    }
    for (size_t c = 0; c < sides; ++c) {
      std::string key = "0L";
      for (int d : s_.block) {
        if (!Contains(constant_[c].dims, d)) continue;
        key = absl::StrCat("(", key, ") * ", nest_.trips[d], "L + ", n_.O(d), " / ", s_.tile[d], "L");
      }
      if (nest_.split > 1) key = absl::StrCat("(", key, ") * ", nest_.split, "L + part");
      w.Line(absl::StrCat("fusor_keys[", c, "] = ", key, ";"));
    }
    prep_mode_ = true;
    WalkBlock();
    prep_mode_ = false;
    w.Close();
    w.Line("");
    w.Line("extern \"C\" void fusor_release(void* prepared) {");
    w.Line("  fusor_prep_t* p = (fusor_prep_t*)prepared;");
    w.Line("  if (!p) return;");
    w.Line(absl::StrCat("  for (long c = 0; c < ", sides, "L; ++c) for (long k = 0; k < ", blocks,
                        "L; ++k) free(p->owned[c][k]);"));
    w.Line("  free(p);");
    w.Line("}");
    w.Line("");
    w.Line("// Packs the constant inputs once (the other inputs are not read; they may be null). Returns the");
    w.Line("// state fusor_run_prepared takes, or null when memory ran out (or, which the walk rules out, blocks");
    w.Line("// sharing packs visited them differently); fusor_release frees it.");
    w.Open("extern \"C\" void* fusor_prepare(const void* const* fusor_inputs)");
    w.Line("fusor_prep_t* p = (fusor_prep_t*)calloc(1, sizeof(fusor_prep_t));");
    w.Line("if (!p) return 0;");
    w.Line(absl::StrCat("void* outputs[", chain_.outputs.size(), "] = {0};"));
    w.Open(absl::StrCat("for (long blk = 0; blk < ", blocks, "L; ++blk)"));
    w.Line(absl::StrCat("long keys[", sides, "], visits[", sides, "] = {0};"));
    w.Line(absl::StrCat("float* dst[", sides, "] = {0};"));
    w.Line("fusor_prep_walk(fusor_inputs, outputs, blk, dst, visits, keys);  // count the visits");
    w.Open(absl::StrCat("for (long c = 0; c < ", sides, "L; ++c)"));
    w.Open("if (p->owned[c][keys[c]])");
    w.Line("// a block of the same key packed it; its visits must match");
    w.Line("if (p->visits[c][keys[c]] != visits[c]) { fusor_release(p); return 0; }");
    w.Line("p->base[c][blk] = p->owned[c][keys[c]];");
    w.Close();
    w.Open("else");
    w.Line("const long floats[] = {" + absl::StrJoin(constant_, ", ", [](std::string* out, const ConstantPack& c) {
             absl::StrAppend(out, c.floats, "L");
           }) + "};");
    w.Line("const size_t bytes = ((size_t)(visits[c] > 0 ? visits[c] : 1) * floats[c] * 4 + 63) / 64 * 64;");
    w.Line("dst[c] = (float*)aligned_alloc(64, bytes);");
    w.Line("if (!dst[c]) { fusor_release(p); return 0; }");
    w.Line("p->owned[c][keys[c]] = p->base[c][blk] = dst[c];");
    w.Line("p->visits[c][keys[c]] = visits[c];");
    w.Close();
    w.Close();
    w.Line(absl::StrCat("for (long c = 0; c < ", sides, "L; ++c) visits[c] = 0;"));
    w.Line("fusor_prep_walk(fusor_inputs, outputs, blk, dst, visits, keys);  // pack where this block is first");
    w.Close();
    w.Line("return p;");
    w.Close();
    w.Line("");
    return w.Take();
  }

  // What fusor_prepare packs: "W1 (B of H)", one per constant side.
  std::vector<std::string> ConstantPacks() const {
    std::vector<std::string> out;
    for (const ConstantPack& c : constant_) {
      std::vector<std::string> names;
      for (const Access& a : c.a_side ? nest_.ops[c.op].gemm.a_side : nest_.ops[c.op].gemm.b_side) {
        names.push_back(chain_.tensors[a.tensor].name);
      }
      out.push_back(absl::StrCat(absl::StrJoin(names, "*"), " (", c.a_side ? "A" : "B", " side of ",
                                 chain_.tensors[chain_.ops[c.op].output].name, ")"));
    }
    return out;
  }

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
  int ConstantSide(int op, bool a_side) const {
    for (size_t c = 0; c < constant_.size(); ++c) {
      if (constant_[c].op == op && constant_[c].a_side == a_side) return static_cast<int>(c);
    }
    return -1;
  }

  // What the kernel moves through the caches besides its micro-kernels'
  // operands, in bytes over all blocks: the packs it makes (not the sides
  // read in place, nor constants packed once by fusor_prepare), the
  // accumulator tiles it copies to their results (a copy whose stores are
  // strided counted kScatterCost times), and the passes of the maps no
  // micro-kernel applies. The cost model charges them on the CPU.
  double StagingBytes() const {
    constexpr double kScatterCost = 4;  // a strided vector store against a contiguous one
    double bytes = 0;
    for (const space::OpNest& on : nest_.ops) {
      const Op& op = chain_.ops[on.op];
      if (op.kind == ir::OpKind::kMap) {
        if (Folded(on)) continue;
        double reads = 0;
        ir::ForEachAccess(op.body, [&](const Access&) { ++reads; });
        bytes += 4 * (reads + 1) * Points(op.index, on) * Executions(on, 0);
        continue;
      }
      if (op.kind != ir::OpKind::kSum || !on.gemm.ok) continue;
      const space::GemmForm& g = on.gemm;
      if (!a_[on.op].direct && ConstantSide(on.op, true) < 0) {
        const double points = on.a_per_point ? Points(g.outer_reduce, on) : 1;
        bytes += 8.0 * static_cast<double>(on.pack_a_floats) * points *
                 Executions(on, on.a_depth, on.a_hoisted);
      }
      if (b_direct_[on.op] == 0 && ConstantSide(on.op, false) < 0) {
        const double points =
            window_[on.op].dim >= 0 ? Points(PackPoints(on), on) : on.b_per_point ? Points(g.outer_reduce, on) : 1;
        bytes += 8.0 * static_cast<double>(BSlotFloats(on)) * points * Executions(on, on.b_depth, on.b_hoisted);
      }
      if (direct_c_[on.op] == 0) {
        const bool strided = !g.cols.empty() && ResultStride(on, g.cols.back()) != 1;
        bytes += 8.0 * static_cast<double>(on.batch_tile * on.rows_tile * on.cols_tile) *
                 (strided ? kScatterCost : 1) * Executions(on, on.num_out_loops);
      }
    }
    return bytes;
  }

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
  double Executions(const space::OpNest& on, int depth, bool hoisted = false) const {
    std::vector<int> loops = s_.block;
    const bool streamed = on.region == space::Region::kStream && !hoisted;
    if (streamed) loops.push_back(nest_.stream_dim);
    loops.insert(loops.end(), on.loops.begin(), on.loops.begin() + std::min<int>(depth, on.loops.size()));
    // What runs outside a split stream loop runs once per part.
    double runs = streamed ? 1 : nest_.split;
    for (int d : loops) runs *= static_cast<double>(nest_.trips[d]);
    return runs;
  }

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
  std::optional<int64_t> ConstRange(int d, const space::OpNest& on) const {
    const int64_t extent = chain_.dims[d].extent, tile = s_.tile[d];
    if (!Looped(d, on)) {
      // An untiled causal axis ends where the row tile's last key is.
      if (x_.Bounded(d, &on)) return std::nullopt;
      return extent;
    }
    if (extent % tile == 0) return tile;
    return std::nullopt;
  }
  std::optional<int64_t> ConstCount(const std::vector<int>& dims, const space::OpNest& on) const {
    int64_t n = 1;
    for (int d : dims) {
      std::optional<int64_t> r = ConstRange(d, on);
      if (!r) return std::nullopt;
      n *= *r;
    }
    return n;
  }

  bool HasLocal(int tensor) const { return nest_.local[tensor].floats > 0; }
  bool ConstantInput(int tensor) const {
    return chain_.tensors[tensor].role == TensorRole::kInput && chain_.tensors[tensor].constant;
  }

  // How far an access's element moves per step of dim d (elements of its
  // block-local buffer, or of its tensor in global memory).
  int64_t Stride(const Access& a, int d) const {
    if (HasLocal(a.tensor)) return x_.LocalStride(a, d);
    int64_t constant = 0;
    std::map<int, int64_t> strides = GlobalStrides(a, chain_, &constant);
    auto it = strides.find(d);
    return it == strides.end() ? 0 : it->second;
  }

  // The lanes of an access whose dim d advances by one per lane.
  Lanes AccessLanes(const Access& a, int d) const {
    Lanes l;
    l.stride = Stride(a, d);
    if (HasLocal(a.tensor)) {
      l.ptr = absl::StrCat("&", n_.Local(a.tensor), "[", x_.LocalOffset(a), "]");
    } else {
      l.ptr = absl::StrCat("&", n_.Global(a.tensor), "[", GlobalOffset(a, n_), "]");
      l.dtype = chain_.dtype;
    }
    return l;
  }
  std::function<Lanes(const Access&)> LanesAlong(int d) const {
    return [this, d](const Access& a) { return AccessLanes(a, d); };
  }

  // The GEMM's one row dim that spans more than one point in the tile (a
  // batch of 1 in front of a model's rows spans one), or -1 when several
  // do. The rows are then that dim's, one stride apart.
  int RowDim(const space::OpNest& on) const {
    int row = -1;
    for (int d : on.gemm.rows) {
      if (ConstRange(d, on) == std::optional<int64_t>(1)) continue;
      if (row >= 0) return -1;
      row = d;
    }
    return row >= 0 || on.gemm.rows.empty() ? row : on.gemm.rows.back();
  }

  ASide ASideOf(const space::OpNest& on) const {
    ASide a;
    const space::GemmForm& g = on.gemm;
    a.k_stride = on.kernel.mr;
    if (!g.ok || g.a_side.size() != 1 || RowDim(on) < 0 || g.kdims.size() != 1) return a;
    const Access& acc = g.a_side[0];
    if (!HasLocal(acc.tensor) && chain_.dtype != ir::DType::kF32) return a;
    a.direct = true;
    a.row_stride = Stride(acc, RowDim(on));
    a.k_stride = Stride(acc, g.kdims[0]);
    return a;
  }

  // The largest range of dim d an op's statements see.
  int64_t MaxRange(int d, const space::OpNest& on) const {
    const std::optional<int64_t> r = ConstRange(d, on);
    return r ? *r : std::min(s_.tile[d], chain_.dims[d].extent);
  }

  // Where B's one factor (not a constant: those are packed once per call
  // anyway) reads p + r and r nowhere else, p in no other index, the column
  // dims before p one point each: the window over r (see Window).
  Window WindowOf(const space::OpNest& on) const {
    Window win;
    const space::GemmForm& g = on.gemm;
    if (!g.ok || !on.b_per_point || g.b_side.size() != 1) return win;
    const Access& b = g.b_side[0];
    if (ConstantInput(b.tensor)) return win;
    size_t i = 0;
    while (i < g.cols.size() && ConstRange(g.cols[i], on) == 1) ++i;
    if (i == g.cols.size()) return win;
    const int p = g.cols[i];
    int64_t shift = 1;  // columns per row of p, at most
    for (size_t j = i + 1; j < g.cols.size(); ++j) shift *= MaxRange(g.cols[j], on);
    auto uses = [&](int d) {
      int n = 0;
      for (const ir::AffineExpr& e : b.index) n += e.DependsOn(d) ? 1 : 0;
      return n;
    };
    for (int r : g.outer_reduce) {
      if (uses(r) != 1 || uses(p) != 1) continue;
      bool pair = false;
      for (const ir::AffineExpr& e : b.index) {
        pair = pair || (e.DependsOn(r) && e.DependsOn(p) && e.Coefficient(r) == e.Coefficient(p));
      }
      if (!pair) continue;
      const hw::MicroKernel& k = on.kernel;
      const int64_t cols_pad = (MaxRange(p, on) * shift + k.nr - 1) / k.nr * k.nr;
      win.dim = r;
      win.row = p;
      win.ld = (cols_pad + (MaxRange(r, on) - 1) * shift + 15) / 16 * 16;
      win.floats = on.batch_tile * on.k_tile * win.ld;
      return win;
    }
    return win;
  }

  // Whether an access's element moves by the tile's flattened column index:
  // the last column dim adjacent, each earlier one the later ones' whole
  // ranges further (a convolution's p.q over whole rows of q). Column dims
  // of one point do not count.
  bool ColumnsFlat(const Access& a, const space::OpNest& on) const {
    const std::vector<int>& cols = on.gemm.cols;
    int64_t expect = 1;
    std::optional<int64_t> later = 1;  // the range of the last dim checked
    for (size_t j = cols.size(); j-- > 0;) {
      const std::optional<int64_t> range = ConstRange(cols[j], on);
      if (range == 1) continue;
      if (!later || Stride(a, cols[j]) != expect) return false;
      later = range;
      if (range) expect *= *range;
    }
    return true;
  }

  // The micro-kernels read B where it is, rows of the returned stride
  // apart, when it is one block-local f32 buffer, one reduced dim on the
  // intrinsic, columns flat (see ColumnsFlat), not rescaled and not packed
  // per point. A tile's last panel may read past its columns: the scratch
  // has room after its last buffer, and those columns are never stored.
  int64_t BDirectStride(const space::OpNest& on) const {
    const space::GemmForm& g = on.gemm;
    if (!g.ok || g.b_side.size() != 1 || g.kdims.size() != 1 || on.b_per_point || g.cols.empty()) return 0;
    if (a_[on.op].direct && g.scale != 1) return 0;
    const Access& b = g.b_side[0];
    if (!HasLocal(b.tensor) || !ColumnsFlat(b, on)) return 0;
    return Stride(b, g.kdims[0]);
  }

  // Whether the micro-kernel sums its tile over every point of the unmapped
  // reduced dims (a convolution's r and s), C in registers throughout,
  // reading A and B at each point's offset: when there are a few such
  // points (known), A is read in place or packed once for all of them, and
  // B is not a constant packed per point.
  bool PointsFold(const space::OpNest& on) const {
    const space::GemmForm& g = on.gemm;
    if (!g.ok || g.outer_reduce.empty() || (on.a_per_point && !a_[on.op].direct)) return false;
    const std::optional<int64_t> points = ConstCount(g.outer_reduce, on);
    if (!points || *points > kMaxPoints) return false;
    for (const Access& b : g.b_side) {
      if (on.b_per_point && ConstantInput(b.tensor)) return false;
    }
    return true;
  }
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
  int64_t DirectCStride(const space::OpNest& on) const {
    const space::GemmForm& g = on.gemm;
    const Op& op = chain_.ops[on.op];
    if (!g.ok || RowDim(on) < 0 || g.cols.empty() || on.accumulates || on.online_softmax >= 0) return 0;
    const bool output = chain_.tensors[op.output].role == TensorRole::kOutput;
    if (HasLocal(op.output) == output) return 0;  // both or neither
    if (output && chain_.dtype != ir::DType::kF32) return 0;
    const Access self = ir::ResultAccess(op);
    if (!ColumnsFlat(self, on)) return 0;
    // A one-lane micro-kernel (scalar.4x4) writes whole panels only.
    const std::optional<int64_t> cols = ConstCount(g.cols, on);
    if (on.kernel.lanes == 1 && !(cols && *cols % on.kernel.nr == 0)) return 0;
    return Stride(self, RowDim(on));
  }

  // Whether C is written in place and the tile's columns may end inside a
  // panel.
  bool CTail(const space::OpNest& on) const {
    const std::optional<int64_t> cols = ConstCount(on.gemm.cols, on);
    return direct_c_[on.op] > 0 && !(cols && *cols % on.kernel.nr == 0);
  }

  // Whether an expression costs a few vector instructions a lane: sums,
  // products and ReLU, no division and no exp, erf or tanh.
  static bool Cheap(const ir::Expr& e) {
    using Kind = ir::Expr::Kind;
    if (e.kind == Kind::kDiv || (e.kind == Kind::kCall && e.func != ir::Func::kRelu)) return false;
    for (const ir::Expr& arg : e.args) {
      if (!Cheap(arg)) return false;
    }
    return true;
  }

  // Whether map op `m` is applied to the register tiles of sum `s` as they
  // complete (the sum's epilogue: a bias, a residual, a ReLU) instead of in
  // a pass of its own: `s`'s micro-kernels write C in place, its result is
  // an intermediate only `m` reads, element for element, and `m` follows it
  // in the same region, over the same dims. Only cheap maps: a GELU applied
  // in the micro-kernel measured 3.5% slower than its pass over the block
  // (GEMM 512x768x3072 + bias + GELU), while a bias or ReLU pass costs
  // 3.7-5% of the GEMM and nothing folded.
  bool FoldsInto(const space::OpNest& s, const space::OpNest& m) const {
    const Op& sum = chain_.ops[s.op];
    const Op& map = chain_.ops[m.op];
    if (direct_c_[s.op] == 0 || s.accumulates || map.kind != ir::OpKind::kMap || !Cheap(map.body) ||
        m.region != s.region || m.accumulates || m.online_softmax >= 0 || s.kernel.lanes == 1) {
      return false;
    }
    const int h = sum.output;
    if (chain_.tensors[h].role != TensorRole::kIntermediate) return false;
    std::vector<int> a = sum.index, b = map.index;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a != b) return false;
    const Access self = ir::ResultAccess(sum);
    bool only_map = true;
    for (const Op& op : chain_.ops) {
      ir::ForEachAccess(op.body, [&](const Access& x) {
        if (x.tensor == h && (&op != &map || x.index != self.index)) only_map = false;
      });
    }
    // The epilogue's vectors run along the flattened columns: every access
    // moves with them, or stays put.
    if (s.gemm.cols.size() == 1) return only_map;
    bool flat = ColumnsFlat(ir::ResultAccess(map), s);
    ir::ForEachAccess(map.body, [&](const Access& x) {
      bool still = true;
      for (int d : s.gemm.cols) still = still && Stride(x, d) == 0;
      flat = flat && (still || ColumnsFlat(x, s));
    });
    return only_map && flat;
  }

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
  int NormalizedBy(const space::OpNest& on) const {
    const Op& sm = chain_.ops[on.op];
    if (sm.kind != ir::OpKind::kSoftmax || on.online ||
        chain_.tensors[sm.output].role != TensorRole::kIntermediate) {
      return -1;
    }
    const Access self = ir::ResultAccess(sm);
    int consumer = -1, reads = 0;
    for (size_t o = 0; o < chain_.ops.size(); ++o) {
      ir::ForEachAccess(chain_.ops[o].body, [&](const Access& x) {
        if (x.tensor != sm.output) return;
        ++reads;
        consumer = x.index == self.index ? static_cast<int>(o) : -2;
      });
    }
    if (reads != 1 || consumer < 0) return -1;
    const Op& sum = chain_.ops[consumer];
    const space::OpNest& c = nest_.ops[consumer];
    if (sum.kind != ir::OpKind::kSum || !Product(sum.body) || !Contains(sum.reduce, sm.axis) ||
        c.region != on.region || c.accumulates || c.online_softmax >= 0 || epilogue_[consumer] != nullptr) {
      return -1;
    }
    for (int d : SoftmaxRows(sm)) {
      if (!Contains(sum.index, d)) return -1;
    }
    return consumer;
  }

  // A softmax's rows in one block (its running state's size).
  int64_t RowsPerBlock(const Op& sm) const {
    int64_t rows = 1;
    for (int d : SoftmaxRows(sm)) rows *= x_.IsBlock(d) ? s_.tile[d] : chain_.dims[d].extent;
    return rows;
  }

  void DeclareScratchPointers() {
    for (size_t t = 0; t < chain_.tensors.size(); ++t) {
      if (local_offset_[t] < 0) continue;
      w_.Line(absl::StrCat("float* const ", n_.Local(static_cast<int>(t)), " = scratch + ", local_offset_[t], ";"));
    }
    for (const space::OpNest& on : nest_.ops) {
      const std::string o = Sfx(on.op);
      int64_t at = temp_offset_[on.op];
      auto ptr = [&](const char* name, int64_t floats) {
        if (floats == 0) return;
        // A constant side's points into the prepared buffer when there is one.
        const bool moves = (name == std::string("pa") && ConstantSide(on.op, true) >= 0) ||
                           (name == std::string("pb") && ConstantSide(on.op, false) >= 0);
        w_.Line(absl::StrCat("float* ", moves ? "" : "const ", name, o, " = scratch + ", at, "; (void)", name, o,
                             ";"));
        at += floats;
      };
      ptr("acc", on.acc_floats);
      ptr("pa", on.pack_a_floats);
      ptr("pb", BPackFloats(on));
      ptr("row", on.row_floats);
      ptr("smax", on.state_floats / 3);
      ptr("ssum", on.state_floats / 3);
      ptr("sscale", on.state_floats / 3);
      if (inv_offset_[on.op] >= 0) {
        w_.Line(absl::StrCat("float* const sinv", o, " = scratch + ", inv_offset_[on.op], ";"));
      }
    }
  }

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
  void OpenStreamLoop() override {
    const int sd = nest_.stream_dim;
    if (nest_.split == 1) {
      x_.OpenTileLoop(w_, sd);
      return;
    }
    const int64_t tile = s_.tile[sd], extent = chain_.dims[sd].extent;
    const int64_t per_part = (nest_.trips[sd] + nest_.split - 1) / nest_.split * tile;
    w_.Line(absl::StrCat("const long part_lo = part * ", per_part, "L, part_hi = part_lo + ", per_part, "L < ",
                         extent, "L ? part_lo + ", per_part, "L : ", extent, "L;"));
    w_.Open(absl::StrCat("for (long ", n_.O(sd), " = part_lo; ", n_.O(sd), " < part_hi; ", n_.O(sd), " += ", tile,
                         "L)"));
    w_.Line(absl::StrCat("const long ", n_.N(sd), " = ", x_.RangeOf(sd, n_.O(sd)), ";"));
  }

  void EmitSoftmax(const Op& op, const space::OpNest& on) override {
    if (prep_mode_) return;  // the prepare walk: loops and constant packs only
    if (on.online) {
      EmitOnlineSoftmax(op, on);
    } else {
      EmitPlainSoftmax(op, on);
    }
  }

  // After every block of a split stream loop: each accumulated output is
  // the sum of its parts' partial sums.
  void EmitPartialSums() {
    for (const auto& [o, slot] : partial_slot_) {
      const int t = chain_.ops[o].output;
      const int64_t elements = chain_.tensors[t].NumElements();
      w_.Line(absl::StrCat("// ", chain_.tensors[t].name, ": the sum of the parts"));
      w_.Line("#pragma omp for schedule(static)");
      w_.Open(absl::StrCat("for (long i = 0; i < ", elements, "L; ++i)"));
      w_.Line(absl::StrCat("float s = partials[", slot, "L + i];"));
      w_.Line(absl::StrCat("for (long p = 1; p < ", nest_.split, "L; ++p) s += partials[", slot, "L + p * ", elements,
                           "L + i];"));
      w_.Line(absl::StrCat(n_.Global(t), "[i] = ", StoreConvert(chain_.dtype, "s"), ";"));
      w_.Close();
    }
  }

  // ------------------------------------------------------- pointwise ---

  int64_t ResultStride(const space::OpNest& on, int d) const {
    return Stride(ir::ResultAccess(chain_.ops[on.op]), d);
  }

  // The dim to vectorize a pass over `dims` along: the last one whose
  // destination elements are adjacent, else the last.
  int InnerDim(const std::vector<int>& dims, const std::function<int64_t(int)>& dest_stride) const {
    for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
      if (dest_stride(*it) == 1) return *it;
    }
    return dims.back();
  }

  // Point loops over `dims`, the one over `inner` in vectors (and a
  // masked or scalar tail); `body(vector)` emits one step of lanes that
  // are independent of each other.
  void PointwiseLoops(const std::vector<int>& dims, int inner, const std::function<void(bool)>& body) {
    std::vector<int> outer;
    for (int d : dims) {
      if (d != inner) outer.push_back(d);
    }
    const int opened = OpenPointLoops(w_, outer, n_);
    VectorLoop(w_, n_.I(inner), n_.N(inner), absl::StrCat("const long ", n_.V(inner), " = ", n_.O(inner), " + ",
                                                          n_.I(inner), ";"),
               body, /*masked_tail=*/true);
    CloseScopes(w_, opened);
  }

  // The vector form of NestIndex::Store: writes the fusor_vf `value` to the
  // op's result at the lanes along dim d.
  void StoreVector(const space::OpNest& on, int d, const std::string& value) {
    const Op& op = chain_.ops[on.op];
    const Access self = ir::ResultAccess(op);
    if (HasLocal(op.output)) {
      const Lanes at = AccessLanes(self, d);
      if (on.online_softmax >= 0) {
        const Op& sm = chain_.ops[on.online_softmax];
        Lanes scale;
        scale.ptr = absl::StrCat("&sscale", on.online_softmax, "[", x_.StateOffset(sm), "]");
        scale.stride = x_.StateStride(sm, d);
        w_.Line(VectorStore(at, absl::StrCat(VectorLoad(at), " * ", VectorLoad(scale), " + ", value)));
      } else if (on.accumulates) {
        w_.Line(VectorStore(at, absl::StrCat(VectorLoad(at), " + ", value)));
      } else {
        w_.Line(VectorStore(at, value));
      }
    }
    if (chain_.tensors[op.output].role == TensorRole::kOutput && !on.accumulates) {
      Lanes out;
      out.ptr = absl::StrCat("&", n_.Global(op.output), "[", GlobalOffset(self, n_), "]");
      out.dtype = chain_.dtype;
      int64_t constant = 0;
      std::map<int, int64_t> strides = GlobalStrides(self, chain_, &constant);
      out.stride = strides.count(d) ? strides.at(d) : 0;
      w_.Line(VectorStore(out, value));
    }
  }

  void EmitMap(const Op& op, const space::OpNest& on) override {
    if (prep_mode_) return;  // the prepare walk: loops and constant packs only
    if (Folded(on)) {
      w_.Line("// applied by the micro-kernels above, to each register tile as its sum completes");
      return;
    }
    auto load = [this](const Access& a) { return x_.Load(a); };
    const int inner = InnerDim(op.index, [&](int d) { return ResultStride(on, d); });
    PointwiseLoops(op.index, inner, [&](bool vector) {
      if (vector) {
        w_.Line(absl::StrCat("const fusor_vf value = ", VectorExpr(op.body, LanesAlong(inner)), ";"));
        StoreVector(on, inner, "value");
      } else {
        x_.Store(w_, on, ExprToC(op.body, load));
      }
    });
  }

  // ------------------------------------------------------------ sums ---

  struct GemmNames {
    std::string rows, cols, kc, nbatch, rows_pad, cols_pad, mr, nr;
  };

  // `packed_outside`: the names a side packed before the stream loop was
  // laid out with (a causal axis over its full extent there, bounded in
  // the loop).
  GemmNames Gemm(const space::OpNest& on, bool packed_outside = false) const {
    const hw::MicroKernel& k = on.kernel;
    auto count = [&](const std::vector<int>& dims) {
      std::vector<std::string> factors;
      for (int d : dims) {
        const bool full = packed_outside && x_.Bounded(d, &on) && !x_.Bounded(d, &on, /*in_stream=*/false);
        factors.push_back(full ? absl::StrCat(chain_.dims[d].extent, "L") : n_.N(d));
      }
      return factors.empty() ? std::string("1L") : absl::StrCat("(", absl::StrJoin(factors, " * "), ")");
    };
    GemmNames g;
    g.mr = absl::StrCat(k.mr, "L");
    g.nr = absl::StrCat(k.nr, "L");
    g.rows = count(on.gemm.rows);
    g.cols = count(on.gemm.cols);
    g.kc = count(on.gemm.kdims);
    g.nbatch = count(on.gemm.batch);
    g.rows_pad = absl::StrCat("((", g.rows, " + ", k.mr - 1, "L) / ", g.mr, " * ", g.mr, ")");
    g.cols_pad = absl::StrCat("((", g.cols, " + ", k.nr - 1, "L) / ", g.nr, " * ", g.nr, ")");
    return g;
  }

  // The micro-kernel of op `on`: C[MR x nr] (=, or += unless FIRST) the
  // product of A[MR x kc] and the packed B panel [kc][nr] (rows of a
  // window's ld apart), C held in registers over the whole kc. A row r,
  // step p is at a[r * row_stride + p * k_stride]; constants are compiled
  // in where the nest knows them. With a column tail, C's first nc columns
  // are read and written (nc < nr in a tile's last panel).
  std::string MicroKernel(const space::OpNest& on) const {
    const hw::MicroKernel& k = on.kernel;
    const int vecs = k.nr / k.lanes;
    const std::string vt = absl::StrCat("fusor_v", k.lanes);
    const ASide& a = a_[on.op];
    const std::optional<int64_t> kc = ConstCount(on.gemm.kdims, on);
    std::string splat = "{av";
    for (int l = 1; l < k.lanes; ++l) splat += ", av";
    splat += "}";
    const bool epilogue = epilogue_[on.op] != nullptr, tail = c_tail_[on.op], fold = points_[on.op];
    const std::string ap = fold ? "ap" : "a", bp = fold ? "bp" : "b";
    Writer w;
    const Window& win = window_[on.op];
    w.Line(absl::StrCat("// ", chain_.tensors[chain_.ops[on.op].output].name, ": ", k.name, ", A ",
                        a.direct ? "read in place" : "packed",
                        win.dim >= 0 ? ", B a window" : b_direct_[on.op] > 0 ? ", B read in place" : ", B packed",
                        ", C in registers",
                        epilogue ? "; when LAST, epi(row, column, tile) writes the finished tile" : ""));
    w.Line(epilogue ? "template <int MR, bool FIRST, bool LAST, class EPI>" : "template <int MR, bool FIRST>");
    w.Open(absl::StrCat("static inline void fusor_mk", on.op,
                        "(const float* __restrict a, const float* __restrict b, float* __restrict c, long ldc, "
                        "long kc", tail ? ", long nc" : "",
                        fold ? ", const long* __restrict aoff, const long* __restrict boff" : "",
                        epilogue ? ", const EPI& epi)" : ")"));
    if (kc) w.Line("(void)kc;");
    w.Line(absl::StrCat(vt, " acc[MR][", vecs, "];"));
    w.Line("#pragma GCC unroll 16");
    w.Open("for (int r = 0; r < MR; ++r)");
    w.Line("#pragma GCC unroll 16");
    const std::string load = absl::StrCat("*(const ", vt, "*)(c + r * ldc + v * ", k.lanes, ")");
    if (tail) {
      w.Open(absl::StrCat("for (int v = 0; v < ", vecs, "; ++v)"));
      w.Line(absl::StrCat("const long nl = nc - v * ", k.lanes, ";"));
      w.Line(absl::StrCat("if (FIRST || nl < ", k.lanes, ") acc[r][v] = ", vt, "{};"));
      w.Line(absl::StrCat("if (!FIRST && nl >= ", k.lanes, ") acc[r][v] = ", load, ";"));
      w.Line(absl::StrCat("else if (!FIRST && nl > 0) for (long l = 0; l < nl; ++l) acc[r][v][l] = c[r * ldc + v * ",
                          k.lanes, " + l];"));
      w.Close();
    } else {
      w.Line(absl::StrCat("for (int v = 0; v < ", vecs, "; ++v) acc[r][v] = FIRST ? ", vt, "{} : ", load, ";"));
    }
    w.Close();
    if (fold) {
      w.Open(absl::StrCat("for (int pt = 0; pt < ", *ConstCount(on.gemm.outer_reduce, on), "; ++pt)"));
      w.Line("const float* const ap = a + aoff[pt];");
      w.Line("const float* const bp = b + boff[pt];");
    }
    w.Line("#pragma GCC unroll 4");
    w.Open(absl::StrCat("for (long p = 0; p < ", kc ? absl::StrCat(*kc, "L") : "kc", "; ++p)"));
    w.Line(absl::StrCat(vt, " bv[", vecs, "];"));
    w.Line("#pragma GCC unroll 16");
    w.Line(absl::StrCat("for (int v = 0; v < ", vecs, "; ++v) bv[v] = *(const ", vt, "*)(", bp, " + p * ",
                        win.dim >= 0 ? win.ld : b_direct_[on.op] > 0 ? b_direct_[on.op] : k.nr, " + v * ", k.lanes,
                        ");"));
    w.Line("#pragma GCC unroll 16");
    w.Open("for (int r = 0; r < MR; ++r)");
    w.Line(absl::StrCat("const float av = ", ap, "[r * ", a.row_stride, "L + p * ", a.k_stride, "L];"));
    w.Line(absl::StrCat("const ", vt, " ar = ", splat, ";"));
    w.Line("#pragma GCC unroll 16");
    w.Line(absl::StrCat("for (int v = 0; v < ", vecs, "; ++v) acc[r][v] += ar * bv[v];"));
    w.Close();
    w.Close();
    if (fold) w.Close();
    w.Line("#pragma GCC unroll 16");
    w.Open("for (int r = 0; r < MR; ++r)");
    w.Line("#pragma GCC unroll 16");
    const std::string store =
        absl::StrCat("*(", vt, "*)(c + r * ldc + v * ", k.lanes, ") = acc[r][v];");
    if (tail) {
      w.Open(absl::StrCat("for (int v = 0; v < ", vecs, "; ++v)"));
      w.Line(absl::StrCat("const long nl = nc - v * ", k.lanes, " < ", k.lanes, " ? nc - v * ", k.lanes, " : ",
                          k.lanes, ";"));
      w.Line("if (nl <= 0) break;");
      if (epilogue) w.Line(absl::StrCat("if (LAST) epi(r, v * ", k.lanes, ", acc[r][v], nl);"));
      w.Line(absl::StrCat(epilogue ? "else if" : "if", " (nl == ", k.lanes, ") ", store));
      w.Line(absl::StrCat("else for (long l = 0; l < nl; ++l) c[r * ldc + v * ", k.lanes, " + l] = acc[r][v][l];"));
      w.Close();
    } else if (epilogue) {
      w.Open(absl::StrCat("for (int v = 0; v < ", vecs, "; ++v)"));
      w.Line(absl::StrCat("if (LAST) epi(r, v * ", k.lanes, ", acc[r][v]);"));
      w.Line(absl::StrCat("else ", store));
      w.Close();
    } else {
      w.Line(absl::StrCat("for (int v = 0; v < ", vecs, "; ++v) ", store));
    }
    w.Close();
    w.Close();
    return w.Take();
  }

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
  void Pack(const space::OpNest& on, bool a_side) override {
    const space::GemmForm& g = on.gemm;
    const GemmNames names = Gemm(on);
    PackSide side;
    side.a_side = a_side;
    side.own = a_side ? g.rows : g.cols;
    side.factors = a_side ? g.a_side : g.b_side;
    // The scale goes with A unless A is read in place.
    side.scale = a_side != a_[on.op].direct ? g.scale : 1;
    side.width = a_side ? on.kernel.mr : on.kernel.nr;
    side.buf = (a_side ? "pa" : "pb") + Sfx(on.op);
    auto load = [this](const Access& a) { return x_.Load(a); };
    const int c = ConstantSide(on.op, a_side);
    if (prep_mode_) {
      // Into this visit's slot of the prepared buffer, where this block is
      // the first of its key to pack it.
      if (c < 0) return;
      w_.Line(absl::StrCat("// prepare: pack ", a_side ? "A" : "B", " side (constant)"));
      w_.Open("");
      w_.Line(absl::StrCat("const long visit = fusor_visits[", c, "]++;"));
      w_.Line(absl::StrCat("float* const ", side.buf, " = fusor_dst[", c, "] ? fusor_dst[", c, "] + visit * ",
                           constant_[c].floats, "L : 0;"));
      w_.Open(absl::StrCat("if (", side.buf, ")"));
    } else if (c >= 0) {
      w_.Line(absl::StrCat("// pack ", a_side ? "A" : "B", " side: constant, packed once by fusor_prepare"));
      w_.Open("if (fusor_prep)");
      w_.Line(absl::StrCat(side.buf, " = fusor_prep->base[", c, "][blk] + fusor_visit[", c, "]++ * ",
                           constant_[c].floats, "L;"));
      w_.Close();
      w_.Line("else");
    } else if (a_side || window_[on.op].dim < 0) {
      w_.Line(absl::StrCat("// pack ", a_side ? "A" : "B", " side"));
    }
    side.value = ProductToC(side.factors, side.scale, load);
    // With the points in the micro-kernel, B has a slot for each point.
    const bool slotted = !a_side && c < 0 && points_[on.op] && on.b_per_point;
    if (slotted) {
      w_.Open("");
      w_.Line(absl::StrCat("float* const ", side.buf, "s = ", side.buf, " + (", FlatIndex(PackPoints(on), n_), ") * ",
                           BSlotFloats(on), "L;"));
      side.buf += "s";
    }
    if (!a_side && window_[on.op].dim >= 0) {
      PackWindow(on, side);
    } else {
      w_.Open("");
      w_.Line(absl::StrCat("const long own = ", a_side ? names.rows : names.cols, ", own_pad = ",
                           a_side ? names.rows_pad : names.cols_pad, ", kc = ", names.kc, ";"));
      const int opened = OpenPointLoops(w_, g.batch, n_);
      w_.Line(absl::StrCat("const long bi = ", FlatIndex(g.batch, n_), ";"));
      if (side.own.size() == 1) {
        PackPanels(on, side);
      } else {
        PackSeveralDims(on, side);
      }
      CloseScopes(w_, opened);
      w_.Close();
    }
    if (slotted) w_.Close();
    if (prep_mode_) {
      w_.Close();
      w_.Close();
    }
  }

  // Columns per row of a window's p: the later column dims' ranges.
  std::string WindowShift(const space::OpNest& on) const {
    const std::vector<int>& cols = on.gemm.cols;
    const auto p = std::find(cols.begin(), cols.end(), window_[on.op].row);
    return Count(std::vector<int>(p + 1, cols.end()), n_);
  }

  // B's window (see Window), before the loop over its dim r: every k row
  // holds p's range plus r's less one rows of the later column dims, and
  // zeros to ld.
  void PackWindow(const space::OpNest& on, const PackSide& side) {
    const space::GemmForm& g = on.gemm;
    const Window& win = window_[on.op];
    const int r = win.dim, p = win.row;
    const auto at = std::find(g.cols.begin(), g.cols.end(), p);
    const std::vector<int> before(g.cols.begin(), at), after(at + 1, g.cols.end());
    w_.Line(absl::StrCat("// pack B side once for every ", chain_.dims[r].name, ": its point ", chain_.dims[r].name,
                         " reads the window ", chain_.dims[r].name, " rows of ", chain_.dims[p].name, " on"));
    w_.Open("");
    w_.Line(absl::StrCat("const long kc = ", Gemm(on).kc, ", shift = ", WindowShift(on), ";"));
    w_.Line(absl::StrCat("const long ", n_.I(r), " = 0, ", n_.V(r), " = ", n_.O(r), ";"));
    int opened = OpenPointLoops(w_, g.batch, n_);
    w_.Line(absl::StrCat("const long bi = ", FlatIndex(g.batch, n_), ";"));
    opened += OpenPointLoops(w_, g.kdims, n_);
    w_.Line(absl::StrCat("float* const dst = ", side.buf, " + (bi * kc + (", FlatIndex(g.kdims, n_), ")) * ", win.ld,
                         "L;"));
    opened += OpenPointLoops(w_, before, n_);
    w_.Line(absl::StrCat("const long rows = ", n_.N(p), " + ", n_.N(r), " - 1;"));
    w_.Open(absl::StrCat("for (long ", n_.I(p), " = 0; ", n_.I(p), " < rows; ++", n_.I(p), ")"));
    w_.Line(absl::StrCat("const long ", n_.V(p), " = ", n_.O(p), " + ", n_.I(p), ";"));
    w_.Line(absl::StrCat("float* const run = dst + ", n_.I(p), " * shift;"));
    const bool adjacent = after.size() == 1 && Stride(side.factors[0], after[0]) == 1;
    if (adjacent) {
      const int q = after[0];
      CopyRun(side, q, n_.I(q), n_.N(q), absl::StrCat("const long ", n_.V(q), " = ", n_.O(q), " + ", n_.I(q), ";"),
              "run");
    } else {
      const int inner = OpenPointLoops(w_, after, n_);
      w_.Line(absl::StrCat("run[", after.empty() ? std::string("0") : FlatIndex(after, n_), "] = ", side.value, ";"));
      CloseScopes(w_, inner);
    }
    w_.Close();
    w_.Line(absl::StrCat("for (long x = rows * shift; x < ", win.ld, "L; ++x) dst[x] = 0.0f;"));
    CloseScopes(w_, opened);
    w_.Close();
  }

  // The product of the side's factors (scaled) at the lanes along dim d,
  // a fusor_vf.
  std::string VectorProduct(const PackSide& side, int d) {
    std::vector<std::string> parts;
    for (const Access& a : side.factors) parts.push_back(VectorLoad(AccessLanes(a, d)));
    std::string v = absl::StrJoin(parts, " * ");
    if (side.scale != 1) absl::StrAppend(&v, " * ", emit::FloatLit(side.scale));
    return v;
  }

  // Writes the side's values along dim d to dst[var] for var in [0, count),
  // in vectors, the last one under a lane mask; `define` defines d's
  // indices from var.
  void CopyRun(const PackSide& side, int d, const std::string& var, const std::string& count,
               const std::string& define, const std::string& dst) {
    VectorLoop(
        w_, var, count, define,
        [&](bool vector) {
          if (vector) {
            w_.Line(absl::StrCat("fusor_vstore(", dst, " + ", var, ", ", VectorProduct(side, d), ");"));
          } else {
            w_.Line(absl::StrCat(dst, "[", var, "] = ", side.value, ";"));
          }
        },
        /*masked_tail=*/true);
  }

  // Opens the loop over the tile's panels of `own` (one dim, d) and defines
  // the current one's columns (cn) and start (panel).
  void OpenPanel(const PackSide& side) {
    w_.Open(absl::StrCat("for (long c0 = 0; c0 < own; c0 += ", side.width, "L)"));
    w_.Line(absl::StrCat("const long cn = own - c0 < ", side.width, "L ? own - c0 : ", side.width, "L;"));
    w_.Line(absl::StrCat("float* const panel = ", side.buf, " + (bi * (own_pad / ", side.width, "L) + c0 / ",
                         side.width, "L) * kc * ", side.width, "L;"));
  }

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
  void PackPanels(const space::OpNest& on, const PackSide& side) {
    const space::GemmForm& g = on.gemm;
    const int d = side.own[0];
    bool own_adjacent = false, k_adjacent = g.kdims.size() == 1;
    for (const Access& a : side.factors) {
      own_adjacent = own_adjacent || Stride(a, d) == 1;
      if (g.kdims.size() == 1) k_adjacent = k_adjacent && Stride(a, g.kdims[0]) == 1;
    }
    const bool by_k = k_adjacent && !own_adjacent;
    const bool may_pad = !side.a_side && (!ConstRange(d, on) || *ConstRange(d, on) % side.width != 0);
    if (by_k && side.factors.size() == 1) {
      PackTransposed(on, side, may_pad);
    } else if (by_k) {
      OpenPanel(side);
      w_.Open("for (long j = 0; j < cn; ++j)");
      w_.Line(DefineOwn(d));
      int inner = OpenPointLoops(w_, g.kdims, n_);
      w_.Line(absl::StrCat("panel[(", FlatIndex(g.kdims, n_), ") * ", side.width, "L + j] = ", side.value, ";"));
      CloseScopes(w_, inner);
      w_.Close();
      if (may_pad) PadColumns(side);
      w_.Close();
    } else {
      PackRowByRow(on, side, may_pad);
    }
  }

  // One factor, k adjacent: transposed in registers (converted from f16 or
  // bf16 on the way).
  void PackTransposed(const space::OpNest& on, const PackSide& side, bool may_pad) {
    const int d = side.own[0], k = on.gemm.kdims[0];
    const Lanes src = AccessLanes(side.factors[0], d);
    const char* fn = src.dtype == ir::DType::kF16    ? "fusor_pack_transposed_f16"
                     : src.dtype == ir::DType::kBF16 ? "fusor_pack_transposed_bf16"
                                                     : "fusor_pack_transposed";
    OpenPanel(side);
    w_.Open("");
    w_.Line(absl::StrCat("const long ", n_.I(d), " = c0, ", n_.V(d), " = ", n_.O(d), " + ", n_.I(d), ";"));
    w_.Line(absl::StrCat("const long ", n_.V(k), " = ", n_.O(k), ";"));
    w_.Line(absl::StrCat(fn, "(", src.ptr, ", ", src.stride, "L, panel, ", side.width, "L, cn, kc, ",
                         emit::FloatLit(side.scale), ");"));
    w_.Close();
    if (may_pad) PadColumns(side);
    w_.Close();
  }

  // Columns adjacent: each step of k copies its row of the tile front to
  // back, a piece into every panel (rows read in one sweep).
  void PackRowByRow(const space::OpNest& on, const PackSide& side, bool may_pad) {
    const space::GemmForm& g = on.gemm;
    const int d = side.own[0];
    int inner = OpenPointLoops(w_, g.kdims, n_);
    w_.Line(absl::StrCat("const long p = ", FlatIndex(g.kdims, n_), ";"));
    if (g.kdims.size() == 1) PrefetchRowsAhead(side, d, g.kdims[0]);
    OpenPanel(side);
    w_.Line(absl::StrCat("float* const dst = panel + p * ", side.width, "L;"));
    VectorLoop(w_, "j", "cn", DefineOwn(d), [&](bool vector) {
      if (vector) {
        w_.Line(absl::StrCat("fusor_vstore(dst + j, ", VectorProduct(side, d), ");"));
      } else {
        w_.Line(absl::StrCat("dst[j] = ", side.value, ";"));
      }
    });
    if (may_pad) w_.Line(absl::StrCat("for (long j = cn; j < ", side.width, "L; ++j) dst[j] = 0.0f;"));
    w_.Close();
    CloseScopes(w_, inner);
  }

  // Rows of the source are apart (a weight matrix's rows, say): the
  // hardware prefetcher does not cross into the next row's page, so the
  // rows a few steps of k ahead are asked for now.
  void PrefetchRowsAhead(const PackSide& side, int d, int k) {
    for (const Access& a : side.factors) {
      const int64_t row = Stride(a, k);
      if (row * (HasLocal(a.tensor) ? 4 : ir::DTypeBytes(chain_.dtype)) < 4096) continue;
      w_.Open("");
      w_.Line(absl::StrCat("const long ", n_.I(d), " = 0, ", n_.V(d), " = ", n_.O(d), ";"));
      w_.Line(absl::StrCat("const char* const ahead = (const char*)(", AccessLanes(a, d).ptr, " + ", 4 * row,
                           "L);"));
      w_.Line(absl::StrCat("for (long b = 0; b < own * ", HasLocal(a.tensor) ? 4 : ir::DTypeBytes(chain_.dtype),
                           "L; b += 64) __builtin_prefetch(ahead + b, 0, 1);"));
      w_.Close();
    }
  }

  // Several dims on the panel's axis (a convolution's p.q): a run of the
  // last one is adjacent in the panel unless it crosses into the next, and
  // copies as vectors where the source is adjacent too. No dim (a GEMV's
  // degenerate axis): one row of one element.
  void PackSeveralDims(const space::OpNest& on, const PackSide& side) {
    const space::GemmForm& g = on.gemm;
    const int width = side.width;
    const int k_loops = OpenPointLoops(w_, g.kdims, n_);
    w_.Line(absl::StrCat("float* const dst = ", side.buf, " + (bi * (own_pad / ", width, "L) * kc + (",
                         FlatIndex(g.kdims, n_), ")) * ", width, "L;"));
    if (side.own.empty()) {
      w_.Line(absl::StrCat("dst[0] = ", side.value, ";"));
      if (!side.a_side) w_.Line(absl::StrCat("for (long x = 1; x < ", width, "L; ++x) dst[x] = 0.0f;"));
      CloseScopes(w_, k_loops);
      return;
    }
    const int last = side.own.back();
    bool run_adjacent = false;
    for (const Access& a : side.factors) run_adjacent = run_adjacent || Stride(a, last) == 1;
    const std::vector<int> outer_own(side.own.begin(), side.own.end() - 1);
    int inner = OpenPointLoops(w_, outer_own, n_);
    w_.Line(absl::StrCat("const long x0 = (", FlatIndex(outer_own, n_), ") * ", n_.N(last), ";"));
    w_.Line(absl::StrCat("float* const run = dst + (x0 / ", width, "L) * kc * ", width, "L + x0 % ", width, "L;"));
    const std::string define_last = absl::StrCat("const long ", n_.V(last), " = ", n_.O(last), " + ", n_.I(last), ";");
    if (run_adjacent) {
      w_.Open(absl::StrCat("if (x0 % ", width, "L + ", n_.N(last), " <= ", width, "L)"));
      CopyRun(side, last, n_.I(last), n_.N(last), define_last, "run");
      w_.Close();
      // A run crossing panels: a piece into each.
      w_.Open("else");
      w_.Open(absl::StrCat("for (long i0 = 0; i0 < ", n_.N(last), ";)"));
      w_.Line(absl::StrCat("const long x = x0 + i0, left = ", width, "L - x % ", width, "L, piece = left < ",
                           n_.N(last), " - i0 ? left : ", n_.N(last), " - i0;"));
      w_.Line(absl::StrCat("float* const out = dst + (x / ", width, "L) * kc * ", width, "L + x % ", width, "L;"));
      CopyRun(side, last, "j", "piece",
              absl::StrCat("const long ", n_.I(last), " = i0 + j, ", n_.V(last), " = ", n_.O(last), " + ", n_.I(last),
                           ";"),
              "out");
      w_.Line("i0 += piece;");
      w_.Close();
      w_.Close();
    } else {
      w_.Open(absl::StrCat("for (long ", n_.I(last), " = 0; ", n_.I(last), " < ", n_.N(last), "; ++", n_.I(last),
                           ")"));
      w_.Line(define_last);
      w_.Line(absl::StrCat("const long x = x0 + ", n_.I(last), ";"));
      w_.Line(absl::StrCat("dst[(x / ", width, "L) * kc * ", width, "L + x % ", width, "L] = ", side.value, ";"));
      w_.Close();
    }
    CloseScopes(w_, inner);
    if (!side.a_side) {
      w_.Line(absl::StrCat("for (long x = own; x < own_pad; ++x) dst[(x / ", width, "L) * kc * ", width,
                           "L + x % ", width, "L] = 0.0f;"));
    }
    CloseScopes(w_, k_loops);
  }

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
  void EmitEpilogue(const space::OpNest& on) {
    const Op& sum = chain_.ops[on.op];
    const space::OpNest& map_nest = *epilogue_[on.op];
    const Op& map = chain_.ops[map_nest.op];
    const std::vector<int>& cols = on.gemm.cols;
    const int row = RowDim(on), col = cols.back(), lanes = on.kernel.lanes;
    const bool tail = c_tail_[on.op];
    auto define = [&](int d, const std::string& at) {
      w_.Line(absl::StrCat("const long ", n_.I(d), " = ", at, ", ", n_.V(d), " = ", n_.O(d), " + ", n_.I(d), ";"));
    };
    // The column dims at flattened column `at`.
    auto define_cols = [&](const std::string& at) {
      if (cols.size() == 1) return define(col, at);
      w_.Line(absl::StrCat("long flat = ", at, ";"));
      for (size_t j = cols.size(); j-- > 1;) {
        define(cols[j], absl::StrCat("flat % ", n_.N(cols[j])));
        w_.Line(absl::StrCat("flat /= ", n_.N(cols[j]), ";"));
      }
      define(cols[0], "flat");
    };
    w_.Open(absl::StrCat("auto epi = [&](long rr, long cc, fusor_v", lanes, " h", tail ? ", long nl)" : ")"));
    for (int d : on.gemm.rows) define(d, d == row ? "r + rr" : "0");
    w_.Line(absl::StrCat("#if FUSOR_VL == ", lanes));
    if (tail) w_.Open(absl::StrCat("if (nl == ", lanes, ")"));
    define_cols("c + cc");
    w_.Line(absl::StrCat("const fusor_vf value = ", VectorExpr(map.body, [&](const Access& x) {
                           Lanes l = AccessLanes(x, col);
                           if (x.tensor == sum.output) l.value = "h";
                           return l;
                         }), ";"));
    StoreVector(map_nest, col, "value");
    if (tail) {
      w_.Line("return;");
      w_.Close();
    }
    w_.Line(tail ? "#endif" : "#else");
    w_.Open(absl::StrCat("for (int l = 0; l < ", tail ? "nl" : absl::StrCat(lanes), "; ++l)"));
    define_cols("c + cc + l");
    x_.Store(w_, map_nest, ExprToC(map.body, [&](const Access& x) {
               return x.tensor == sum.output ? std::string("h[l]") : x_.Load(x);
             }));
    w_.Close();
    if (!tail) w_.Line("#endif");
    w_.Close(";");
  }

  // Declares `name`, the address of access `a`'s element with the `origin`
  // dims at their ranges' starts (a tile's first row, column or k).
  void DefineAtOrigin(const std::string& type, const std::string& name, const std::vector<int>& origin,
                      const Access& a, int lanes_dim) {
    w_.Line(absl::StrCat(type, " ", name, ";"));
    w_.Open("");
    for (int d : origin) w_.Line(absl::StrCat("const long ", n_.V(d), " = ", n_.O(d), ";"));
    w_.Line(absl::StrCat(name, " = ", AccessLanes(a, lanes_dim).ptr, ";"));
    w_.Close();
  }

  // Where each point of the unmapped reduced dims reads A and B, from the
  // tile's first: aoff[pt] and boff[pt] (B's slot and window row).
  void EmitPointOffsets(const space::OpNest& on) {
    const space::GemmForm& g = on.gemm;
    const Window& win = window_[on.op];
    const int64_t points = *ConstCount(g.outer_reduce, on);
    w_.Line(absl::StrCat("long aoff[", points, "], boff[", points, "];"));
    w_.Open("");
    w_.Line("long pt = 0;");
    const int opened = OpenPointLoops(w_, g.outer_reduce, n_);
    std::vector<std::string> a_terms = {"0"}, b_terms = {"0"};
    if (a_[on.op].direct) {
      for (int d : g.outer_reduce) {
        const int64_t st = Stride(g.a_side[0], d);
        if (st != 0) a_terms.push_back(absl::StrCat(n_.I(d), " * ", st, "L"));
      }
    }
    if (on.b_per_point) {
      b_terms.push_back(absl::StrCat("(", FlatIndex(PackPoints(on), n_), ") * ", BSlotFloats(on), "L"));
      if (win.dim >= 0) b_terms.push_back(absl::StrCat(n_.I(win.dim), " * (", WindowShift(on), ")"));
    }
    w_.Line(absl::StrCat("aoff[pt] = ", absl::StrJoin(a_terms, " + "), ";"));
    w_.Line(absl::StrCat("boff[pt] = ", absl::StrJoin(b_terms, " + "), ";"));
    w_.Line("++pt;");
    CloseScopes(w_, opened);
    w_.Close();
  }

  // The micro-kernel over the whole tile: every batch point, row strip and
  // column panel. `first`: a C bool, whether this is the first of the
  // partial sums the accumulator receives; `last`, whether the last (the
  // micro-kernels then apply the folded epilogue, if any).
  void EmitTileProduct(const space::OpNest& on, const std::string& first, const std::string& last) {
    const space::GemmForm& g = on.gemm;
    const GemmNames names = Gemm(on);
    const ASide& a = a_[on.op];
    const int mr = on.kernel.mr, nr = on.kernel.nr;
    const std::string o = Sfx(on.op);
    w_.Open("");
    w_.Line(absl::StrCat("const long rows = ", names.rows, ", rows_pad = ", names.rows_pad, ", cols_pad = ",
                         names.cols_pad, ", kc = ", names.kc, ";"));
    if (c_tail_[on.op]) w_.Line(absl::StrCat("const long cols = ", names.cols, ";"));
    // A side packed before the stream loop keeps the layout it was packed
    // in: over a causal axis's full extent, which the loop bounds.
    const GemmNames outside = Gemm(on, /*packed_outside=*/true);
    std::string a_kc = "kc", a_pad = "rows_pad", b_kc = "kc", b_pad = "cols_pad";
    if (on.a_hoisted && !a.direct && (outside.kc != names.kc || outside.rows_pad != names.rows_pad)) {
      w_.Line(absl::StrCat("const long kc_a = ", outside.kc, ", rows_pad_a = ", outside.rows_pad, ";"));
      a_kc = "kc_a", a_pad = "rows_pad_a";
    }
    if (on.b_hoisted && b_direct_[on.op] == 0 && window_[on.op].dim < 0 &&
        (outside.kc != names.kc || outside.cols_pad != names.cols_pad)) {
      w_.Line(absl::StrCat("const long kc_b = ", outside.kc, ", cols_pad_b = ", outside.cols_pad, ";"));
      b_kc = "kc_b", b_pad = "cols_pad_b";
    }
    if (points_[on.op]) EmitPointOffsets(on);
    int opened = OpenPointLoops(w_, g.batch, n_);
    w_.Line(absl::StrCat("const long bi = ", FlatIndex(g.batch, n_), ";"));
    if (a.direct) {
      // A's element at the tile's first row and k (and first point).
      std::vector<int> origin = g.rows;
      origin.push_back(g.kdims[0]);
      if (points_[on.op]) origin.insert(origin.end(), g.outer_reduce.begin(), g.outer_reduce.end());
      DefineAtOrigin("const float*", "a0", origin, g.a_side[0], RowDim(on));
    } else {
      w_.Line(absl::StrCat("const float* const a0 = pa", o, " + bi * ", a_pad, " * ", a_kc, ";"));
    }
    const Window& win = window_[on.op];
    if (win.dim >= 0) {
      w_.Line(absl::StrCat("const float* const b0 = pb", o, " + bi * kc * ", win.ld, "L",
                           points_[on.op] ? "" : absl::StrCat(" + ", n_.I(win.dim), " * (", WindowShift(on), ")"),
                           ";"));
    } else if (b_direct_[on.op] > 0) {
      // B's element at the tile's first column and k.
      std::vector<int> origin = g.cols;
      origin.push_back(g.kdims[0]);
      DefineAtOrigin("const float*", "b0", origin, g.b_side[0], g.cols.back());
    } else {
      w_.Line(absl::StrCat("const float* const b0 = pb", o, " + bi * ", b_pad, " * ", b_kc, ";"));
    }
    const int64_t c_stride = direct_c_[on.op];
    if (c_stride > 0) {
      // The result's element at the tile's first row and column.
      std::vector<int> origin = g.cols;
      origin.insert(origin.end(), g.rows.begin(), g.rows.end());
      DefineAtOrigin("float*", "c0", origin, ir::ResultAccess(chain_.ops[on.op]), g.cols.back());
    } else {
      w_.Line(absl::StrCat("float* const c0 = acc", o, " + bi * rows_pad * cols_pad;"));
    }
    const std::string ldc = c_stride > 0 ? absl::StrCat(c_stride, "L") : "cols_pad";
    // Row strip r starts at a0 + r * (row stride); packed A holds strips of
    // mr rows, kc * mr floats each.
    const std::string a_at = a.direct ? absl::StrCat("a0 + r * ", a.row_stride, "L") : "a0 + r * " + a_kc;
    const bool epilogue = epilogue_[on.op] != nullptr;
    auto calls = [&](const std::string& mr_value) {
      w_.Open(absl::StrCat("for (long c = 0; c < cols_pad; c += ", nr, "L)"));
      if (epilogue) EmitEpilogue(on);
      const std::string args = absl::StrCat(
          "(", a_at, win.dim >= 0 || b_direct_[on.op] > 0 ? ", b0 + c, c0 + r * " : ", b0 + c * " + b_kc + ", c0 + r * ", ldc,
          " + c, ", ldc, ", kc",
          c_tail_[on.op] ? absl::StrCat(", cols - c < ", nr, "L ? cols - c : ", nr, "L") : "",
          points_[on.op] ? ", aoff, boff" : "", epilogue ? ", epi);" : ");");
      // One call per variant, each under the conditions that pick it.
      std::vector<std::pair<std::string, std::string>> variants;
      for (const auto& [f, f_when] : Variants(first)) {
        for (const auto& [l, l_when] : epilogue ? Variants(last) : Variants("true")) {
          std::vector<std::string> when;
          for (const std::string& c : {f_when, l_when}) {
            if (!c.empty()) when.push_back(c);
          }
          variants.push_back({absl::StrCat("fusor_mk", o, "<", mr_value, ", ", f, epilogue ? ", " + l : "", ">", args),
                              absl::StrJoin(when, " && ")});
        }
      }
      for (size_t i = 0; i < variants.size(); ++i) {
        const std::string call = variants[i].first;
        if (variants.size() == 1) {
          w_.Line(call);
        } else if (i == 0) {
          w_.Line(absl::StrCat("if (", variants[i].second, ") ", call));
        } else if (i + 1 < variants.size()) {
          w_.Line(absl::StrCat("else if (", variants[i].second, ") ", call));
        } else {
          w_.Line(absl::StrCat("else ", call));
        }
      }
      w_.Close();
    };
    w_.Line("long r = 0;");
    w_.Open(absl::StrCat("for (; r + ", mr, "L <= rows; r += ", mr, "L)"));
    calls(absl::StrCat(mr));
    w_.Close();
    // The last rows: a micro-kernel of exactly that many.
    const std::optional<int64_t> rows = ConstCount(g.rows, on);
    if (rows) {
      if (*rows % mr != 0) calls(absl::StrCat(*rows % mr));
    } else if (mr > 1) {
      w_.Open("switch (rows - r)");
      for (int m = 1; m < mr; ++m) {
        w_.Open(absl::StrCat("case ", m, ":"));
        calls(absl::StrCat(m));
        w_.Line("break;");
        w_.Close();
      }
      w_.Line("default: break;");
      w_.Close();
    }
    CloseScopes(w_, opened);
    w_.Close();
  }

  // Packs sit just inside the own loops they depend on; a generic sum's
  // accumulator is cleared inside its output loops.
  void StageAtLevel(const space::OpNest& on, int level) override {
    if (!on.gemm.ok) {
      if (prep_mode_) return;
      if (level == on.num_out_loops) {
        w_.Line(absl::StrCat("memset(acc", Sfx(on.op), ", 0, sizeof(float) * ", Count(chain_.ops[on.op].index, n_),
                             ");"));
      }
      return;
    }
    if (StagedAtLevel(on, true, level)) Pack(on, true);
    if (StagedAtLevel(on, false, level)) Pack(on, false);
  }

  // The micro-kernels over the whole tile. The first partial sum of a tile
  // is stored, later ones added.
  void TileProduct(const space::OpNest& on) override {
    if (prep_mode_) return;  // the prepare walk: loops and constant packs only
    // The first and the last partial sum of the tile: its reduced own loops'
    // first and last trips, and the first and last points of the reduced
    // dims outside the micro-kernel.
    std::vector<std::string> firsts, lasts;
    for (size_t i = on.num_out_loops; i < on.loops.size(); ++i) {
      const int d = on.loops[i];
      firsts.push_back(absl::StrCat(n_.O(d), " == 0"));
      lasts.push_back(absl::StrCat(n_.O(d), " + ", n_.N(d), " >= ", chain_.dims[d].extent, "L"));
    }
    for (int d : points_[on.op] ? std::vector<int>{} : on.gemm.outer_reduce) {
      firsts.push_back(absl::StrCat(n_.I(d), " == 0"));
      lasts.push_back(absl::StrCat(n_.I(d), " + 1 == ", n_.N(d)));
    }
    EmitTileProduct(on, firsts.empty() ? "true" : absl::StrJoin(firsts, " && "),
                    lasts.empty() ? "true" : absl::StrJoin(lasts, " && "));
  }

  // The softmax whose rows sum op `on` divides, or -1.
  int Normalizes(const space::OpNest& on) const {
    const auto it = std::find(normalizer_.begin(), normalizer_.end(), on.op);
    return it == normalizer_.end() ? -1 : static_cast<int>(it - normalizer_.begin());
  }

  // ` * ` the reciprocal sums of the softmax rows `on` divides, as lanes
  // along dim d (a float when d < 0); "" when it divides none.
  std::string RowFactor(const space::OpNest& on, int d) const {
    const int sm = Normalizes(on);
    if (sm < 0) return "";
    const std::string at = absl::StrCat("sinv", sm, "[", x_.StateOffset(chain_.ops[sm]), "]");
    if (d < 0) return " * " + at;
    Lanes inv;
    inv.ptr = "&" + at;
    inv.stride = x_.StateStride(chain_.ops[sm], d);
    return " * " + VectorLoad(inv);
  }

  void StoreSum(const Op& op, const space::OpNest& on) override {
    if (prep_mode_) return;  // the prepare walk: loops and constant packs only
    if (!on.gemm.ok) {
      const int opened = OpenPointLoops(w_, op.index, n_);
      x_.Store(w_, on, absl::StrCat("acc", Sfx(on.op), "[", FlatIndex(op.index, n_), "]", RowFactor(on, -1)));
      CloseScopes(w_, opened);
      return;
    }
    if (direct_c_[on.op] > 0) {
      // The micro-kernels wrote it; what is left is dividing its rows.
      if (Normalizes(on) < 0) return;
      w_.Line("// divided by the softmax's row sums");
      const Access self = ir::ResultAccess(op);
      const int inner = InnerDim(op.index, [&](int d) { return ResultStride(on, d); });
      PointwiseLoops(op.index, inner, [&](bool vector) {
        if (vector) {
          StoreVector(on, inner, VectorLoad(AccessLanes(self, inner)) + RowFactor(on, inner));
        } else {
          x_.Store(w_, on, x_.Load(self) + RowFactor(on, -1));
        }
      });
      return;
    }
    // Store the finished tile.
    const space::GemmForm& g = on.gemm;
    const GemmNames names = Gemm(on);
    w_.Open("");
    w_.Line(absl::StrCat("const long rows_pad = ", names.rows_pad, ", cols_pad = ", names.cols_pad, ";"));
    const std::string at = absl::StrCat("acc", Sfx(on.op), "[((", FlatIndex(g.batch, n_), ") * rows_pad + (",
                                        FlatIndex(g.rows, n_), ")) * cols_pad + (", FlatIndex(g.cols, n_), ")]");
    std::vector<int> dims = g.batch;
    dims.insert(dims.end(), g.rows.begin(), g.rows.end());
    dims.insert(dims.end(), g.cols.begin(), g.cols.end());
    if (!g.cols.empty()) {
      // Along the last column dim, adjacent in the accumulator.
      const int inner = g.cols.back();
      PointwiseLoops(dims, inner, [&](bool vector) {
        if (vector) {
          StoreVector(on, inner, absl::StrCat("fusor_vload(&", at, ")", RowFactor(on, inner)));
        } else {
          x_.Store(w_, on, at + RowFactor(on, -1));
        }
      });
    } else {
      int opened = OpenPointLoops(w_, dims, n_);
      x_.Store(w_, on, at + RowFactor(on, -1));
      CloseScopes(w_, opened);
    }
    w_.Close();
  }

  // A sum no intrinsic takes: each point's reduction added to acc.
  void AccumulateSum(const Op& op, const space::OpNest& on) override {
    if (prep_mode_) return;  // the prepare walk: loops and constant packs only
    auto load = [this](const Access& a) { return x_.Load(a); };
    const int opened = OpenPointLoops(w_, op.index, n_);
    w_.Line("float s = 0.0f;");
    const int inner = OpenPointLoops(w_, op.reduce, n_);
    w_.Line(absl::StrCat("s += ", ExprToC(op.body, load), ";"));
    CloseScopes(w_, inner);
    w_.Line(absl::StrCat("acc", Sfx(on.op), "[", FlatIndex(op.index, n_), "] += s;"));
    CloseScopes(w_, opened);
  }

  // --------------------------------------------------------- softmax ---

  std::vector<int> SoftmaxRows(const Op& op) const {
    std::vector<int> rows;
    for (int d : op.index) {
      if (d != op.axis) rows.push_back(d);
    }
    return rows;
  }

  std::string AxisVar(int ax) const {
    return absl::StrCat("const long ", n_.V(ax), " = ", n_.O(ax), " + ", n_.I(ax), ";");
  }

  // The softmax's inputs along its axis (within the current range) into
  // `row`, in vectors, and their maximum into the float `max`.
  void EmitRowValues(const Op& op, const std::string& row, const std::string& max) {
    auto load = [this](const Access& a) { return x_.Load(a); };
    const int ax = op.axis;
    w_.Line("fusor_vf row_vmax = fusor_vsplat(-INFINITY);");
    w_.Line("float row_smax = -INFINITY;");
    // A causal softmax computes the entries it keeps; the rest are -inf.
    if (op.Causal()) w_.Line(absl::StrCat("const long kept = ", emit::CausalKept(op, n_), ";"));
    VectorLoop(w_, n_.I(ax), op.Causal() ? "kept" : n_.N(ax), AxisVar(ax), [&](bool vector) {
      if (vector) {
        w_.Line(absl::StrCat("const fusor_vf x = ", VectorExpr(op.body, LanesAlong(ax)), ";"));
        w_.Line(absl::StrCat("fusor_vstore(", row, " + ", n_.I(ax), ", x);"));
        w_.Line("row_vmax = fusor_vmax(row_vmax, x);");
      } else {
        w_.Line(absl::StrCat("const float x = ", ExprToC(op.body, load), ";"));
        w_.Line(absl::StrCat(row, "[", n_.I(ax), "] = x;"));
        w_.Line("row_smax = x > row_smax ? x : row_smax;");
      }
    });
    if (op.Causal()) w_.Line(absl::StrCat("for (long j = kept; j < ", n_.N(ax), "; ++j) ", row, "[j] = -INFINITY;"));
    w_.Line("const float row_hmax = fusor_vhmax(row_vmax);");
    w_.Line(absl::StrCat("const float ", max, " = row_hmax > row_smax ? row_hmax : row_smax;"));
  }

  // Stores row[i] * `factor` (a C float, or "" for none) to the result.
  void EmitRowStore(const space::OpNest& on, const std::string& row, const std::string& factor) {
    const int ax = chain_.ops[on.op].axis;
    const std::string f = factor.empty() ? "" : absl::StrCat(" * ", factor);
    VectorLoop(w_, n_.I(ax), n_.N(ax), AxisVar(ax), [&](bool vector) {
      if (vector) {
        StoreVector(on, ax, absl::StrCat("fusor_vload(", row, " + ", n_.I(ax), ")", f));
      } else {
        x_.Store(w_, on, absl::StrCat(row, "[", n_.I(ax), "]", f));
      }
    });
  }

  // Whether the softmax's row can be worked on where it is stored: its
  // result only in a block-local buffer, adjacent along the axis.
  bool RowInPlace(const Op& op) const {
    const Access self = ir::ResultAccess(op);
    return HasLocal(op.output) && chain_.tensors[op.output].role != TensorRole::kOutput &&
           x_.LocalStride(self, op.axis) == 1;
  }

  // Declares `row`, the row's scratch, or the result's row itself in place.
  std::string SoftmaxRow(const Op& op, const space::OpNest& on) {
    if (!RowInPlace(op)) return "row" + Sfx(on.op);
    w_.Line("float* row;");
    w_.Open("");
    w_.Line(absl::StrCat("const long ", n_.V(op.axis), " = ", n_.O(op.axis), ";"));
    w_.Line(absl::StrCat("row = ", AccessLanes(ir::ResultAccess(op), op.axis).ptr, ";"));
    w_.Close();
    return "row";
  }

  void EmitPlainSoftmax(const Op& op, const space::OpNest& on) {
    int opened = OpenPointLoops(w_, SoftmaxRows(op), n_);
    const std::string row = SoftmaxRow(op, on);
    EmitRowValues(op, row, "mx");
    w_.Line(absl::StrCat("const float inv = 1.0f / fusor_row_exp_sum(", row, ", ", n_.N(op.axis), ", mx);"));
    if (normalizer_[on.op] >= 0) {
      w_.Line(absl::StrCat("sinv", Sfx(on.op), "[", x_.StateOffset(op), "] = inv;  // the consumer divides"));
      if (!RowInPlace(op)) EmitRowStore(on, row, "");
    } else if (RowInPlace(op)) {
      w_.Line(absl::StrCat("for (long j = 0; j < ", n_.N(op.axis), "; ++j) ", row, "[j] *= inv;"));
    } else {
      EmitRowStore(on, row, "inv");
    }
    CloseScopes(w_, opened);
  }

  // One stream step of a softmax along the stream dim: the tile's
  // exponentials against the running max; the running sum, and the factor
  // by which the consumer rescales what it accumulated so far.
  void EmitOnlineSoftmax(const Op& op, const space::OpNest& on) {
    const std::string o = Sfx(on.op);
    int opened = OpenPointLoops(w_, SoftmaxRows(op), n_);
    const std::string row = SoftmaxRow(op, on);
    w_.Line(absl::StrCat("const long sr = ", x_.StateOffset(op), ";"));
    EmitRowValues(op, row, "mt");
    w_.Line(absl::StrCat("const float m_old = smax", o, "[sr];"));
    w_.Line("const float m_new = m_old > mt ? m_old : mt;");
    w_.Line("const float rescale = m_new == -INFINITY ? 1.0f : fusor_exp(m_old - m_new);");
    w_.Line(absl::StrCat("const float total = fusor_row_exp_sum(", row, ", ", n_.N(op.axis), ", m_new);"));
    if (!RowInPlace(op)) EmitRowStore(on, row, "");
    w_.Line(absl::StrCat("ssum", o, "[sr] = ssum", o, "[sr] * rescale + total;"));
    w_.Line(absl::StrCat("smax", o, "[sr] = m_new;"));
    w_.Line(absl::StrCat("sscale", o, "[sr] = rescale;"));
    CloseScopes(w_, opened);
  }

  // Where a result accumulated along the stream loop is written: the
  // output, or this part's partial sums when the loop is split.
  std::string OutputAt(const Op& op) const {
    if (nest_.split == 1) return n_.Global(op.output);
    const int o = chain_.tensors[op.output].producer;
    return absl::StrCat("(partials + ", partial_slot_.at(o), "L + part * ",
                        chain_.tensors[op.output].NumElements(), "L)");
  }

  // After the stream loop: an accumulated result is complete; divide by
  // the online softmax's sums and write it out.
  void WriteComplete(const space::OpNest& on, bool output) override {
    if (prep_mode_) return;  // the prepare walk: loops and constant packs only
    const Op& op = chain_.ops[on.op];
    const Access self = ir::ResultAccess(op);
    const std::string at = absl::StrCat(n_.Local(op.output), "[", x_.LocalOffset(self), "]");
    const int inner = InnerDim(op.index, [&](int d) { return x_.LocalStride(self, d); });
    const Op* sm = on.online_softmax >= 0 ? &chain_.ops[on.online_softmax] : nullptr;
    PointwiseLoops(op.index, inner, [&](bool vector) {
      if (vector) {
        const Lanes local = AccessLanes(self, inner);
        std::string value = VectorLoad(local);
        if (sm != nullptr) {
          Lanes sum;
          sum.ptr = absl::StrCat("&ssum", on.online_softmax, "[", x_.StateOffset(*sm), "]");
          sum.stride = x_.StateStride(*sm, inner);
          value = absl::StrCat(value, " / ", VectorLoad(sum));
        }
        w_.Line(absl::StrCat("const fusor_vf value = ", value, ";"));
        if (sm != nullptr) w_.Line(VectorStore(local, "value"));
        if (output) {
          Lanes out;
          out.ptr = absl::StrCat("&", OutputAt(op), "[", GlobalOffset(self, n_), "]");
          out.dtype = nest_.split > 1 ? ir::DType::kF32 : chain_.dtype;
          int64_t constant = 0;
          std::map<int, int64_t> strides = GlobalStrides(self, chain_, &constant);
          out.stride = strides.count(inner) ? strides.at(inner) : 0;
          w_.Line(VectorStore(out, "value"));
        }
      } else {
        if (sm != nullptr) w_.Line(absl::StrCat(at, " /= ssum", on.online_softmax, "[", x_.StateOffset(*sm), "];"));
        if (output) {
          w_.Line(absl::StrCat(OutputAt(op), "[", GlobalOffset(self, n_), "] = ",
                               nest_.split > 1 ? at : StoreConvert(chain_.dtype, at), ";"));
        }
      }
    });
  }

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

}  // namespace

double CpuStagingBytes(const Chain& written, const space::LoopNest& nest) {
  return FusedEmitter(space::NestChain(written, nest), nest).StagingBytes();
}

absl::StatusOr<KernelSource> EmitCpuFusedKernel(const Chain& written, const space::LoopNest& nest,
                                                const std::string& schedule_text, const std::string& mapping) {
  if (nest.ops.size() != written.ops.size()) {
    return absl::InvalidArgumentError("loop nest does not belong to this chain");
  }
  // A regrouped schedule runs the regrouped chain: same inputs and outputs.
  const Chain& chain = space::NestChain(written, nest);
  KernelSource k;
  FusedEmitter emitter(chain, nest);
  k.source = emitter.Emit(schedule_text, mapping);
  k.compile_flags = cpu::CompileFlags();
  nlohmann::json meta = cpu::KernelJson(chain, schedule_text);
  meta["mapping"] = mapping;
  meta["blocks"] = nest.num_blocks;
  meta["scratch_bytes_per_thread"] = emitter.ScratchBytes();
  if (const std::vector<std::string> packed = emitter.ConstantPacks(); !packed.empty()) {
    meta["prepare"] = cpu::PrepareJson(packed);
  }
  k.metadata_json = meta.dump(2);
  return k;
}

}  // namespace fusor::codegen
