// The unfused GPU baseline: what a framework runs for the chain. Each op
// over whole tensors in turn, intermediates in global memory in the
// chain's dtype; GEMM-shaped sums whose operands cuBLAS can read in place
// go to cuBLAS, every other op (softmax, elementwise, convolutions) is its
// own kernel from this generator, scheduled by the cost model alone.
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/codegen/cuda/cuda_codegen.h"
#include "common/codegen/emit.h"
#include "common/hw/intrinsic.h"
#include "common/ir/parse.h"
#include "common/mapping/mapping.h"
#include "common/space/space.h"
#include "common/util/status_macros.h"

namespace fusor::codegen {
namespace {

using ir::Chain;
using ir::Op;

// The extent and stride of `dims` read as one flattened dim of an
// operand (row-major order), or nullopt when its strides do not chain.
std::optional<std::pair<int64_t, int64_t>> Flatten(const Chain& chain, const std::vector<int>& dims,
                                                   const std::map<int, int64_t>& strides) {
  int64_t extent = 1, stride = 0;
  for (int i = static_cast<int>(dims.size()) - 1; i >= 0; --i) {
    auto it = strides.find(dims[i]);
    const int64_t s = it == strides.end() ? 0 : it->second;
    if (extent == 1) {
      stride = s;
    } else if (s != stride * extent) {
      return std::nullopt;
    }
    extent *= chain.dims[dims[i]].extent;
  }
  return std::make_pair(extent, stride);
}

}  // namespace

std::optional<GemmStep> CublasGemmStep(const Chain& chain, int o) {
  const Op& op = chain.ops[o];
  if (op.kind != ir::OpKind::kSum) return std::nullopt;
  auto sw = mapping::ViewOp(chain, o);
  if (!sw.ok()) return std::nullopt;
  auto m = mapping::DefaultMapping(chain, *sw, *hw::FindIntrinsic("scalar.4x4"));
  if (!m) return std::nullopt;
  space::GemmForm g = space::FormOf(chain, *sw, *m);
  if (!g.ok || g.a_side.size() != 1 || g.b_side.size() != 1 || g.rows.empty() || g.cols.empty()) return std::nullopt;
  for (const ir::Access* a : {&g.a_side[0], &g.b_side[0]}) {
    for (const ir::AffineExpr& e : a->index) {
      if (!e.IsPlainDim()) return std::nullopt;
    }
  }
  const ir::Access self = ir::ResultAccess(op);
  int64_t ca = 0, cb = 0, cc = 0;
  auto sa = emit::GlobalStrides(g.a_side[0], chain, &ca);
  auto sb = emit::GlobalStrides(g.b_side[0], chain, &cb);
  auto sc = emit::GlobalStrides(self, chain, &cc);
  // The output's contiguous dim goes in the columns; leading row or column
  // dims that do not flatten with the rest become batch dims (the n of a
  // 1x1 convolution over (n, p, q)).
  auto stride_of = [](const std::map<int, int64_t>& s, int d) {
    auto it = s.find(d);
    return it == s.end() ? int64_t{0} : it->second;
  };
  if (stride_of(sc, g.cols.back()) != 1) {
    std::swap(g.rows, g.cols);
    std::swap(g.a_side, g.b_side);
    std::swap(sa, sb);
    std::swap(ca, cb);
  }
  for (std::vector<int>* own : {&g.rows, &g.cols}) {
    while (own->size() > 1 && !Flatten(chain, *own, sc)) {
      g.batch.push_back(own->front());
      own->erase(own->begin());
    }
  }
  const auto c_cols = Flatten(chain, g.cols, sc);
  const auto a_rows = Flatten(chain, g.rows, sa), a_k = Flatten(chain, op.reduce, sa);
  const auto b_cols = Flatten(chain, g.cols, sb), b_k = Flatten(chain, op.reduce, sb);
  const auto c_rows = Flatten(chain, g.rows, sc);
  const auto a_batch = Flatten(chain, g.batch, sa), b_batch = Flatten(chain, g.batch, sb),
             c_batch = Flatten(chain, g.batch, sc);
  for (const auto& f : {a_rows, a_k, b_cols, b_k, c_rows, c_cols, a_batch, b_batch, c_batch}) {
    if (!f) return std::nullopt;
  }
  const int64_t m_ext = a_rows->first, n_ext = b_cols->first, k_ext = a_k->first;
  if (c_cols->second != 1 || c_rows->second < n_ext) return std::nullopt;
  GemmStep step;
  step.m = m_ext;
  step.n = n_ext;
  step.k = k_ext;
  step.alpha = g.scale;
  if (a_k->second == 1 && a_rows->second >= k_ext) {
    step.lda = a_rows->second;
  } else if (a_rows->second == 1 && a_k->second >= m_ext) {
    step.trans_a = true;
    step.lda = a_k->second;
  } else {
    return std::nullopt;
  }
  if (b_cols->second == 1 && b_k->second >= n_ext) {
    step.ldb = b_k->second;
  } else if (b_k->second == 1 && b_cols->second >= k_ext) {
    step.trans_b = true;
    step.ldb = b_cols->second;
  } else {
    return std::nullopt;
  }
  step.ldc = c_rows->second;
  step.batch = c_batch->first;
  step.stride_a = a_batch->second;
  step.stride_b = b_batch->second;
  step.stride_c = c_batch->second;
  step.offset_a = ca;
  step.offset_b = cb;
  step.offset_c = cc;
  step.a = g.a_side[0].tensor;
  step.b = g.b_side[0].tensor;
  step.c = op.output;
  step.dtype = std::string(ir::DTypeName(chain.dtype));
  return step;
}

namespace {

// The op alone as a chain: the tensors it reads as inputs, its result as
// the output, the dims it uses.
absl::StatusOr<Chain> SingleOpChain(const Chain& chain, int o, std::vector<int>* reads) {
  const Op& op = chain.ops[o];
  std::set<int> dims(op.index.begin(), op.index.end());
  dims.insert(op.reduce.begin(), op.reduce.end());
  std::vector<std::string> decls;
  *reads = ir::TensorsRead(op);
  for (int read : *reads) {
    const ir::Tensor& t = chain.tensors[read];
    std::vector<std::string> axes;
    for (size_t i = 0; i < t.shape.size(); ++i) {
      const int d = i < t.axis_dims.size() ? t.axis_dims[i] : -1;
      if (d >= 0) dims.insert(d);
      axes.push_back(d >= 0 ? chain.dims[d].name : absl::StrCat(t.shape[i]));
    }
    decls.push_back(absl::StrCat(t.name, "[", absl::StrJoin(axes, ","), "]"));
  }
  std::string text = absl::StrCat("chain ", chain.name, "_op", o, "\ndtype ", ir::DTypeName(chain.dtype), "\ndim");
  for (int d : dims) absl::StrAppend(&text, " ", chain.dims[d].name, "=", chain.dims[d].extent);
  absl::StrAppend(&text, "\nin ", absl::StrJoin(decls, " "), "\n", ir::OpToString(op, chain), "\nout ",
                  chain.tensors[op.output].name, "\n");
  return ir::ParseChainText(text);
}

}  // namespace

absl::StatusOr<Program> EmitCudaUnfusedBaseline(const Chain& chain, const hw::TargetDesc& target) {
  Program p;
  for (const ir::Tensor& t : chain.tensors) p.buffers.push_back({t.NumElements() * ir::DTypeBytes(chain.dtype)});
  for (size_t i = 0; i < chain.inputs.size(); ++i) p.buffers[chain.inputs[i]].input = static_cast<int>(i);
  for (size_t i = 0; i < chain.outputs.size(); ++i) p.buffers[chain.outputs[i]].output = static_cast<int>(i);
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    ProgramStep step;
    step.what = ir::OpToString(chain.ops[o], chain);
    if (auto gemm = CublasGemmStep(chain, static_cast<int>(o))) {
      step.is_gemm = true;
      step.gemm = *gemm;
      step.what += "  (cuBLAS)";
      p.steps.push_back(step);
      continue;
    }
    std::vector<int> reads;
    ASSIGN_OR_RETURN(Chain single, SingleOpChain(chain, static_cast<int>(o), &reads));
    ASSIGN_OR_RETURN(space::Space space, space::BuildSpace(single, target));
    absl::Status last = absl::FailedPreconditionError(absl::StrCat("no schedule for ", step.what));
    for (size_t i = 0; i < space.ranked.size() && i < 8; ++i) {
      auto nest = space::BuildLoopNest(single, space.ranked[i].schedule, target);
      if (!nest.ok()) continue;
      const std::string text = space::ScheduleToText(space.ranked[i].schedule, single);
      auto kernel = EmitCudaFusedKernel(single, *nest, text, space.ranked[i].mappings);
      if (!kernel.ok()) {
        last = kernel.status();
        continue;
      }
      step.kernel.name = kernel->kernel_name;
      step.kernel.source = kernel->source;
      step.kernel.grid = kernel->grid;
      step.kernel.threads = kernel->threads;
      step.kernel.shared_bytes = kernel->shared_bytes;
      step.kernel.args = reads;
      step.kernel.args.push_back(chain.ops[o].output);
      step.what += absl::StrCat("  (kernel, ", text, ")");
      break;
    }
    if (step.kernel.source.empty()) return last;
    p.steps.push_back(step);
  }
  return p;
}

Program FusedProgram(const ir::Chain& chain, const CudaKernel& kernel) {
  Program p;
  KernelStep k;
  k.name = kernel.kernel_name;
  k.source = kernel.source;
  k.grid = kernel.grid;
  k.threads = kernel.threads;
  k.shared_bytes = kernel.shared_bytes;
  for (size_t i = 0; i < chain.inputs.size(); ++i) {
    p.buffers.push_back({chain.tensors[chain.inputs[i]].NumElements() * ir::DTypeBytes(chain.dtype),
                         static_cast<int>(i), -1});
    k.args.push_back(static_cast<int>(p.buffers.size()) - 1);
  }
  for (size_t i = 0; i < chain.outputs.size(); ++i) {
    p.buffers.push_back({chain.tensors[chain.outputs[i]].NumElements() * ir::DTypeBytes(chain.dtype), -1,
                         static_cast<int>(i)});
    k.args.push_back(static_cast<int>(p.buffers.size()) - 1);
  }
  if (kernel.workspace_bytes > 0) {
    p.buffers.push_back({kernel.workspace_bytes, -1, -1, /*zeroed=*/true});
    k.args.push_back(static_cast<int>(p.buffers.size()) - 1);
  }
  ProgramStep step;
  step.what = "fused kernel";
  step.kernel = std::move(k);
  p.steps.push_back(std::move(step));
  return p;
}

}  // namespace fusor::codegen
