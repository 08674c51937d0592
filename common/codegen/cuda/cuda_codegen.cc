#include "common/codegen/cuda/cuda_codegen.h"

#include <algorithm>
#include <cctype>
#include <functional>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codegen/cpu/prelude.h"
#include "common/codegen/cuda/cuda_emitter.h"
#include "common/codegen/emit.h"
#include "common/util/status_macros.h"

namespace fusor::codegen {
namespace cuda {

using emit::Count;
using emit::ExprToC;
using emit::Writer;
using ir::Access;
using ir::Chain;
using ir::Op;

CudaEmitter::CudaEmitter(const Chain& chain, const space::LoopNest& nest)
    : NestWalker(chain, nest), threads_(32 * space::WarpsOf(nest.schedule)), stages_(space::StagesOf(nest.schedule)) {}

absl::StatusOr<CudaKernel> CudaEmitter::Emit(const std::string& schedule_text, const std::string& mapping) {
  RETURN_IF_ERROR(s_.registers ? RegisterLayout() : Layout());
  // A split kernel's block counts itself in through a word of shared memory.
  if (nest_.split > 1) shared_bytes_ = std::max<int64_t>(shared_bytes_, 16);
  const std::string type = StorageType();
  std::string head = absl::StrCat(
      "// fusor fused CUDA kernel for chain '", chain_.name, "'\n", "// schedule: ", schedule_text, "  (",
      space::TilingExpression(s_, chain_), ")\n", "// mapping:  ", mapping, "\n", "// grid: ", nest_.num_blocks,
      " blocks of ", threads_, " threads, ", shared_bytes_, " bytes of dynamic shared memory, ", stages_,
      stages_ == 1 ? " stage" : " stages", " of streamed tiles\n", "// chain:\n");
  for (const Op& op : chain_.ops) absl::StrAppend(&head, "//   ", ir::OpToString(op, chain_), "\n");
  head += "#include \"fusor_device.h\"\n\n";
  absl::StrAppend(&head, "struct FusorArgs {\n  const void* in[", chain_.inputs.size(), "];\n  void* out[",
                  chain_.outputs.size(), "];\n", nest_.split > 1 ? "  void* work;\n" : "", "};\n\n");

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
    if (nest_.split > 1) DefineSplitPart();
    x_.DefineBlockOrigins(w, TileIndex());
    WalkBlock();
    if (nest_.split > 1) EmitSharedSplitCombine();
  }
  w.Close();

  CudaKernel k;
  k.source = head + w.Take();
  k.grid = nest_.num_blocks;
  k.threads = threads_;
  k.shared_bytes = shared_bytes_;
  k.workspace_bytes = workspace_bytes_;
  return k;
}

void CudaEmitter::Decompose(const std::string& flat, const std::vector<int>& dims) {
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

// A split stream loop: this block's part, and the range part_lo..part_hi
// of the stream dim it runs.
void CudaEmitter::DefineSplitPart() {
  const int sd = nest_.stream_dim;
  const int64_t extent = chain_.dims[sd].extent;
  const int64_t per_part = (nest_.trips[sd] + nest_.split - 1) / nest_.split * s_.tile[sd];
  w_.Line(absl::StrCat("// split: part blockIdx.x % ", nest_.split, " of the ", chain_.dims[sd].name,
                       " loop, for tile blockIdx.x / ", nest_.split));
  w_.Line(absl::StrCat("const long part = blockIdx.x % ", nest_.split, "L, tile_id = ", TileIndex(), ";"));
  w_.Line(absl::StrCat("const long part_lo = part * ", per_part, "L, part_hi = part_lo + ", per_part, "L < ", extent,
                       "L ? part_lo + ", per_part, "L : ", extent, "L;"));
  w_.Line("(void)tile_id;");
}

// The stream loop over this block's range of the stream dim.
void CudaEmitter::OpenStreamTiles() {
  const int sd = nest_.stream_dim;
  if (nest_.split == 1) {
    x_.OpenTileLoop(w_, sd);
    return;
  }
  w_.Open(absl::StrCat("for (long ", n_.O(sd), " = part_lo; ", n_.O(sd), " < part_hi; ", n_.O(sd), " += ",
                       s_.tile[sd], "L)"));
  w_.Line(absl::StrCat("const long ", n_.N(sd), " = ", x_.RangeOf(sd, n_.O(sd)), ";"));
}

// Each block writes its part to the workspace and counts itself in on its
// tile's counter (a fence first, so that the tile's last block sees every
// part); the last block reads the parts past L1.
void CudaEmitter::CountInAndCombine(int64_t counters, const std::function<void()>& combine) {
  w_.Line(absl::StrCat("unsigned* const arrivals = (unsigned*)((float*)args.work + ", counters, "L);"));
  w_.Line("fusor_fence();  // this block's part is visible before it counts itself in");
  Sync();
  w_.Line("unsigned* const arrived = (unsigned*)fusor_smem;  // shared memory is free now");
  w_.Line("if (tid == 0) *arrived = fusor_arrive(arrivals + tile_id);");
  Sync();
  w_.Open(absl::StrCat("if (*arrived == ", nest_.split - 1, "u)"));
  w_.Line(absl::StrCat("// the tile's last part to finish combines the ", nest_.split, " parts"));
  w_.Line("fusor_fence();");
  w_.Line("const float* const work = (const float*)args.work;");
  combine();
  w_.Line("if (tid == 0) arrivals[tile_id] = 0u;  // ready for the next launch");
  w_.Close();
}

void CudaEmitter::OpenParallelPoints(const std::vector<int>& dims) {
  w_.Open(absl::StrCat("for (long p = tid; p < ", Count(dims, n_), "; p += ", threads_, ")"));
  Decompose("p", dims);
}

void CudaEmitter::ZeroShared(const std::string& ptr, int64_t floats) {
  w_.Line(absl::StrCat("for (long p = tid; p < ", floats, "L; p += ", threads_, ") ", ptr, "[p] = 0.0f;"));
}

void CudaEmitter::ZeroAccumulated(const space::OpNest& on) {
  const int t = chain_.ops[on.op].output;
  ZeroShared(n_.Local(t), nest_.local[t].floats);
}

void CudaEmitter::EmitMap(const Op& op, const space::OpNest& on) {
  OpenParallelPoints(op.index);
  x_.Store(w_, on, ExprToC(op.body, [this](const Access& a) { return x_.Load(a); }));
  w_.Close();
  Sync();
}

// A sum no intrinsic takes: one thread per output point.
void CudaEmitter::AccumulateSum(const Op& op, const space::OpNest& on) {
  OpenParallelPoints(op.index);
  w_.Line("float s = 0.0f;");
  const int opened = emit::OpenPointLoops(w_, op.reduce, n_);
  w_.Line(absl::StrCat("s += ", ExprToC(op.body, [this](const Access& a) { return x_.Load(a); }), ";"));
  emit::CloseScopes(w_, opened);
  w_.Line(absl::StrCat("acc", on.op, "[p] += s;"));
  w_.Close();
}

}  // namespace cuda

namespace {

using emit::FloatLit;
using emit::Writer;
using ir::Chain;

// 32-bit index arithmetic (cheaper on a GPU) when every tensor, the
// workspace and the grid fit in it: `long` becomes `int` and literals lose
// their L, outside comments.
bool IndexFits32(const Chain& chain, const space::LoopNest& nest, int64_t workspace_bytes) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  if (workspace_bytes / 4 >= kLimit) return false;
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
  if (!written.RangedDims().empty()) {
    return absl::UnimplementedError("the CUDA backend builds kernels of exact sizes only; a ranged dim is CPU-only");
  }
  // A regrouped schedule runs the regrouped chain: same inputs and outputs.
  const ir::Chain& chain = space::NestChain(written, nest);
  ASSIGN_OR_RETURN(CudaKernel k, cuda::CudaEmitter(chain, nest).Emit(schedule_text, mapping));
  if (IndexFits32(chain, nest, k.workspace_bytes)) k.source = NarrowIndices(k.source);
  nlohmann::json meta = {{"kernel", k.kernel_name},
                         {"language", "cuda"},
                         {"grid", k.grid},
                         {"threads", k.threads},
                         {"shared_bytes", k.shared_bytes},
                         {"arguments", k.workspace_bytes > 0
                                           ? "struct { const void* in[]; void* out[]; void* work; } by value"
                                           : "struct { const void* in[]; void* out[]; } by value"},
                         {"workspace_bytes", k.workspace_bytes},
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
    } else if (b.zeroed) {
      // Zero-filled once and kept across runs, as on the device.
      w.Line(absl::StrCat("static void* const zeroed", i, " = calloc(1, ", b.bytes, ");"));
      w.Line(absl::StrCat("buf[", i, "] = zeroed", i, ";"));
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
    const ProgramBuffer& b = program.buffers[i];
    if (b.input < 0 && b.output < 0 && !b.zeroed) w.Line(absl::StrCat("free(buf[", i, "]);"));
  }
  w.Line("return rc;");
  w.Close();
  k.source = w.Take();
  k.compile_flags = {"-O1", "-std=gnu++17", "-fopenmp", "-fno-strict-aliasing", "-w"};
  return k;
}

}  // namespace fusor::codegen

