#include "common/codegen/cpu/cpu_emit.h"

#include "absl/strings/str_cat.h"
#include "common/codegen/cpu/cpu_codegen.h"
#include "common/codegen/cpu/prelude.h"

namespace fusor::codegen::cpu {

const std::vector<std::string>& CompileFlags() {
  static const auto* flags = new std::vector<std::string>{"-O3", "-march=native", "-std=gnu++17", "-fopenmp",
                                                          "-ffp-contract=fast", "-fno-math-errno"};
  return *flags;
}

std::string StorageType(ir::DType dtype) { return dtype == ir::DType::kF32 ? "float" : "uint16_t"; }

nlohmann::json KernelJson(const ir::Chain& chain, const std::string& schedule_text) {
  nlohmann::json meta = {
      {"entry_point", "fusor_run"},
      {"signature", "int fusor_run(const void* const* inputs, void* const* outputs, int num_threads)"},
      {"language", "c++"},
      {"inputs", emit::TensorsJson(chain, chain.inputs)},
      {"outputs", emit::TensorsJson(chain, chain.outputs)},
      {"schedule", schedule_text},
      {"compile_flags", CompileFlags()}};
  if (const std::vector<int> ranged = chain.RangedDims(); !ranged.empty()) {
    nlohmann::json dims = nlohmann::json::array();
    for (int d : ranged) {
      dims.push_back({{"name", chain.dims[d].name}, {"min", chain.dims[d].min}, {"max", chain.dims[d].extent}});
    }
    meta["dims"] = dims;
    meta["entry_point_dims"] = "fusor_run_dims";
    meta["signature_dims"] =
        "int fusor_run_dims(const long* dims, const void* const* inputs, void* const* outputs, int num_threads)";
    meta["note_dims"] =
        "dims: the ranged dims' sizes of the call, in this order; fusor_run runs at their largest sizes. A tensor's "
        "\"dims\" names the ranged dim of each axis that has one: its extent is that dim's size in the call";
  }
  return meta;
}

nlohmann::json PrepareJson(const std::vector<std::string>& packs) {
  return {{"packs", packs},
          {"signatures",
           {"void* fusor_prepare(const void* const* inputs)",
            "int fusor_run_prepared(const void* prepared, const void* const* inputs, void* const* outputs, "
            "int num_threads)",
            "void fusor_release(void* prepared)"}},
          {"note", "fusor_prepare packs the constant inputs once (null: out of memory; fusor_run still works); "
                   "fusor_run_prepared then skips packing them"}};
}

std::string Preamble(const std::string& title_comment) { return title_comment + CpuKernelPreamble(); }

void DeclareArguments(emit::Writer& w, const ir::Chain& chain, const emit::Names& n) {
  const std::string type = StorageType(chain.dtype);
  for (size_t i = 0; i < chain.inputs.size(); ++i) {
    int t = chain.inputs[i];
    w.Line(absl::StrCat("const ", type, "* const ", n.Global(t), " = (const ", type, "*)fusor_inputs[", i, "];"));
  }
  for (size_t i = 0; i < chain.outputs.size(); ++i) {
    int t = chain.outputs[i];
    w.Line(absl::StrCat(type, "* const ", n.Global(t), " = (", type, "*)fusor_outputs[", i, "];"));
  }
}

namespace {

const char* Suffix(ir::DType dtype) {
  switch (dtype) {
    case ir::DType::kF32: return "";
    case ir::DType::kF16: return "_f16";
    case ir::DType::kBF16: return "_bf16";
  }
  return "";
}

}  // namespace

std::string VectorLoad(const Lanes& l) {
  if (!l.value.empty()) return l.value;
  if (!l.stride_expr.empty()) {
    return absl::StrCat("fusor_vgather", Suffix(l.dtype), "(", l.ptr, ", ", l.stride_expr, ")");
  }
  if (l.stride == 0) return absl::StrCat("fusor_vsplat(", emit::LoadConvert(l.dtype, absl::StrCat("*(", l.ptr, ")")), ")");
  if (l.stride == 1) return absl::StrCat("fusor_vload", Suffix(l.dtype), "(", l.ptr, ")");
  return absl::StrCat("fusor_vgather", Suffix(l.dtype), "(", l.ptr, ", ", l.stride, "L)");
}

std::string VectorStore(const Lanes& l, const std::string& value) {
  if (!l.stride_expr.empty()) {
    return absl::StrCat("fusor_vscatter", Suffix(l.dtype), "(", l.ptr, ", ", l.stride_expr, ", ", value, ");");
  }
  if (l.stride == 1) return absl::StrCat("fusor_vstore", Suffix(l.dtype), "(", l.ptr, ", ", value, ");");
  return absl::StrCat("fusor_vscatter", Suffix(l.dtype), "(", l.ptr, ", ", l.stride, "L, ", value, ");");
}

std::string VectorFunc(ir::Func f) {
  switch (f) {
    case ir::Func::kRelu: return "fusor_vrelu";
    case ir::Func::kGelu: return "fusor_vgelu";
    case ir::Func::kGeluTanh: return "fusor_vgelu_tanh";
    case ir::Func::kExp: return "fusor_vexp";
    case ir::Func::kTanh: return "fusor_vtanh";
    case ir::Func::kSigmoid: return "fusor_vsigmoid";
  }
  return "";
}

std::string VectorExpr(const ir::Expr& e, const std::function<Lanes(const ir::Access&)>& lanes_of) {
  using Kind = ir::Expr::Kind;
  auto arg = [&](int i) { return VectorExpr(e.args[i], lanes_of); };
  switch (e.kind) {
    case Kind::kConst: return absl::StrCat("fusor_vsplat(", emit::FloatLit(e.value), ")");
    case Kind::kAccess: return VectorLoad(lanes_of(e.access));
    case Kind::kAdd: return absl::StrCat("(", arg(0), " + ", arg(1), ")");
    case Kind::kSub: return absl::StrCat("(", arg(0), " - ", arg(1), ")");
    case Kind::kMul: return absl::StrCat("(", arg(0), " * ", arg(1), ")");
    case Kind::kDiv: return absl::StrCat("(", arg(0), " / ", arg(1), ")");
    case Kind::kNeg: return absl::StrCat("(-", arg(0), ")");
    case Kind::kCall: return absl::StrCat(VectorFunc(e.func), "(", arg(0), ")");
  }
  return "fusor_vsplat(0.0f)";
}

void VectorLoop(emit::Writer& w, const std::string& var, const std::string& count, const std::string& define,
                const std::function<void(bool vector)>& body, bool masked_tail) {
  static const char* const kMasked[] = {"fusor_vload",      "fusor_vstore",      "fusor_vgather",
                                        "fusor_vscatter",   "fusor_vload_f16",   "fusor_vstore_f16",
                                        "fusor_vload_bf16", "fusor_vstore_bf16", "fusor_vgather_f16",
                                        "fusor_vgather_bf16", "fusor_vscatter_f16", "fusor_vscatter_bf16"};
  w.Open("");
  w.Line(absl::StrCat("long ", var, " = 0;"));
  w.Open(absl::StrCat("for (; ", var, " + FUSOR_VL <= ", count, "; ", var, " += FUSOR_VL)"));
  if (!define.empty()) w.Line(define);
  body(true);
  w.Close();
  if (masked_tail) {
    w.Line("#if FUSOR_VL == 16");
    w.Open(absl::StrCat("if (", var, " < ", count, ")"));
    if (!define.empty()) w.Line(define);
    w.Line(absl::StrCat("const __mmask16 fusor_m = fusor_mask(", count, " - ", var, ");"));
    for (const char* f : kMasked) w.Line(absl::StrCat("#define ", f, "(...) ", f, "_m(__VA_ARGS__, fusor_m)"));
    body(true);
    for (const char* f : kMasked) w.Line(absl::StrCat("#undef ", f));
    w.Close();
    w.Line("#else");
  }
  w.Open(absl::StrCat("for (; ", var, " < ", count, "; ++", var, ")"));
  if (!define.empty()) w.Line(define);
  body(false);
  w.Close();
  if (masked_tail) w.Line("#endif");
  w.Close();
}

}  // namespace fusor::codegen::cpu

namespace fusor::codegen {

std::string CpuKernelPreamble() {
  std::string s = "#define FUSOR_KERNEL 1\n";
  s += "#include <stdint.h>\n#include <stdlib.h>\n#include <string.h>\n#include <math.h>\n";
  s += "#if defined(__AVX512F__) || defined(__F16C__)\n#include <immintrin.h>\n#endif\n\n";
  s += std::string(CpuPreludeSource());
  s += "\n";
  s += std::string(CpuSimdSource());
  s += "\n";
  return s;
}

}  // namespace fusor::codegen
