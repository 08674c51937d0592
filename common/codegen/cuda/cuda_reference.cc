// The on-device reference a GPU candidate is validated against: the chain
// op by op in f32 — inputs converted to f32, GEMM-shaped sums through
// cuBLAS in plain f32 (no TF32) where their operands allow, every other op
// one thread per output point (a softmax: per row) accumulating in f32.
// Straightforward on purpose: it shares no schedule, staging or fragment
// code with the kernels it checks.
#include "absl/strings/str_cat.h"
#include "common/codegen/cuda/cuda_codegen.h"
#include "common/codegen/emit.h"

namespace fusor::codegen {
namespace {

using emit::ExprToC;
using emit::GlobalOffset;
using emit::Names;
using emit::Writer;
using ir::Chain;
using ir::Op;

constexpr int kThreads = 128;

// Defines v_d of `dims` from the flat index `flat` (the last dim fastest).
void Decompose(Writer& w, const Chain& chain, const Names& n, const std::string& flat, const std::vector<int>& dims) {
  w.Line(absl::StrCat("long q = ", flat, ";"));
  for (int i = static_cast<int>(dims.size()) - 1; i >= 0; --i) {
    const int64_t extent = chain.dims[dims[i]].extent;
    w.Line(absl::StrCat("const long ", n.V(dims[i]), " = q % ", extent, "L; q /= ", extent, "L;"));
  }
}

int64_t Points(const Chain& chain, const std::vector<int>& dims) {
  int64_t p = 1;
  for (int d : dims) p *= chain.dims[d].extent;
  return p;
}

// The head of a reference kernel with `inputs` input pointers and one
// output; `p` is the thread's flat index.
void OpenKernel(Writer& w, const std::string& what, size_t inputs) {
  w.Line(absl::StrCat("// fusor reference: ", what));
  w.Line("#include \"fusor_device.h\"\n");
  w.Line(absl::StrCat("struct FusorArgs {\n  const void* in[", std::max<size_t>(inputs, 1), "];\n  void* out[1];\n};\n"));
  w.Open(absl::StrCat("extern \"C\" __global__ void __launch_bounds__(", kThreads,
                      ") fusor_reference(const FusorArgs args)"));
  w.Line("const long p = (long)blockIdx.x * blockDim.x + threadIdx.x;");
}

// The kernel step of a finished kernel over `count` threads.
KernelStep CloseKernel(Writer& w, int64_t count, std::vector<int> args) {
  w.Close();
  KernelStep k;
  k.name = "fusor_reference";
  k.source = w.Take();
  k.threads = kThreads;
  k.grid = (count + kThreads - 1) / kThreads;
  k.args = std::move(args);
  return k;
}

// One op over f32 tensors: arguments are the tensors it reads, then its
// result.
KernelStep NaiveKernel(const Chain& chain, int o) {
  const Op& op = chain.ops[o];
  const Names n{chain};
  const std::vector<int> reads = ir::TensorsRead(op);
  Writer w;
  OpenKernel(w, absl::StrCat(ir::OpToString(op, chain), " (f32, one thread per ",
                             op.kind == ir::OpKind::kSoftmax ? "row" : "point", ")"),
             reads.size());
  for (size_t i = 0; i < reads.size(); ++i) {
    w.Line(absl::StrCat("const float* const ", n.Global(reads[i]), " = (const float*)args.in[", i, "];"));
  }
  w.Line(absl::StrCat("float* const ", n.Global(op.output), " = (float*)args.out[0];"));
  const auto load = [&](const ir::Access& a) { return absl::StrCat(n.Global(a.tensor), "[", GlobalOffset(a, n), "]"); };
  const std::string out = absl::StrCat(n.Global(op.output), "[", GlobalOffset(ir::ResultAccess(op), n), "]");
  std::vector<int> outer = op.index;
  if (op.kind == ir::OpKind::kSoftmax) outer.erase(std::find(outer.begin(), outer.end(), op.axis));
  const int64_t count = Points(chain, outer);
  w.Line(absl::StrCat("if (p >= ", count, "L) return;"));
  Decompose(w, chain, n, "p", outer);
  const std::string x = emit::CausalValue(op, n, ExprToC(op.body, load), "-FUSOR_INFINITY");
  if (op.kind == ir::OpKind::kMap) {
    w.Line(absl::StrCat(out, " = ", x, ";"));
  } else if (op.kind == ir::OpKind::kSum) {
    w.Line("float s = 0.0f;");
    for (int d : op.reduce) {
      w.Open(absl::StrCat("for (long ", n.V(d), " = 0; ", n.V(d), " < ", chain.dims[d].extent, "L; ++", n.V(d), ")"));
    }
    w.Line(absl::StrCat("s += ", x, ";"));
    for (size_t i = 0; i < op.reduce.size(); ++i) w.Close();
    w.Line(absl::StrCat(out, " = s;"));
  } else {
    const std::string axis = absl::StrCat("for (long ", n.V(op.axis), " = 0; ", n.V(op.axis), " < ",
                                          chain.dims[op.axis].extent, "L; ++", n.V(op.axis), ")");
    w.Line("float mx = -FUSOR_INFINITY, total = 0.0f;");
    w.Line(absl::StrCat(axis, " mx = fmaxf(mx, ", x, ");"));
    w.Line(absl::StrCat(axis, " total += expf(", x, " - mx);"));
    w.Line(absl::StrCat(axis, " ", out, " = expf(", x, " - mx) / total;"));
  }
  std::vector<int> args = reads;
  args.push_back(op.output);
  return CloseKernel(w, count, args);
}

// Input tensor `t` given in 16 bits (buffer `given`) into its f32 buffer.
KernelStep ConvertKernel(const Chain& chain, int t, int given) {
  const int64_t count = chain.tensors[t].NumElements();
  Writer w;
  OpenKernel(w, chain.tensors[t].name + " to f32", 1);
  w.Line(absl::StrCat("if (p < ", count, "L) ((float*)args.out[0])[p] = ",
                      emit::LoadConvert(chain.dtype, "((const fusor_u16*)args.in[0])[p]"), ";"));
  return CloseKernel(w, count, {given, t});
}

}  // namespace

Program EmitCudaReference(const Chain& chain) {
  Program p;
  // Buffers 0..T-1: the chain's tensors in f32 (outputs are the program's
  // outputs, in f32); then the 16-bit inputs as given.
  const bool convert = chain.dtype != ir::DType::kF32;
  std::vector<int> given(chain.tensors.size(), -1);
  for (const ir::Tensor& t : chain.tensors) p.buffers.push_back({t.NumElements() * 4});
  for (size_t i = 0; i < chain.outputs.size(); ++i) p.buffers[chain.outputs[i]].output = static_cast<int>(i);
  for (size_t i = 0; i < chain.inputs.size(); ++i) {
    const int t = chain.inputs[i];
    if (!convert) {
      p.buffers[t].input = static_cast<int>(i);
      continue;
    }
    given[t] = static_cast<int>(p.buffers.size());
    p.buffers.push_back({chain.tensors[t].NumElements() * ir::DTypeBytes(chain.dtype), static_cast<int>(i), -1});
    ProgramStep step;
    step.what = absl::StrCat(chain.tensors[t].name, " to f32");
    step.kernel = ConvertKernel(chain, t, given[t]);
    p.steps.push_back(std::move(step));
  }
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    ProgramStep step;
    step.what = ir::OpToString(chain.ops[o], chain);
    if (auto gemm = CublasGemmStep(chain, static_cast<int>(o))) {
      step.is_gemm = true;
      step.gemm = *gemm;
      step.gemm.dtype = "f32-exact";
      step.what += "  (cuBLAS, f32)";
    } else {
      step.kernel = NaiveKernel(chain, static_cast<int>(o));
    }
    p.steps.push_back(std::move(step));
  }
  return p;
}

}  // namespace fusor::codegen
