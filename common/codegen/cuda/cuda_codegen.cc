#include "common/codegen/cuda/cuda_codegen.h"

#include <algorithm>
#include <cctype>
#include <tuple>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codegen/cpu/prelude.h"
#include "common/codegen/emit.h"
#include "common/util/status_macros.h"

namespace fusor::codegen {

namespace {

using emit::Count;
using emit::ExprToC;
using emit::FlatIndex;
using emit::FloatLit;
using emit::GlobalOffset;
using emit::GlobalStrides;
using emit::Names;
using emit::ProductToC;
using emit::StoreConvert;
using emit::Writer;
using ir::Access;
using ir::Chain;
using ir::Op;
using ir::OpKind;
using ir::TensorRole;

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The matrix instruction of an mma.sync intrinsic.
enum class MmaKind { kF16, kBF16, kTF32 };

// How one side of a GEMM-shaped op is staged in shared memory:
// [batch][own][k] (k-major: rows of k, ldmatrix straight) or
// [batch][k][own] (own-major: rows of own, ldmatrix .trans), each row
// padded by a skew against bank conflicts.
struct SideLayout {
  bool k_major = true;
  int64_t own_pad = 0;  // static: rows of A (multiple of 16) or columns of B (of 8)
  int64_t ld = 0;       // elements per staged row
  int64_t bytes = 0;
  int64_t offset = 0;
  int contiguous = -1;  // cp.async: the dim contiguous in global memory along a staged row
  // Staged anew at every step of one loop (the stream loop, or the own
  // loop it sits just inside) with cp.async: two buffers, the next step's
  // tile prefetched into one while the other is read.
  bool pipelined = false;
  int loop_dim = -1;  // the loop it is prefetched across
  int64_t stage_elems = 0;
};

struct GemmLayout {
  MmaKind kind = MmaKind::kF16;
  int elem_bytes = 2;
  int kstep = 16;
  int64_t k_pad = 0;  // static
  int nf = 1;         // n-fragments of 8 columns per warp unit
  SideLayout a, b;
};

class CudaEmitter {
 public:
  CudaEmitter(const Chain& chain, const space::LoopNest& nest)
      : chain_(chain), nest_(nest), s_(nest.schedule), n_{chain}, threads_(32 * space::WarpsOf(nest.schedule)),
        stages_(space::StagesOf(nest.schedule)), x_(chain, nest) {}

  absl::StatusOr<CudaKernel> Emit(const std::string& schedule_text, const std::string& mapping) {
    RETURN_IF_ERROR(s_.registers ? RegisterLayout() : Layout());
    const std::string type = StorageType();
    std::string head = absl::StrCat(
        "// fusor fused CUDA kernel for chain '", chain_.name, "'\n", "// schedule: ", schedule_text, "  (",
        space::TilingExpression(s_, chain_), ")\n", "// mapping:  ", mapping, "\n", "// grid: ", nest_.num_blocks,
        " blocks of ", threads_, " threads, ", shared_bytes_, " bytes of dynamic shared memory, ", stages_,
        stages_ == 1 ? " stage" : " stages", " of streamed tiles\n", "// chain:\n");
    for (const Op& op : chain_.ops) absl::StrAppend(&head, "//   ", ir::OpToString(op, chain_), "\n");
    head += "#include \"fusor_device.h\"\n\n";
    absl::StrAppend(&head, "struct FusorArgs {\n  const void* in[", chain_.inputs.size(), "];\n  void* out[",
                    chain_.outputs.size(), "];\n};\n\n");

    Writer& w = w_;
    // At least one block per multiprocessor: ptxas may then use up to 255
    // registers a thread rather than spill.
    w.Open(absl::StrCat("extern \"C\" __global__ void __launch_bounds__(", threads_,
                        ", 1) fusor_fused(const FusorArgs args)"));
    w.Line("FUSOR_DYNAMIC_SMEM(fusor_smem);");
    for (size_t i = 0; i < chain_.inputs.size(); ++i) {
      int t = chain_.inputs[i];
      w.Line(absl::StrCat("const ", type, "* const __restrict__ ", n_.Global(t), " = (const ", type, "*)args.in[",
                          i, "];"));
    }
    for (size_t i = 0; i < chain_.outputs.size(); ++i) {
      int t = chain_.outputs[i];
      w.Line(absl::StrCat(type, "* const __restrict__ ", n_.Global(t), " = (", type, "*)args.out[", i, "];"));
    }
    w.Line(absl::StrCat("const int tid = threadIdx.x, lane = fusor_lane(), warp = fusor_warp();"));
    w.Line("(void)lane; (void)warp;");
    if (s_.registers) {
      EmitRegisterResident();
    } else {
      DeclareSharedPointers();
      x_.DefineBlockOrigins(w, "blockIdx.x");
      EmitRegion(space::Region::kBefore);
      if (nest_.stream_dim >= 0) EmitStream();
      EmitRegion(space::Region::kAfter);
    }
    w.Close();

    CudaKernel k;
    k.source = head + w.Take();
    k.grid = nest_.num_blocks;
    k.threads = threads_;
    k.shared_bytes = shared_bytes_;
    return k;
  }

 private:
  // ------------------------------------------------------------ layout ---

  std::string StorageType() const { return chain_.dtype == ir::DType::kF32 ? "float" : "fusor_u16"; }

  absl::Status Layout() {
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
          bytes += RoundUp(side.bytes, 16) * (side.pipelined ? 2 : 1);
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

  absl::Status PlanGemm(const space::OpNest& on, GemmLayout& g) const {
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

  void DeclareSharedPointers() {
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

  // ------------------------------------------------------------ common ---

  void Sync() { w_.Line("__syncthreads();"); }

  // Defines i_d and v_d for `dims` from the flat index `flat` over their
  // ranges (the last dim fastest).
  void Decompose(const std::string& flat, const std::vector<int>& dims) {
    if (dims.empty()) return;
    const std::string q = absl::StrCat("q_", dims[0], "_", dims.size());
    w_.Line(absl::StrCat("long ", q, " = ", flat, ";"));
    for (int i = static_cast<int>(dims.size()) - 1; i >= 0; --i) {
      const int d = dims[i];
      if (i > 0) {
        w_.Line(absl::StrCat("const long ", n_.I(d), " = ", q, " % ", n_.N(d), "; ", q, " /= ", n_.N(d), ";"));
      } else {
        w_.Line(absl::StrCat("const long ", n_.I(d), " = ", q, ";"));
      }
      w_.Line(absl::StrCat("const long ", n_.V(d), " = ", n_.O(d), " + ", n_.I(d), ";"));
    }
  }

  // for (p = tid; p < count; p += threads) over the points of `dims`.
  void OpenParallelPoints(const std::vector<int>& dims) {
    w_.Open(absl::StrCat("for (long p = tid; p < ", Count(dims, n_), "; p += ", threads_, ")"));
    Decompose("p", dims);
  }

  void ZeroShared(const std::string& ptr, int64_t floats) {
    w_.Line(absl::StrCat("for (long p = tid; p < ", floats, "L; p += ", threads_, ") ", ptr, "[p] = 0.0f;"));
  }

  void EmitRegion(space::Region region) {
    for (const space::OpNest& on : nest_.ops) {
      if (on.region == region) EmitOp(on.op);
    }
  }

  void EmitStream() {
    const int sd = nest_.stream_dim;
    w_.Line(absl::StrCat("// stream loop over ", chain_.dims[sd].name));
    for (const space::OpNest& on : nest_.ops) {
      if (on.accumulates) {
        const int t = chain_.ops[on.op].output;
        ZeroShared(n_.Local(t), nest_.local[t].floats);
      }
      if (on.online) {
        w_.Line(absl::StrCat("for (long p = tid; p < ", on.state_floats / 3, "L; p += ", threads_, ") { smax", on.op,
                             "[p] = -FUSOR_INFINITY; ssum", on.op, "[p] = 0.0f; }"));
      }
    }
    for (const space::OpNest& on : nest_.ops) {
      if (on.region != space::Region::kStream || !on.gemm.ok || !(on.a_hoisted || on.b_hoisted)) continue;
      const Op& op = chain_.ops[on.op];
      w_.Line(absl::StrCat("// ", chain_.tensors[op.output].name, ": operands staged once, outside the stream loop"));
      w_.Open("");
      x_.DefineFullRanges(w_, on);
      if (on.a_hoisted) Pack(on, true);
      if (on.b_hoisted) Pack(on, false);
      w_.Close();
    }
    bool pipeline = false;
    for (const space::OpNest& on : nest_.ops) {
      if (!on.gemm.ok || on.region != space::Region::kStream) continue;
      for (bool a_side : {true, false}) {
        const SideLayout& side = SideOf(on, a_side);
        if (!side.pipelined || side.loop_dim != sd || DepthOf(on, a_side) != 0) continue;
        w_.Open("");
        x_.DefineFullRanges(w_, on);
        FirstStage(on, a_side);
        w_.Close();
        pipeline = true;
      }
    }
    if (pipeline) w_.Line("fusor_cp_async_commit();");
    Sync();
    x_.OpenTileLoop(w_, sd);
    if (pipeline) DefineStage(sd);
    EmitRegion(space::Region::kStream);
    w_.Close();
    for (const space::OpNest& on : nest_.ops) {
      if (on.accumulates) EmitFinalize(on);
    }
  }

  void EmitOp(int o) {
    const Op& op = chain_.ops[o];
    const space::OpNest& on = nest_.ops[o];
    w_.Line(absl::StrCat("// ", ir::OpToString(op, chain_)));
    w_.Open("");
    x_.DefineFullRanges(w_, on);
    if (op.kind == OpKind::kSum && on.gemm.ok) {
      for (bool a_side : {true, false}) {
        const SideLayout& side = SideOf(on, a_side);
        if (side.pipelined && DepthOf(on, a_side) == 0) CurrentStage(on, a_side);
      }
      EmitGemmSum(op, on);
    } else if (op.kind == OpKind::kSum) {
      EmitGenericSum(op, on);
    } else if (op.kind == OpKind::kMap) {
      OpenParallelPoints(op.index);
      x_.Store(w_, on, ExprToC(op.body, [this](const Access& a) { return x_.Load(a); }));
      w_.Close();
      Sync();
    } else {
      EmitSoftmax(op, on);
    }
    w_.Close();
  }

  // -------------------------------------------------------- GEMM sums ---

  // Runtime sizes of the op's current tile: batch points, the own extent of
  // one side (rows of A, columns of B) or both, k, and their pads.
  enum class Sides { kA, kB, kBoth };
  void DefineGemmSizes(const space::OpNest& on, Sides sides) {
    const space::GemmForm& g = on.gemm;
    const GemmLayout& l = gemm_[on.op];
    w_.Line(absl::StrCat("const long nb = ", Count(g.batch, n_), ", kc = ", Count(g.kdims, n_), ", kc_pad = (kc + ",
                         l.kstep - 1, "L) / ", l.kstep, "L * ", l.kstep, "L;"));
    if (sides != Sides::kB) {
      w_.Line(absl::StrCat("const long rows = ", Count(g.rows, n_), ", rows_pad = (rows + 15L) / 16L * 16L;"));
    }
    if (sides != Sides::kA) {
      w_.Line(absl::StrCat("const long cols = ", Count(g.cols, n_), ", cols_pad = (cols + 7L) / 8L * 8L;"));
    }
  }

  std::string PackIndex(const SideLayout& side, const GemmLayout& l, const std::string& bi, const std::string& x,
                        const std::string& kk) const {
    if (side.k_major) return absl::StrCat("((", bi, ") * ", side.own_pad, "L + (", x, ")) * ", side.ld, "L + (", kk, ")");
    return absl::StrCat("((", bi, ") * ", l.k_pad, "L + (", kk, ")) * ", side.ld, "L + (", x, ")");
  }

  // Stages one side of the op's current tile in shared memory (the caller
  // synchronizes before the tile is read). With `wait` false, cp.async
  // copies are only issued: the caller commits and waits.
  void Pack(const space::OpNest& on, bool a_side, bool wait = true) {
    const space::GemmForm& g = on.gemm;
    const GemmLayout& l = gemm_[on.op];
    const SideLayout& side = a_side ? l.a : l.b;
    const std::vector<int>& own = a_side ? g.rows : g.cols;
    const std::string buf = absl::StrCat(a_side ? "pa" : "pb", on.op);
    w_.Line(absl::StrCat("// stage ", a_side ? "A" : "B", " (", side.k_major ? "k-major" : "own-major",
                         side.contiguous >= 0 ? ", cp.async" : ", gather", ")"));
    w_.Open("");
    DefineGemmSizes(on, a_side ? Sides::kA : Sides::kB);
    w_.Line(absl::StrCat("const long own = ", a_side ? "rows" : "cols", ", own_pad = ", a_side ? "rows_pad" : "cols_pad",
                         ";"));
    if (side.contiguous >= 0) {
      PackAsync(on, side, own, buf);
      if (wait) {
        w_.Line("fusor_cp_async_commit();");
        w_.Line("fusor_cp_async_wait<0>();");
      }
    } else {
      PackGather(on, side, own, buf, a_side);
    }
    w_.Close();
  }

  void PackGather(const space::OpNest& on, const SideLayout& side, const std::vector<int>& own,
                  const std::string& buf, bool a_side) {
    const space::GemmForm& g = on.gemm;
    const GemmLayout& l = gemm_[on.op];
    w_.Open(absl::StrCat("for (long p = tid; p < nb * own_pad * kc_pad; p += ", threads_, ")"));
    if (side.k_major) {
      w_.Line("const long kk = p % kc_pad, x = (p / kc_pad) % own_pad, bi = p / (kc_pad * own_pad);");
    } else {
      w_.Line("const long x = p % own_pad, kk = (p / own_pad) % kc_pad, bi = p / (kc_pad * own_pad);");
    }
    w_.Line("float value = 0.0f;");
    w_.Open("if (x < own && kk < kc)");
    Decompose("bi", g.batch);
    Decompose("x", own);
    Decompose("kk", g.kdims);
    w_.Line(absl::StrCat("value = ", ProductToC(a_side ? g.a_side : g.b_side, 1,
                                                [this](const Access& a) { return x_.Load(a); }),
                         ";"));
    w_.Close();
    w_.Line(absl::StrCat(buf, "[", PackIndex(side, l, "bi", "x", "kk"), "] = ", PackConvert(l, "value"), ";"));
    w_.Close();
  }

  std::string PackConvert(const GemmLayout& l, const std::string& v) const {
    switch (l.kind) {
      case MmaKind::kF16: return absl::StrCat("fusor_f32_to_f16(", v, ")");
      case MmaKind::kBF16: return absl::StrCat("fusor_f32_to_bf16(", v, ")");
      case MmaKind::kTF32: return absl::StrCat("fusor_round_tf32(", v, ")");
    }
    return v;
  }

  // 16-byte cp.async chunks along the staged rows (8 16-bit or 4 f32
  // elements each), the tail of a row and the padding rows zero-filled.
  void PackAsync(const space::OpNest& on, const SideLayout& side, const std::vector<int>& own,
                 const std::string& buf) {
    const space::GemmForm& g = on.gemm;
    const GemmLayout& l = gemm_[on.op];
    const std::vector<int>& other = side.k_major ? own : g.kdims;
    const std::string rows = side.k_major ? "own_pad" : "kc_pad", row_len = side.k_major ? "kc" : "own",
                      row_pad = side.k_major ? "kc_pad" : "own_pad", other_len = side.k_major ? "own" : "kc";
    const Access& a = (&side == &l.a ? g.a_side : g.b_side)[0];  // the side's one global access
    const int c = side.contiguous;
    const int chunk = 16 / l.elem_bytes;  // elements per 16-byte copy
    const std::string chunks = absl::StrCat("(", row_pad, " / ", chunk, "L)");
    w_.Open(absl::StrCat("for (long p = tid; p < nb * ", rows, " * ", chunks, "; p += ", threads_, ")"));
    w_.Line(absl::StrCat("const long chunk = p % ", chunks, ", y = (p / ", chunks, ") % ", rows, ", bi = p / (",
                         chunks, " * ", rows, ");"));
    w_.Line(absl::StrCat("const long e0 = chunk * ", chunk, "L;"));
    w_.Line(absl::StrCat("const long valid = y < ", other_len, " && e0 < ", row_len, " ? (", row_len, " - e0 < ",
                         chunk, "L ? ", row_len, " - e0 : ", chunk, "L) : 0;"));
    w_.Line(absl::StrCat("const ", StorageType(), "* src = ", n_.Global(a.tensor), ";"));
    w_.Open("if (valid > 0)");
    Decompose("bi", g.batch);
    Decompose("y", other);
    w_.Line(absl::StrCat("const long ", n_.I(c), " = e0, ", n_.V(c), " = ", n_.O(c), " + e0;"));
    w_.Line(absl::StrCat("src += ", GlobalOffset(a, n_), ";"));
    w_.Close();
    const std::string at = side.k_major ? PackIndex(side, l, "bi", "y", "e0") : PackIndex(side, l, "bi", "e0", "y");
    w_.Line(absl::StrCat("fusor_cp_async16(", buf, " + ", at, ", src, (int)valid * ", l.elem_bytes, ");"));
    w_.Close();
  }

  // The A fragment (rows r0.., reduction kk..) of a staged tile into `a`
  // (fusor_u32[4]); `g` and `t` are the lane's group and thread in it.
  void LoadAFragment(const GemmLayout& l, const std::string& buf, const std::string& a, const std::string& bi,
                     const std::string& r0, const std::string& kk) {
    if (l.kind == MmaKind::kTF32) {
      w_.Line("#pragma unroll");
      w_.Open("for (int i = 0; i < 4; ++i)");
      w_.Line(absl::StrCat(a, "[i] = fusor_bits(", buf, "[",
                           PackIndex(l.a, l, bi, r0 + " + g + 8 * (i % 2)", kk + " + t + 4 * (i / 2)"), "]);"));
      w_.Close();
    } else if (l.a.k_major) {
      w_.Line(absl::StrCat("fusor_ldmatrix_x4(", a, ", ", buf, " + ",
                           PackIndex(l.a, l, bi, r0 + " + lane % 16", kk + " + lane / 16 * 8"), ");"));
    } else {
      w_.Line(absl::StrCat("fusor_ldmatrix_x4_trans(", a, ", ", buf, " + ",
                           PackIndex(l.a, l, bi, r0 + " + (lane / 8) % 2 * 8", kk + " + lane / 16 * 8 + lane % 8"),
                           ");"));
    }
  }

  // The B fragment (columns n0.., reduction kk..) into `b` (fusor_u32[2]).
  void LoadBFragment(const GemmLayout& l, const std::string& buf, const std::string& b, const std::string& bi,
                     const std::string& n0, const std::string& kk) {
    const std::string n = "(" + n0 + ")";
    if (l.kind == MmaKind::kTF32) {
      w_.Line(absl::StrCat(b, "[0] = fusor_bits(", buf, "[", PackIndex(l.b, l, bi, n + " + g", kk + " + t"), "]);"));
      w_.Line(absl::StrCat(b, "[1] = fusor_bits(", buf, "[", PackIndex(l.b, l, bi, n + " + g", kk + " + t + 4"),
                           "]);"));
    } else if (l.b.k_major) {
      w_.Line(absl::StrCat("fusor_ldmatrix_x2(", b, ", ", buf, " + ",
                           PackIndex(l.b, l, bi, n + " + lane % 8", kk + " + (lane / 8) % 2 * 8"), ");"));
    } else {
      w_.Line(absl::StrCat("fusor_ldmatrix_x2_trans(", b, ", ", buf, " + ",
                           PackIndex(l.b, l, bi, n, kk + " + (lane / 8) % 2 * 8 + lane % 8"), ");"));
    }
  }

  void Mma(const GemmLayout& l, const std::string& c, const std::string& a, const std::string& b) {
    const char* fn = l.kind == MmaKind::kTF32  ? "fusor_mma_m16n8k8_tf32"
                     : l.kind == MmaKind::kF16 ? "fusor_mma_m16n8k16_f16"
                                               : "fusor_mma_m16n8k16_bf16";
    w_.Line(absl::StrCat(fn, "(", c, ", ", a, ", ", b, ");"));
  }

  // Warps take 16 x (8 nf) units of the tile and run the mma over its
  // whole reduction, accumulating into acc (f32, shared) between calls.
  void MmaTile(const space::OpNest& on) {
    const GemmLayout& l = gemm_[on.op];
    const std::string o = absl::StrCat(on.op);
    const int64_t rp = on.rows_pad, cp = on.cols_pad;
    const int nf = l.nf;
    w_.Open("");
    DefineGemmSizes(on, Sides::kBoth);
    w_.Line(absl::StrCat("const long units_r = rows_pad / 16L, units_c = (cols_pad + ", 8 * nf - 1, "L) / ", 8 * nf,
                         "L;"));
    w_.Open(absl::StrCat("for (long u = warp; u < nb * units_r * units_c; u += ", threads_ / 32, ")"));
    w_.Line("const long bi = u / (units_r * units_c), r0 = (u / units_c) % units_r * 16L, c0 = u % units_c * "
            + absl::StrCat(8 * nf) + "L;");
    w_.Line("const int g = lane / 4, t = lane % 4;");
    w_.Line(absl::StrCat("float c[", nf, "][4];"));
    auto acc_at = [&](const std::string& row, const std::string& col) {
      return absl::StrCat("acc", o, "[(bi * ", rp, "L + ", row, ") * ", cp, "L + ", col, "]");
    };
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int f = 0; f < ", nf, "; ++f)"));
    w_.Line("const long col = c0 + 8 * f + 2 * t;");
    w_.Line(absl::StrCat("c[f][0] = ", acc_at("r0 + g", "col"), "; c[f][1] = ", acc_at("r0 + g", "col + 1"), ";"));
    w_.Line(absl::StrCat("c[f][2] = ", acc_at("r0 + g + 8", "col"), "; c[f][3] = ", acc_at("r0 + g + 8", "col + 1"),
                         ";"));
    w_.Close();
    w_.Open(absl::StrCat("for (long kk = 0; kk < kc_pad; kk += ", l.kstep, ")"));
    w_.Line("fusor_u32 a[4];");
    LoadAFragment(l, "pa" + o, "a", "bi", "r0", "kk");
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int f = 0; f < ", nf, "; ++f)"));
    w_.Line("fusor_u32 b[2];");
    LoadBFragment(l, "pb" + o, "b", "bi", "c0 + 8 * f", "kk");
    Mma(l, "c[f]", "a", "b");
    w_.Close();
    w_.Close();  // kk
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int f = 0; f < ", nf, "; ++f)"));
    w_.Line("const long col = c0 + 8 * f + 2 * t;");
    w_.Line(absl::StrCat(acc_at("r0 + g", "col"), " = c[f][0]; ", acc_at("r0 + g", "col + 1"), " = c[f][1];"));
    w_.Line(absl::StrCat(acc_at("r0 + g + 8", "col"), " = c[f][2]; ", acc_at("r0 + g + 8", "col + 1"), " = c[f][3];"));
    w_.Close();
    w_.Close();  // units
    w_.Close();
    Sync();
  }

  const SideLayout& SideOf(const space::OpNest& on, bool a_side) const {
    return a_side ? gemm_[on.op].a : gemm_[on.op].b;
  }
  static int DepthOf(const space::OpNest& on, bool a_side) { return a_side ? on.a_depth : on.b_depth; }

  std::string StageType(const space::OpNest& on) const {
    return gemm_[on.op].kind == MmaKind::kTF32 ? "float" : "fusor_u16";
  }

  std::string StageVar(int d) const { return "stage_" + chain_.dims[d].name; }

  // Which of the two buffers the current step of `d`'s loop reads.
  void DefineStage(int d) {
    w_.Line(absl::StrCat("const long ", StageVar(d), " = (", n_.O(d), " / ", s_.tile[d], "L) % 2L;"));
  }

  std::string StagePointer(const space::OpNest& on, bool a_side, const std::string& stage) const {
    const std::string name = absl::StrCat(a_side ? "pa" : "pb", on.op);
    return absl::StrCat(StageType(on), "* const ", name, " = ", name, "_stages + (", stage, ") * ",
                        SideOf(on, a_side).stage_elems, "L;");
  }

  void CurrentStage(const space::OpNest& on, bool a_side) {
    const SideLayout& side = SideOf(on, a_side);
    w_.Line(StagePointer(on, a_side, StageVar(side.loop_dim)));
  }

  // Before the loop: the first step's tile into stage 0 (the caller commits).
  void FirstStage(const space::OpNest& on, bool a_side) {
    const int d = SideOf(on, a_side).loop_dim;
    w_.Line(absl::StrCat("// ", a_side ? "A" : "B", " of ", chain_.tensors[chain_.ops[on.op].output].name,
                         ": the first ", chain_.dims[d].name, " step's tile, into stage 0"));
    w_.Open("");
    w_.Line(absl::StrCat("const long ", n_.O(d), " = 0, ", n_.N(d), " = ", x_.RangeOf(d, "0L"), ";"));
    w_.Line(StagePointer(on, a_side, "0L"));
    Pack(on, a_side, /*wait=*/false);
    w_.Close();
  }

  // Issues the cp.async copies of the next step's tile of one side into
  // the other stage (nothing after the last step).
  void Prefetch(const space::OpNest& on, bool a_side) {
    const int d = SideOf(on, a_side).loop_dim;
    w_.Line(absl::StrCat("// prefetch ", a_side ? "A" : "B", " of the next ", chain_.dims[d].name, " step"));
    w_.Open("");
    w_.Line(absl::StrCat("const long next_origin = ", n_.O(d), " + ", s_.tile[d], "L;"));
    w_.Open(absl::StrCat("if (next_origin < ", chain_.dims[d].extent, "L)"));
    w_.Line(absl::StrCat("const long ", n_.O(d), " = next_origin, ", n_.N(d), " = ", x_.RangeOf(d, "next_origin"),
                         ";"));
    w_.Line(StagePointer(on, a_side, absl::StrCat("1L - ", StageVar(d))));
    Pack(on, a_side, /*wait=*/false);
    w_.Close();
    w_.Close();
  }

  void EmitGemmSum(const Op& op, const space::OpNest& on) {
    const space::GemmForm& g = on.gemm;
    const std::string o = absl::StrCat(on.op);
    const int num_loops = static_cast<int>(on.loops.size());
    for (int level = 0; level <= num_loops; ++level) {
      bool staged = false;
      if (level == on.num_out_loops) {
        ZeroShared("acc" + o, on.acc_floats);
        staged = true;
      }
      bool prefetched = false;
      for (bool a_side : {true, false}) {
        const bool here = a_side ? on.a_depth == level && !on.a_hoisted && !on.a_per_point
                                 : on.b_depth == level && !on.b_hoisted && !on.b_per_point;
        if (!here) continue;
        staged = true;
        if (SideOf(on, a_side).pipelined) {
          if (level > 0) CurrentStage(on, a_side);  // depth 0: defined with the op
          Prefetch(on, a_side);
          prefetched = true;
        } else {
          Pack(on, a_side);
        }
      }
      if (prefetched) {
        // This step's tile (committed one step earlier) has landed; the
        // next step's stays in flight.
        w_.Line("fusor_cp_async_commit();");
        w_.Line("fusor_cp_async_wait<1>();");
      }
      if (staged) Sync();
      if (level < num_loops) {
        // Tiles pipelined across this loop: the first step's before it.
        bool first = false;
        for (bool a_side : {true, false}) {
          const SideLayout& side = SideOf(on, a_side);
          if (side.pipelined && DepthOf(on, a_side) == level + 1) {
            FirstStage(on, a_side);
            first = true;
          }
        }
        if (first) w_.Line("fusor_cp_async_commit();");
        x_.OpenTileLoop(w_, on.loops[level]);
        if (first) DefineStage(on.loops[level]);
      }
    }
    w_.Open("");
    const int outer = emit::OpenPointLoops(w_, g.outer_reduce, n_);
    if (on.a_per_point) Pack(on, true);
    if (on.b_per_point) Pack(on, false);
    if (on.a_per_point || on.b_per_point) Sync();
    MmaTile(on);
    for (int i = 0; i < outer; ++i) w_.Close();
    w_.Close();
    for (int level = num_loops; level > on.num_out_loops; --level) w_.Close();
    // The finished tile, scaled, to its destinations.
    w_.Open("");
    std::vector<int> dims = g.batch;
    dims.insert(dims.end(), g.rows.begin(), g.rows.end());
    dims.insert(dims.end(), g.cols.begin(), g.cols.end());
    OpenParallelPoints(dims);
    std::string value = absl::StrCat("acc", o, "[((", FlatIndex(g.batch, n_), ") * ", on.rows_pad, "L + (",
                                     FlatIndex(g.rows, n_), ")) * ", on.cols_pad, "L + (", FlatIndex(g.cols, n_), ")]");
    if (g.scale != 1) value = absl::StrCat(value, " * ", FloatLit(g.scale));
    x_.Store(w_, on, value);
    w_.Close();
    Sync();
    w_.Close();
    for (int level = on.num_out_loops; level > 0; --level) w_.Close();
  }

  // A sum no intrinsic takes: one thread per output point.
  void EmitGenericSum(const Op& op, const space::OpNest& on) {
    const std::string acc = absl::StrCat("acc", on.op);
    for (int i = 0; i < on.num_out_loops; ++i) x_.OpenTileLoop(w_, on.loops[i]);
    ZeroShared(acc, on.acc_floats);
    Sync();
    for (size_t i = on.num_out_loops; i < on.loops.size(); ++i) x_.OpenTileLoop(w_, on.loops[i]);
    OpenParallelPoints(op.index);
    w_.Line("float s = 0.0f;");
    const int opened = emit::OpenPointLoops(w_, op.reduce, n_);
    w_.Line(absl::StrCat("s += ", ExprToC(op.body, [this](const Access& a) { return x_.Load(a); }), ";"));
    for (int i = 0; i < opened; ++i) w_.Close();
    w_.Line(absl::StrCat(acc, "[p] += s;"));
    w_.Close();
    for (size_t i = on.num_out_loops; i < on.loops.size(); ++i) w_.Close();
    Sync();
    OpenParallelPoints(op.index);
    x_.Store(w_, on, absl::StrCat(acc, "[p]"));
    w_.Close();
    Sync();
    for (int i = 0; i < on.num_out_loops; ++i) w_.Close();
  }

  // ---------------------------------------------------------- softmax ---

  void WarpReduce(const std::string& var, bool max) {
    w_.Line("#pragma unroll");
    w_.Open("for (int m = 16; m > 0; m /= 2)");
    w_.Line(absl::StrCat("const float other = fusor_shfl_xor(", var, ", m);"));
    w_.Line(max ? absl::StrCat(var, " = other > ", var, " ? other : ", var, ";")
                : absl::StrCat(var, " += other;"));
    w_.Close();
  }

  // One warp per row; lanes stride along the axis. Plain: max, sum of
  // exponentials, normalized values. Online (along the stream dim): the
  // tile's exponentials against the running max, the running sum, and the
  // factor the consumer rescales its accumulator by.
  void EmitSoftmax(const Op& op, const space::OpNest& on) {
    const int ax = op.axis;
    std::vector<int> rows;
    for (int d : op.index) {
      if (d != ax) rows.push_back(d);
    }
    const std::string x = ExprToC(op.body, [this](const Access& a) { return x_.Load(a); });
    const std::string axis_loop = absl::StrCat("for (long ", n_.I(ax), " = lane; ", n_.I(ax), " < ", n_.N(ax), "; ",
                                               n_.I(ax), " += 32)");
    const std::string axis_var = absl::StrCat("const long ", n_.V(ax), " = ", n_.O(ax), " + ", n_.I(ax), ";");
    const std::string o = absl::StrCat(on.op);
    w_.Open(absl::StrCat("for (long row = warp; row < ", Count(rows, n_), "; row += ", threads_ / 32, ")"));
    Decompose("row", rows);
    w_.Line("float mx = -FUSOR_INFINITY;");
    w_.Open(axis_loop);
    w_.Line(axis_var);
    w_.Line(absl::StrCat("const float x = ", x, ";"));
    w_.Line("mx = x > mx ? x : mx;");
    w_.Close();
    WarpReduce("mx", true);
    if (!on.online) {
      w_.Line("float total = 0.0f;");
      w_.Open(axis_loop);
      w_.Line(axis_var);
      w_.Line(absl::StrCat("total += expf(", x, " - mx);"));
      w_.Close();
      WarpReduce("total", false);
      w_.Line("const float inv = 1.0f / total;");
      w_.Open(axis_loop);
      w_.Line(axis_var);
      x_.Store(w_, on, absl::StrCat("expf(", x, " - mx) * inv"));
      w_.Close();
    } else {
      w_.Line(absl::StrCat("const long sr = ", x_.StateOffset(op), ";"));
      w_.Line(absl::StrCat("const float m_old = smax", o, "[sr];"));
      w_.Line("const float m_new = m_old > mx ? m_old : mx;");
      w_.Line("const float rescale = m_new == -FUSOR_INFINITY ? 1.0f : expf(m_old - m_new);");
      w_.Line("float total = 0.0f;");
      w_.Open(axis_loop);
      w_.Line(axis_var);
      w_.Line(absl::StrCat("const float e = m_new == -FUSOR_INFINITY ? 0.0f : expf(", x, " - m_new);"));
      w_.Line("total += e;");
      x_.Store(w_, on, "e");
      w_.Close();
      WarpReduce("total", false);
      w_.Open("if (lane == 0)");
      w_.Line(absl::StrCat("ssum", o, "[sr] = ssum", o, "[sr] * rescale + total;"));
      w_.Line(absl::StrCat("smax", o, "[sr] = m_new;"));
      w_.Line(absl::StrCat("sscale", o, "[sr] = rescale;"));
      w_.Close();
    }
    w_.Close();
    Sync();
  }

  // After the stream loop: divide by the online softmax's sums, write out.
  void EmitFinalize(const space::OpNest& on) {
    const Op& op = chain_.ops[on.op];
    const bool output = chain_.tensors[op.output].role == TensorRole::kOutput;
    if (on.online_softmax < 0 && !output) return;
    w_.Line(absl::StrCat("// ", chain_.tensors[op.output].name, " is complete"));
    w_.Open("");
    for (int d : op.index) {
      if (!x_.IsBlock(d)) {
        w_.Line(absl::StrCat("const long ", n_.O(d), " = 0, ", n_.N(d), " = ", chain_.dims[d].extent, "L;"));
      }
    }
    OpenParallelPoints(op.index);
    const std::string at = absl::StrCat(n_.Local(op.output), "[", x_.LocalOffset(emit::NestIndex::SelfAccess(op)), "]");
    if (on.online_softmax >= 0) {
      w_.Line(absl::StrCat(at, " /= ssum", on.online_softmax, "[", x_.StateOffset(chain_.ops[on.online_softmax]),
                           "];"));
    }
    if (output) {
      w_.Line(absl::StrCat(n_.Global(op.output), "[", GlobalOffset(emit::NestIndex::SelfAccess(op), n_), "] = ",
                           StoreConvert(chain_.dtype, at), ";"));
    }
    w_.Close();
    Sync();
    w_.Close();
  }

  // ------------------------------------------- registers (FlashAttention) ---
  //
  // Schedule "registers" (BuildLoopNest checked the shape: GEMM S, then
  // elementwise ops and an online softmax over S's points, then GEMM O over
  // the stream dim). Warp w owns rows 16w..16w+15 of the block's tile: S's
  // accumulator fragments stay in its registers, the elementwise ops and
  // the softmax run on them (row reductions across the 4 lanes of a
  // fragment row), and pairs of S fragments become the A fragments of O's
  // mma, whose accumulator lives in registers across the stream loop. Only
  // the GEMMs' other operands go through shared memory: S's A tile once,
  // S's B and O's B tile per stream step (prefetched with 2 stages).

  int LastOp() const { return static_cast<int>(chain_.ops.size()) - 1; }

  absl::Status RegisterLayout() {
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
      offset += RoundUp(side.bytes, 16) * (side.pipelined ? 2 : 1);
    };
    place(gemm_[0].a, gemm_[0].elem_bytes, false);
    place(gemm_[0].b, gemm_[0].elem_bytes, true);
    place(gemm_[last].b, gemm_[last].elem_bytes, true);
    shared_bytes_ = std::max<int64_t>(offset, 16);
    return absl::OkStatus();
  }

  // Issues this stream step's tile of a B side: the current stage and the
  // next step's prefetch, or a plain staging that waits.
  void StageStep(const space::OpNest& on) {
    if (SideOf(on, false).pipelined) {
      CurrentStage(on, false);
      Prefetch(on, false);
    } else {
      Pack(on, false);
    }
  }

  // The C expression of intermediate `t` at the current fragment element
  // (v_ of its dims defined): S's accumulator (scaled) or an elementwise
  // op's body over the earlier ones.
  std::string RegisterValue(int t) const {
    const int o = chain_.tensors[t].producer;
    if (o == 0) {
      const double scale = nest_.ops[0].gemm.scale;
      return scale == 1 ? "sf[f][e]" : absl::StrCat("sf[f][e] * ", FloatLit(scale));
    }
    return "(" + ExprToC(chain_.ops[o].body, [this](const Access& a) {
             return chain_.tensors[a.tensor].producer >= 0 ? RegisterValue(a.tensor) : x_.Load(a);
           }) + ")";
  }

  // The register-resident kernel's fragments per warp: S's accumulator
  // (nfs fragments of 8 columns) and its mma's k steps (ks); O's
  // accumulator (nfo) and its mma's k steps (kp).
  struct RegisterFragments {
    int64_t nfs = 0, ks = 0, nfo = 0, kp = 0;
  };

  void EmitRegisterResident() {
    const int last = LastOp(), sd = nest_.stream_dim;
    const space::OpNest& son = nest_.ops[0];
    const space::OpNest& oon = nest_.ops[last];
    const GemmLayout& ls = gemm_[0];
    const GemmLayout& lo = gemm_[last];
    const RegisterFragments f{son.cols_pad / 8, ls.k_pad / ls.kstep, oon.cols_pad / 8, lo.k_pad / lo.kstep};
    DefineRegisterStaging();
    w_.Line(absl::StrCat("// intermediates in registers: warp w owns rows 16w..16w+15 of the ",
                         chain_.dims[son.gemm.rows[0]].name, " tile"));
    w_.Line("const int g = lane / 4, t = lane % 4;");
    w_.Line(absl::StrCat("const long r0 = warp * 16L;"));
    w_.Line(absl::StrCat("const bool has_rows = r0 < ", son.rows_pad, "L;"));
    w_.Line(absl::StrCat("// A of ", chain_.tensors[chain_.ops[0].output].name, ", staged once"));
    Pack(son, /*a_side=*/true);
    bool pipeline = false;
    for (const space::OpNest* on : {&son, &oon}) {
      if (!SideOf(*on, false).pipelined) continue;
      FirstStage(*on, false);
      pipeline = true;
    }
    if (pipeline) w_.Line("fusor_cp_async_commit();");
    Sync();
    LoadQFragments(f);
    w_.Line(absl::StrCat("float of[", f.nfo, "][4];"));
    w_.Line(absl::StrCat("for (int f = 0; f < ", f.nfo, "; ++f) of[f][0] = of[f][1] = of[f][2] = of[f][3] = 0.0f;"));
    w_.Line("float row_max[2] = {-FUSOR_INFINITY, -FUSOR_INFINITY}, row_sum[2] = {0.0f, 0.0f};");

    w_.Line(absl::StrCat("// stream loop over ", chain_.dims[sd].name));
    x_.OpenTileLoop(w_, sd);
    if (pipeline) DefineStage(sd);
    StageStep(son);
    StageStep(oon);
    if (pipeline) {
      w_.Line("fusor_cp_async_commit();");
      w_.Line("fusor_cp_async_wait<1>();");
    }
    Sync();
    w_.Open("if (has_rows)");
    EmitScoreMma(f);
    EmitScoreOps(f);
    EmitFragmentSoftmax(f);
    EmitProbabilityMma(f);
    w_.Close();  // has_rows
    Sync();      // the next step's staging reuses these buffers
    w_.Close();  // stream loop
    EmitRegisterStore(f);
  }

  // The staging buffers of the GEMMs' shared-memory operands (S's A and B,
  // O's B), the block's origins, and the ranges no loop sets (the GEMMs'
  // reductions and O's columns), once.
  void DefineRegisterStaging() {
    const int last = LastOp(), sd = nest_.stream_dim;
    const space::OpNest& son = nest_.ops[0];
    const space::OpNest& oon = nest_.ops[last];
    const GemmLayout& ls = gemm_[0];
    const GemmLayout& lo = gemm_[last];
    const std::string stage_type = StageType(son);
    for (const auto& [side, name, op] :
         {std::tuple{&ls.a, "pa", 0}, std::tuple{&ls.b, "pb", 0}, std::tuple{&lo.b, "pb", last}}) {
      w_.Line(absl::StrCat(stage_type, "* const ", name, op, side->pipelined ? "_stages" : "", " = (", stage_type,
                           "*)(fusor_smem + ", side->offset, ");"));
    }
    x_.DefineBlockOrigins(w_, "blockIdx.x");
    std::vector<int> dims;
    for (const space::OpNest* on : {&son, &oon}) {
      const Op& op = chain_.ops[on->op];
      for (const std::vector<int>* list : {&op.index, &op.reduce}) {
        for (int d : *list) {
          if (!x_.IsBlock(d) && d != sd && std::find(dims.begin(), dims.end(), d) == dims.end()) dims.push_back(d);
        }
      }
    }
    for (int d : dims) {
      w_.Line(absl::StrCat("const long ", n_.O(d), " = 0, ", n_.N(d), " = ", chain_.dims[d].extent, "L;"));
    }
  }

  // The warp's A fragments of S (its 16 rows of the staged A tile), held
  // in registers for the whole stream loop.
  void LoadQFragments(const RegisterFragments& f) {
    const GemmLayout& ls = gemm_[0];
    w_.Line(absl::StrCat("fusor_u32 qf[", f.ks, "][4];"));
    w_.Open("if (has_rows)");
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int kq = 0; kq < ", f.ks, "; ++kq)"));
    LoadAFragment(ls, "pa0", "qf[kq]", "0L", "r0", absl::StrCat("kq * ", ls.kstep, "L"));
    w_.Close();
    w_.Close();
  }

  // S = A B over the whole reduction, in registers.
  void EmitScoreMma(const RegisterFragments& f) {
    const GemmLayout& ls = gemm_[0];
    w_.Line(absl::StrCat("float sf[", f.nfs, "][4];"));
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int f = 0; f < ", f.nfs, "; ++f)"));
    w_.Line("sf[f][0] = sf[f][1] = sf[f][2] = sf[f][3] = 0.0f;");
    w_.Line(absl::StrCat("if (8 * f >= ", n_.N(nest_.stream_dim), ") continue;  // columns this step did not stage"));
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int kq = 0; kq < ", f.ks, "; ++kq)"));
    w_.Line("fusor_u32 b[2];");
    LoadBFragment(ls, "pb0", "b", "0L", "8 * f", absl::StrCat("kq * ", ls.kstep, "L"));
    Mma(ls, "sf[f]", "qf[kq]", "b");
    w_.Close();
    w_.Close();
  }

  // The elementwise ops and the softmax's input, element by element;
  // points outside the extents are -inf (they weigh nothing).
  void EmitScoreOps(const RegisterFragments& f) {
    const int last = LastOp(), sd = nest_.stream_dim, rows_dim = nest_.ops[0].gemm.rows[0];
    int softmax = -1;
    for (int o = 1; o < last; ++o) softmax = chain_.ops[o].kind == OpKind::kSoftmax ? o : softmax;
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int f = 0; f < ", f.nfs, "; ++f)"));
    w_.Line("#pragma unroll");
    w_.Open("for (int e = 0; e < 4; ++e)");
    w_.Line("const long ri = r0 + g + 8 * (e / 2), ci = 8 * f + 2 * t + e % 2;");
    w_.Line("float x = -FUSOR_INFINITY;");
    w_.Open(absl::StrCat("if (ri < ", n_.N(rows_dim), " && ci < ", n_.N(sd), ")"));
    for (int d : chain_.ops[0].index) {
      const std::string within = d == rows_dim ? " + ri" : d == sd ? " + ci" : "";
      w_.Line(absl::StrCat("const long ", n_.V(d), " = ", n_.O(d), within, ";"));
    }
    w_.Line(absl::StrCat("x = ", ExprToC(chain_.ops[softmax].body, [this](const Access& a) {
                           return chain_.tensors[a.tensor].producer >= 0 ? RegisterValue(a.tensor) : x_.Load(a);
                         }),
                         ";"));
    w_.Close();
    w_.Line("sf[f][e] = x;");
    w_.Close();
    w_.Close();
  }

  // Online softmax per fragment row (g and g + 8), across the 4 lanes that
  // hold it; O's accumulator is rescaled with it.
  void EmitFragmentSoftmax(const RegisterFragments& f) {
    w_.Line("#pragma unroll");
    w_.Open("for (int h2 = 0; h2 < 2; ++h2)");
    w_.Line("float mx = -FUSOR_INFINITY;");
    w_.Line(absl::StrCat("for (int f = 0; f < ", f.nfs,
                         "; ++f) mx = fmaxf(mx, fmaxf(sf[f][2 * h2], sf[f][2 * h2 + 1]));"));
    w_.Line("mx = fmaxf(mx, fusor_shfl_xor(mx, 1));");
    w_.Line("mx = fmaxf(mx, fusor_shfl_xor(mx, 2));");
    w_.Line("const float m_new = fmaxf(row_max[h2], mx);");
    w_.Line("const float rescale = m_new == -FUSOR_INFINITY ? 1.0f : expf(row_max[h2] - m_new);");
    w_.Line("float total = 0.0f;");
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int f = 0; f < ", f.nfs, "; ++f)"));
    w_.Line("#pragma unroll");
    w_.Open("for (int c = 0; c < 2; ++c)");
    w_.Line("const float p = m_new == -FUSOR_INFINITY ? 0.0f : expf(sf[f][2 * h2 + c] - m_new);");
    w_.Line("sf[f][2 * h2 + c] = p;");
    w_.Line("total += p;");
    w_.Close();
    w_.Close();
    w_.Line("total += fusor_shfl_xor(total, 1);");
    w_.Line("total += fusor_shfl_xor(total, 2);");
    w_.Line("row_sum[h2] = row_sum[h2] * rescale + total;");
    w_.Line("row_max[h2] = m_new;");
    w_.Line(absl::StrCat("for (int f = 0; f < ", f.nfo,
                         "; ++f) { of[f][2 * h2] *= rescale; of[f][2 * h2 + 1] *= rescale; }"));
    w_.Close();
  }

  // O += P V. f16/bf16: two S fragments (16 columns) are one A fragment.
  // tf32: one S fragment is one A fragment, whose lane holds columns t
  // and t + 4 where the accumulator's holds 2t and 2t + 1: shuffled in
  // from the lanes of the same fragment row.
  void EmitProbabilityMma(const RegisterFragments& f) {
    const int last = LastOp();
    const GemmLayout& lo = gemm_[last];
    const std::string mma_in = chain_.dtype == ir::DType::kBF16 ? "fusor_f32_to_bf16" : "fusor_f32_to_f16";
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int kq = 0; kq < ", f.kp, "; ++kq)"));
    w_.Line(absl::StrCat("if (", lo.kstep, " * kq >= ", n_.N(nest_.stream_dim),
                         ") break;  // rows of B this step did not stage"));
    w_.Line("fusor_u32 a[4];");
    w_.Line("#pragma unroll");
    w_.Open("for (int i = 0; i < 4; ++i)");
    if (lo.kind == MmaKind::kTF32) {
      w_.Line("const int e = 2 * (i % 2), src = g * 4 + t / 2 + 2 * (i / 2);");
      w_.Line("const float lo = fusor_shfl(sf[kq][e], src), hi = fusor_shfl(sf[kq][e + 1], src);");
      w_.Line("a[i] = fusor_bits(fusor_round_tf32(t % 2 ? hi : lo));");
    } else {
      w_.Line("const int f = 2 * kq + i / 2, e = 2 * (i % 2);");
      w_.Line(absl::StrCat("a[i] = f < ", f.nfs, " ? (fusor_u32)", mma_in, "(sf[f][e]) | ((fusor_u32)", mma_in,
                           "(sf[f][e + 1]) << 16) : 0u;"));
    }
    w_.Close();
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int f = 0; f < ", f.nfo, "; ++f)"));
    w_.Line("fusor_u32 b[2];");
    LoadBFragment(lo, absl::StrCat("pb", last), "b", "0L", "8 * f", absl::StrCat("kq * ", lo.kstep, "L"));
    Mma(lo, "of[f]", "a", "b");
    w_.Close();
    w_.Close();
  }

  // After the stream loop: O = accumulator / row sum, to global memory.
  void EmitRegisterStore(const RegisterFragments& f) {
    const int last = LastOp();
    const space::OpNest& oon = nest_.ops[last];
    const int rows_dim = nest_.ops[0].gemm.rows[0], cols_dim = oon.gemm.cols[0];
    const Op& oop = chain_.ops[last];
    w_.Line(absl::StrCat("// ", chain_.tensors[oop.output].name, " is complete"));
    w_.Open("if (has_rows)");
    w_.Line("#pragma unroll");
    w_.Open(absl::StrCat("for (int f = 0; f < ", f.nfo, "; ++f)"));
    w_.Line("#pragma unroll");
    w_.Open("for (int e = 0; e < 4; ++e)");
    w_.Line("const long ri = r0 + g + 8 * (e / 2), ci = 8 * f + 2 * t + e % 2;");
    w_.Open(absl::StrCat("if (ri < ", n_.N(rows_dim), " && ci < ", n_.N(cols_dim), ")"));
    for (int d : oop.index) {
      const std::string within = d == rows_dim ? " + ri" : d == cols_dim ? " + ci" : "";
      w_.Line(absl::StrCat("const long ", n_.V(d), " = ", n_.O(d), within, ";"));
    }
    std::string value = "of[f][e] / row_sum[e / 2]";
    if (oon.gemm.scale != 1) value = absl::StrCat("(", value, ") * ", FloatLit(oon.gemm.scale));
    w_.Line(absl::StrCat(n_.Global(oop.output), "[", GlobalOffset(emit::NestIndex::SelfAccess(oop), n_), "] = ",
                         StoreConvert(chain_.dtype, value), ";"));
    w_.Close();
    w_.Close();
    w_.Close();
    w_.Close();
  }

  const Chain& chain_;
  const space::LoopNest& nest_;
  const space::Schedule& s_;
  Names n_;
  Writer w_;
  const int threads_;
  const int stages_;
  emit::NestIndex x_;
  std::vector<int64_t> local_offset_;  // bytes into shared memory; -1: none
  std::vector<int64_t> temp_offset_;   // per op
  std::vector<GemmLayout> gemm_;       // per op
  int64_t shared_bytes_ = 0;
};

// 32-bit index arithmetic (cheaper on a GPU) when every tensor and the
// grid fit in it: `long` becomes `int` and literals lose their L, outside
// comments.
bool IndexFits32(const Chain& chain, const space::LoopNest& nest) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  for (const ir::Tensor& t : chain.tensors) {
    if (t.NumElements() >= kLimit) return false;
  }
  for (const ir::Dim& d : chain.dims) {
    if (d.extent >= kLimit) return false;
  }
  return nest.num_blocks < kLimit;
}

std::string NarrowIndices(const std::string& source) {
  std::string out;
  size_t start = 0;
  auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  while (start < source.size()) {
    size_t end = source.find('\n', start);
    if (end == std::string::npos) end = source.size();
    std::string line = source.substr(start, end - start);
    const size_t first = line.find_first_not_of(' ');
    if (first == std::string::npos || line.compare(first, 2, "//") != 0) {
      std::string narrowed;
      for (size_t i = 0; i < line.size(); ++i) {
        const bool boundary = i == 0 || !word_char(line[i - 1]);
        if (boundary && line.compare(i, 4, "long") == 0 && (i + 4 == line.size() || !word_char(line[i + 4]))) {
          narrowed += "int";
          i += 3;
          continue;
        }
        if (boundary && std::isdigit(static_cast<unsigned char>(line[i]))) {
          size_t j = i;
          while (j < line.size() && std::isdigit(static_cast<unsigned char>(line[j]))) ++j;
          narrowed.append(line, i, j - i);
          if (j < line.size() && line[j] == 'L' && (j + 1 == line.size() || !word_char(line[j + 1]))) ++j;
          i = j - 1;
          continue;
        }
        narrowed += line[i];
      }
      line = narrowed;
    }
    out += line;
    if (end < source.size()) out += '\n';
    start = end + 1;
  }
  return out;
}

}  // namespace

absl::StatusOr<CudaKernel> EmitCudaFusedKernel(const ir::Chain& written, const space::LoopNest& nest,
                                               const std::string& schedule_text, const std::string& mapping) {
  if (nest.ops.size() != written.ops.size()) return absl::InvalidArgumentError("loop nest does not belong to this chain");
  // A regrouped schedule runs the regrouped chain: same inputs and outputs.
  const ir::Chain& chain = space::NestChain(written, nest);
  ASSIGN_OR_RETURN(CudaKernel k, CudaEmitter(chain, nest).Emit(schedule_text, mapping));
  if (IndexFits32(chain, nest)) k.source = NarrowIndices(k.source);
  nlohmann::json meta = {{"kernel", k.kernel_name},
                         {"language", "cuda"},
                         {"grid", k.grid},
                         {"threads", k.threads},
                         {"shared_bytes", k.shared_bytes},
                         {"arguments", "struct { const void* in[]; void* out[]; } by value"},
                         {"inputs", emit::TensorsJson(chain, chain.inputs)},
                         {"outputs", emit::TensorsJson(chain, chain.outputs)},
                         {"schedule", schedule_text},
                         {"mapping", mapping}};
  k.metadata_json = meta.dump(2);
  return k;
}

double CudaTolerance(ir::DType dtype) { return dtype == ir::DType::kBF16 ? 1e-2 : 2e-3; }

KernelSource ProgramEmulationHarness(const Program& program) {
  KernelSource k;
  k.extra_files = {{"fusor_device.h", std::string(CudaEmulationHeader())},
                   {"fusor_prelude.inc", std::string(CpuPreludeSource())}};
  Writer w;
  w.Line("// Runs a fusor GPU program through the host emulation: its kernels' exact");
  w.Line("// sources, each in its own namespace, and its GEMM steps as host loops.");
  w.Line("#include \"fusor_device.h\"");
  for (size_t i = 0; i < program.steps.size(); ++i) {
    const ProgramStep& s = program.steps[i];
    if (s.is_gemm) continue;
    k.extra_files.push_back({absl::StrCat("step", i, ".cu"), s.kernel.source});
    w.Line(absl::StrCat("namespace step", i, " {"));
    w.Line(absl::StrCat("#define ", s.kernel.name, " ", s.kernel.name, "_step", i));
    w.Line(absl::StrCat("#include \"step", i, ".cu\""));
    w.Line(absl::StrCat("#undef ", s.kernel.name));
    w.Line(absl::StrCat("static_assert(sizeof(FusorArgs) == ", s.kernel.args.size(), " * sizeof(void*), \"arguments\");"));
    w.Line("}");
  }
  w.Raw(R"(
static float fusor_load(const char* dtype, const void* p, long i) {
  if (dtype[0] == 'f' && dtype[1] == '3') return ((const float*)p)[i];
  const uint16_t h = ((const uint16_t*)p)[i];
  return dtype[0] == 'f' ? fusor_f16_to_f32(h) : fusor_bf16_to_f32(h);
}
static void fusor_store(const char* dtype, void* p, long i, float v) {
  if (dtype[0] == 'f' && dtype[1] == '3') ((float*)p)[i] = v;
  else ((uint16_t*)p)[i] = dtype[0] == 'f' ? fusor_f32_to_f16(v) : fusor_f32_to_bf16(v);
}
// Row-major C[m, n] = alpha * A[m, k] B[k, n] per batch (see GemmStep).
static void fusor_gemm(const char* dtype, int ta, int tb, long m, long n, long k, long lda, long ldb, long ldc,
                       long sa, long sb, long sc, long batch, float alpha, const void* a, const void* b, void* c,
                       long oa, long ob, long oc) {
  for (long z = 0; z < batch; ++z)
    for (long i = 0; i < m; ++i)
      for (long j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (long p = 0; p < k; ++p) {
          const long ia = oa + z * sa + (ta ? p * lda + i : i * lda + p);
          const long ib = ob + z * sb + (tb ? j * ldb + p : p * ldb + j);
          acc += fusor_load(dtype, a, ia) * fusor_load(dtype, b, ib);
        }
        fusor_store(dtype, c, oc + z * sc + i * ldc + j, alpha * acc);
      }
}

)");
  w.Open("extern \"C\" int fusor_run(const void* const* inputs, void* const* outputs, int num_threads)");
  w.Line(absl::StrCat("void* buf[", program.buffers.size(), "];"));
  for (size_t i = 0; i < program.buffers.size(); ++i) {
    const ProgramBuffer& b = program.buffers[i];
    if (b.input >= 0) {
      w.Line(absl::StrCat("buf[", i, "] = (void*)inputs[", b.input, "];"));
    } else if (b.output >= 0) {
      w.Line(absl::StrCat("buf[", i, "] = outputs[", b.output, "];"));
    } else {
      w.Line(absl::StrCat("buf[", i, "] = malloc(", b.bytes, ");"));
      w.Line(absl::StrCat("memset(buf[", i, "], 0xff, ", b.bytes, ");"));
    }
  }
  w.Line("int rc = 0;");
  for (size_t i = 0; i < program.steps.size(); ++i) {
    const ProgramStep& s = program.steps[i];
    w.Line(absl::StrCat("// ", s.what));
    if (s.is_gemm) {
      const GemmStep& g = s.gemm;
      w.Line(absl::StrCat("fusor_gemm(\"", g.dtype, "\", ", g.trans_a, ", ", g.trans_b, ", ", g.m, ", ", g.n, ", ", g.k,
                          ", ", g.lda, ", ", g.ldb, ", ", g.ldc, ", ", g.stride_a, ", ", g.stride_b, ", ", g.stride_c,
                          ", ", g.batch, ", ", FloatLit(g.alpha), ", buf[", g.a, "], buf[", g.b, "], buf[", g.c, "], ",
                          g.offset_a, ", ", g.offset_b, ", ", g.offset_c, ");"));
      continue;
    }
    const KernelStep& k2 = s.kernel;
    w.Open("if (rc == 0)");
    w.Line(absl::StrCat("step", i, "::FusorArgs args;"));
    w.Line(absl::StrCat("void* ptrs[] = {", absl::StrJoin(k2.args, ", ", [](std::string* out, int a) {
                          absl::StrAppend(out, "buf[", a, "]");
                        }), "};"));
    w.Line("memcpy(&args, ptrs, sizeof(args));");
    w.Line(absl::StrCat("rc = fusor_emu::Launch(step", i, "::", k2.name, "_step", i, ", dim3{", k2.grid,
                        ", 1, 1}, dim3{", k2.threads, ", 1, 1}, ", k2.shared_bytes, ", args, num_threads);"));
    w.Close();
  }
  for (size_t i = 0; i < program.buffers.size(); ++i) {
    if (program.buffers[i].input < 0 && program.buffers[i].output < 0) w.Line(absl::StrCat("free(buf[", i, "]);"));
  }
  w.Line("return rc;");
  w.Close();
  k.source = w.Take();
  k.compile_flags = {"-O1", "-std=gnu++17", "-fopenmp", "-fno-strict-aliasing", "-w"};
  return k;
}

}  // namespace fusor::codegen
