#include "common/codegen/cpu/cpu_codegen.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codegen/cpu/cpu_emitter.h"

namespace fusor::codegen::cpu {
namespace {

// typedef of the micro-kernel vector type of `lanes` floats, unaligned
// loads allowed.
std::string VectorType(int lanes) {
  if (lanes <= 1) return "typedef float fusor_v1;\n";
  return absl::StrCat("typedef float fusor_v", lanes, " __attribute__((vector_size(", 4 * lanes, "), aligned(4)));\n");
}

}  // namespace

FusedEmitter::FusedEmitter(const Chain& chain, const space::LoopNest& nest) : NestWalker(chain, nest) {
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

std::string FusedEmitter::Emit(const std::string& schedule_text, const std::string& mapping) {
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
  const std::vector<int> ranged = chain_.RangedDims();
  if (prepared) out += EmitPrepare();
  Writer& w = w_;
  const std::string args = "const void* const* fusor_inputs, void* const* fusor_outputs, int num_threads";
  if (prepared || !ranged.empty()) {
    w.Open(absl::StrCat("static int fusor_body(", prepared ? "const fusor_prep_t* fusor_prep, " : "",
                        ranged.empty() ? "" : "const long* fusor_dims, ", args, ")"));
  } else {
    w.Open(absl::StrCat("extern \"C\" int fusor_run(", args, ")"));
  }
  cpu::DeclareArguments(w, chain_, n_);
  if (!ranged.empty()) {
    // A size outside a ranged dim's range is refused (2) before anything is touched.
    for (size_t i = 0; i < ranged.size(); ++i) {
      const ir::Dim& dim = chain_.dims[ranged[i]];
      w.Line(absl::StrCat("if (fusor_dims[", i, "] < ", dim.min, "L || fusor_dims[", i, "] > ", dim.extent,
                          "L) return 2;  // ", dim.name));
    }
    x_.DeclareSizes(w, "fusor_dims");
  }
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
  const std::string blocks = x_.Blocks();
  w.Line("int failed = 0;");
  w.Line(absl::StrCat("#pragma omp parallel num_threads(num_threads > 0 ? num_threads : 1) if (",
                      ranged.empty() ? absl::StrCat(nest_.num_blocks) : blocks, " > 1)"));
  w.Open("");
  w.Line(absl::StrCat("float* const scratch = fusor_scratch(", scratch_bytes, ");"));
  w.Open("if (!scratch)");
  w.Line("#pragma omp atomic write");
  w.Line("failed = 1;");
  w.Close();
  w.Line("#pragma omp for schedule(dynamic, 1)");
  w.Open(absl::StrCat("for (long blk = 0; blk < ", blocks, "; ++blk)"));
  w.Line("if (!scratch) continue;");
  DeclareScratchPointers();
  if (prepared) w.Line(absl::StrCat("long fusor_visit[", constant_.size(), "] = {0};"));
  if (nest_.split > 1) {
    w.Line(absl::StrCat("const long part = blk % ", nest_.split, "L;"));
    x_.DefineBlockOrigins(w, absl::StrCat("blk / ", nest_.split, "L"));
  } else {
    x_.DefineBlockOrigins(w, "blk");
  }
  if (prepared) {
    w.Line(absl::StrCat("const long fusor_key[", constant_.size(), "] = {",
                        absl::StrJoin(PackKeys(), ", "), "};  // this block's packs of each constant side"));
  }
  WalkBlock();
  w.Close();  // block loop
  if (nest_.split > 1) EmitPartialSums();
  w.Close();  // parallel
  w.Line("return failed;");
  w.Close();
  EmitEntryPoints(prepared, ranged);
  return out + w.Take();
}

std::vector<std::string> FusedEmitter::PackKeys() const {
  std::vector<std::string> keys;
  for (const ConstantPack& c : constant_) {
    std::string key = "0L";
    for (int d : s_.block) {
      if (!Contains(c.dims, d)) continue;
      key = absl::StrCat("(", key, ") * ", nest_.trips[d], "L + ", n_.O(d), " / ", s_.tile[d], "L");
    }
    if (nest_.split > 1) key = absl::StrCat("(", key, ") * ", nest_.split, "L + part");
    keys.push_back(key);
  }
  return keys;
}

void FusedEmitter::EmitEntryPoints(bool prepared, const std::vector<int>& ranged) {
  Writer& w = w_;
  if (!prepared && ranged.empty()) return;  // fusor_run is the body
  const std::string args = "const void* const* fusor_inputs, void* const* fusor_outputs, int num_threads";
  const std::string pass = "fusor_inputs, fusor_outputs, num_threads";
  std::vector<std::string> largest;
  for (int d : ranged) largest.push_back(absl::StrCat(chain_.dims[d].extent, "L"));
  // What fusor_body takes before the arguments: the prepared packs, and the sizes of the ranged dims.
  auto call = [&](const std::string& prep, const std::string& dims) {
    return absl::StrCat("  return fusor_body(", prepared ? prep + ", " : "", ranged.empty() ? "" : dims + ", ", pass,
                        ");");
  };
  w.Line("");
  if (!ranged.empty()) {
    w.Line(absl::StrCat("static const long fusor_largest[", ranged.size(), "] = {", absl::StrJoin(largest, ", "),
                        "};"));
    w.Line("");
    w.Line("// The ranged dims' sizes of this call, in the metadata's \"dims\" order; 2 when one is out of range.");
    w.Line(absl::StrCat("extern \"C\" int fusor_run_dims(const long* fusor_dims, ", args, ") {"));
    w.Line(call("0", "fusor_dims"));
    w.Line("}");
    w.Line("");
    w.Line("// At the ranged dims' largest sizes.");
  }
  w.Line(absl::StrCat("extern \"C\" int fusor_run(", args, ") {"));
  w.Line(call("0", "fusor_largest"));
  w.Line("}");
  if (!prepared) return;
  w.Line("");
  w.Line("// The same, with the constant inputs' packs from fusor_prepare; every input is passed as to fusor_run");
  w.Line("// (a constant one is still read where it is not packed, a bias say).");
  w.Line("extern \"C\" int fusor_run_prepared(const void* prepared, const void* const* fusor_inputs,");
  w.Line("                                    void* const* fusor_outputs, int num_threads) {");
  w.Line(call("(const fusor_prep_t*)prepared", "fusor_largest"));
  w.Line("}");
  if (ranged.empty()) return;
  w.Line("");
  w.Line(absl::StrCat("extern \"C\" int fusor_run_prepared_dims(const void* prepared, const long* fusor_dims, ",
                      args, ") {"));
  w.Line(call("(const fusor_prep_t*)prepared", "fusor_dims"));
  w.Line("}");
}

std::string FusedEmitter::EmitPrepare() {
  const size_t sides = constant_.size();
  const int64_t blocks = nest_.num_blocks;
  Writer& w = w_;
  w.Line("#include <stdlib.h>");
  w.Line("");
  w.Line(absl::StrCat("// Packed constant sides: ", sides, ", over ", blocks, " blocks. Blocks that differ only in block dims"));
  w.Line("// a side does not read share its packs: they are kept by key (fusor_prep_walk's keys), one buffer each.");
  w.Open("struct fusor_prep_t");
  w.Line(absl::StrCat("float* owned[", sides, "][", blocks, "];  // the buffers, by key"));
  w.Line(absl::StrCat("long visits[", sides, "][", blocks, "];  // how many packs each key holds"));
  w.Close(";");
  w.Line("");
  w.Open("static void fusor_prep_walk(const void* const* fusor_inputs, void* const* fusor_outputs, long blk, "
         "float* const* fusor_dst, long* fusor_visits, long* fusor_keys)");
  cpu::DeclareArguments(w, chain_, n_);
  x_.DeclareSizes(w, "");  // constants do not change with the ranged dims: their blocks at the largest sizes
  if (nest_.split > 1) {
    w.Line(absl::StrCat("const long part = blk % ", nest_.split, "L;"));
    x_.DefineBlockOrigins(w, absl::StrCat("blk / ", nest_.split, "L"));
  } else {
    x_.DefineBlockOrigins(w, "blk");
  }
  const std::vector<std::string> keys = PackKeys();
  for (size_t c = 0; c < sides; ++c) w.Line(absl::StrCat("fusor_keys[", c, "] = ", keys[c], ";"));
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
  w.Close();
  w.Open("else");
  w.Line("const long floats[] = {" + absl::StrJoin(constant_, ", ", [](std::string* out, const ConstantPack& c) {
           absl::StrAppend(out, c.floats, "L");
         }) + "};");
  w.Line("const size_t bytes = ((size_t)(visits[c] > 0 ? visits[c] : 1) * floats[c] * 4 + 63) / 64 * 64;");
  w.Line("dst[c] = (float*)aligned_alloc(64, bytes);");
  w.Line("if (!dst[c]) { fusor_release(p); return 0; }");
  w.Line("p->owned[c][keys[c]] = dst[c];");
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

std::vector<std::string> FusedEmitter::ConstantPacks() const {
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

int FusedEmitter::ConstantSide(int op, bool a_side) const {
  for (size_t c = 0; c < constant_.size(); ++c) {
    if (constant_[c].op == op && constant_[c].a_side == a_side) return static_cast<int>(c);
  }
  return -1;
}

double FusedEmitter::StagingBytes() const {
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

double FusedEmitter::Executions(const space::OpNest& on, int depth, bool hoisted) const {
  std::vector<int> loops = s_.block;
  const bool streamed = on.region == space::Region::kStream && !hoisted;
  if (streamed) loops.push_back(nest_.stream_dim);
  loops.insert(loops.end(), on.loops.begin(), on.loops.begin() + std::min<int>(depth, on.loops.size()));
  // What runs outside a split stream loop runs once per part.
  double runs = streamed ? 1 : nest_.split;
  for (int d : loops) runs *= static_cast<double>(nest_.trips[d]);
  return runs;
}

std::optional<int64_t> FusedEmitter::ConstRange(int d, const space::OpNest& on) const {
  const int64_t extent = chain_.dims[d].extent, tile = s_.tile[d];
  // A ranged dim's size is the call's.
  const bool ranged = chain_.dims[d].Ranged();
  if (!Looped(d, on)) {
    // An untiled causal axis ends where the row tile's last key is.
    if (x_.Bounded(d, &on) || ranged) return std::nullopt;
    return extent;
  }
  if (tile == 1 || (!ranged && extent % tile == 0)) return tile;
  return std::nullopt;
}

std::optional<int64_t> FusedEmitter::ConstCount(const std::vector<int>& dims, const space::OpNest& on) const {
  int64_t n = 1;
  for (int d : dims) {
    std::optional<int64_t> r = ConstRange(d, on);
    if (!r) return std::nullopt;
    n *= *r;
  }
  return n;
}

int64_t FusedEmitter::Stride(const Access& a, int d) const {
  if (HasLocal(a.tensor)) return x_.LocalStride(a, d);
  if (emit::RuntimeGlobalStride(a, d, chain_)) return kRuntimeStride;
  int64_t constant = 0;
  std::map<int, int64_t> strides = GlobalStrides(a, chain_, &constant);
  auto it = strides.find(d);
  return it == strides.end() ? 0 : it->second;
}

Lanes FusedEmitter::AccessLanes(const Access& a, int d) const {
  Lanes l;
  l.stride = Stride(a, d);
  if (l.stride == kRuntimeStride) l.stride_expr = StrideC(a, d);
  if (HasLocal(a.tensor)) {
    l.ptr = absl::StrCat("&", n_.Local(a.tensor), "[", x_.LocalOffset(a), "]");
  } else {
    l.ptr = absl::StrCat("&", n_.Global(a.tensor), "[", GlobalOffset(a, n_), "]");
    l.dtype = chain_.dtype;
  }
  return l;
}

int FusedEmitter::RowDim(const space::OpNest& on) const {
  int row = -1;
  for (int d : on.gemm.rows) {
    if (ConstRange(d, on) == std::optional<int64_t>(1)) continue;
    if (row >= 0) return -1;
    row = d;
  }
  return row >= 0 || on.gemm.rows.empty() ? row : on.gemm.rows.back();
}

ASide FusedEmitter::ASideOf(const space::OpNest& on) const {
  ASide a;
  const space::GemmForm& g = on.gemm;
  a.k_stride = on.kernel.mr;
  if (!g.ok || g.a_side.size() != 1 || RowDim(on) < 0 || g.kdims.size() != 1) return a;
  const Access& acc = g.a_side[0];
  if (!HasLocal(acc.tensor) && chain_.dtype != ir::DType::kF32) return a;
  // The micro-kernel compiles A's strides in.
  std::vector<int> dims = {RowDim(on), g.kdims[0]};
  dims.insert(dims.end(), g.outer_reduce.begin(), g.outer_reduce.end());
  for (int d : dims) {
    if (Stride(acc, d) == kRuntimeStride) return a;
  }
  a.direct = true;
  a.row_stride = Stride(acc, RowDim(on));
  a.k_stride = Stride(acc, g.kdims[0]);
  return a;
}

Window FusedEmitter::WindowOf(const space::OpNest& on) const {
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

bool FusedEmitter::ColumnsFlat(const Access& a, const space::OpNest& on) const {
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

int64_t FusedEmitter::BDirectStride(const space::OpNest& on) const {
  const space::GemmForm& g = on.gemm;
  if (!g.ok || g.b_side.size() != 1 || g.kdims.size() != 1 || on.b_per_point || g.cols.empty()) return 0;
  if (a_[on.op].direct && g.scale != 1) return 0;
  const Access& b = g.b_side[0];
  if (!HasLocal(b.tensor) || !ColumnsFlat(b, on)) return 0;
  return Stride(b, g.kdims[0]);
}

bool FusedEmitter::PointsFold(const space::OpNest& on) const {
  const space::GemmForm& g = on.gemm;
  if (!g.ok || g.outer_reduce.empty() || (on.a_per_point && !a_[on.op].direct)) return false;
  const std::optional<int64_t> points = ConstCount(g.outer_reduce, on);
  if (!points || *points > kMaxPoints) return false;
  for (const Access& b : g.b_side) {
    if (on.b_per_point && ConstantInput(b.tensor)) return false;
  }
  return true;
}

int64_t FusedEmitter::DirectCStride(const space::OpNest& on) const {
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
  const int64_t row_stride = Stride(self, RowDim(on));
  return row_stride == kRuntimeStride ? 0 : row_stride;  // the micro-kernel compiles it in
}

bool FusedEmitter::Cheap(const ir::Expr& e) {
  using Kind = ir::Expr::Kind;
  if (e.kind == Kind::kDiv || (e.kind == Kind::kCall && e.func != ir::Func::kRelu)) return false;
  for (const ir::Expr& arg : e.args) {
    if (!Cheap(arg)) return false;
  }
  return true;
}

bool FusedEmitter::FoldsInto(const space::OpNest& s, const space::OpNest& m) const {
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

int FusedEmitter::NormalizedBy(const space::OpNest& on) const {
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

void FusedEmitter::DeclareScratchPointers() {
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

void FusedEmitter::OpenStreamLoop() {
  const int sd = nest_.stream_dim;
  if (nest_.split == 1) {
    x_.OpenTileLoop(w_, sd);
    return;
  }
  const int64_t tile = s_.tile[sd];
  const std::string extent = n_.Extent(sd);
  const std::string per_part =
      chain_.dims[sd].Ranged()
          ? absl::StrCat("((", n_.T(sd), " + ", nest_.split - 1, "L) / ", nest_.split, "L * ", tile, "L)")
          : absl::StrCat((nest_.trips[sd] + nest_.split - 1) / nest_.split * tile, "L");
  w_.Line(absl::StrCat("const long part_lo = part * ", per_part, ", part_hi = part_lo + ", per_part, " < ", extent,
                       " ? part_lo + ", per_part, " : ", extent, ";"));
  w_.Open(absl::StrCat("for (long ", n_.O(sd), " = part_lo; ", n_.O(sd), " < part_hi; ", n_.O(sd), " += ", tile,
                       "L)"));
  w_.Line(absl::StrCat("const long ", n_.N(sd), " = ", x_.RangeOf(sd, n_.O(sd)), ";"));
}

void FusedEmitter::EmitPartialSums() {
  for (const auto& [o, slot] : partial_slot_) {
    const int t = chain_.ops[o].output;
    // Each part's partial sums are laid out as the output (at this call's sizes), one part after the other.
    const int64_t elements = chain_.tensors[t].NumElements();
    w_.Line(absl::StrCat("// ", chain_.tensors[t].name, ": the sum of the parts"));
    w_.Line("#pragma omp for schedule(static)");
    w_.Open(absl::StrCat("for (long i = 0; i < ", emit::ElementsC(t, n_), "; ++i)"));
    w_.Line(absl::StrCat("float s = partials[", slot, "L + i];"));
    w_.Line(absl::StrCat("for (long p = 1; p < ", nest_.split, "L; ++p) s += partials[", slot, "L + p * ", elements,
                         "L + i];"));
    w_.Line(absl::StrCat(n_.Global(t), "[i] = ", StoreConvert(chain_.dtype, "s"), ";"));
    w_.Close();
  }
}
}  // namespace fusor::codegen::cpu

namespace fusor::codegen {

using cpu::FusedEmitter;
using ir::Chain;

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
    if (!chain.RangedDims().empty()) {
      meta["prepare"]["signatures"].push_back(
          "int fusor_run_prepared_dims(const void* prepared, const long* dims, const void* const* inputs, "
          "void* const* outputs, int num_threads)");
    }
  }
  k.metadata_json = meta.dump(2);
  return k;
}

}  // namespace fusor::codegen

