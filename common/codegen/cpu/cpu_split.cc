// The kernel of a split schedule (space/split.h): each part's kernel, as
// emitted for its own chain, in a namespace of its own after one shared
// preamble, and a fusor_run that calls them in turn, the tensors handed on
// in buffers of its own.
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/codegen/cpu/cpu_codegen.h"
#include "common/codegen/cpu/cpu_emit.h"
#include "common/codegen/emit.h"
#include "common/space/schedule.h"
#include "common/space/split.h"
#include "common/util/status_macros.h"

namespace fusor::codegen {
namespace {

constexpr const char* kPartNames[2] = {"fusor_head", "fusor_tail"};

absl::StatusOr<KernelSource> PartKernel(const ir::Chain& part, const std::string& text,
                                        const hw::TargetDesc& target) {
  if (const std::string vendor = space::UnfusedVendor(text); !vendor.empty()) {
    if (const std::optional<CpuBlas> blas = CpuBlasNamed(vendor)) return EmitCpuUnfusedBaseline(part, *blas);
    return absl::InvalidArgumentError(absl::StrCat("no CPU library '", vendor, "' to run a part through"));
  }
  ASSIGN_OR_RETURN(space::Schedule schedule, space::ParseSchedule(text, part));
  ASSIGN_OR_RETURN(space::LoopNest nest, space::BuildLoopNest(part, schedule, target));
  return EmitCpuFusedKernel(part, nest, text, space::DescribeMappings(part, nest));
}

// The C expression of the pointer to tensor `name` of the chain as a part
// sees it: an argument of fusor_run, or a buffer handed on.
std::string Pointer(const ir::Chain& chain, const std::string& name) {
  const int t = chain.FindTensor(name);
  for (size_t i = 0; i < chain.inputs.size(); ++i) {
    if (chain.inputs[i] == t) return absl::StrCat("fusor_inputs[", i, "]");
  }
  for (size_t i = 0; i < chain.outputs.size(); ++i) {
    if (chain.outputs[i] == t) return absl::StrCat("fusor_outputs[", i, "]");
  }
  return absl::StrCat("fusor_h_", name, ".p");
}

// fusor_split_run, which runs the head and then the tail on the tensors
// the head hands on (a calling thread's buffers), and fusor_run.
void EmitSplitRun(const ir::Chain& chain, const space::SplitSchedule& split, const std::array<bool, 2>& prepared,
                  emit::Writer& w) {
  w.Line("// A calling thread's buffer of a tensor the head hands on to the tail, kept for its next call.");
  w.Line("struct fusor_handed_on { void* p = 0; ~fusor_handed_on() { free(p); } };");
  w.Line("struct fusor_split_prep_t { void* part[2]; };");
  w.Line("");
  w.Open("static int fusor_split_run(const fusor_split_prep_t* prep, const void* const* fusor_inputs, "
         "void* const* fusor_outputs, int num_threads)");
  w.Line("(void)prep;");
  for (const std::string& name : split.chains.handed_on) {
    const ir::Tensor& t = chain.tensors[chain.FindTensor(name)];
    const std::string buf = absl::StrCat("fusor_h_", name);
    w.Line(absl::StrCat("static thread_local fusor_handed_on ", buf, ";"));
    w.Line(absl::StrCat("if (!", buf, ".p) ", buf, ".p = malloc(", t.NumElements() * ir::DTypeBytes(chain.dtype),
                        "UL);"));
    w.Line(absl::StrCat("if (!", buf, ".p) return 1;"));
  }
  w.Line("int failed = 0;");
  for (int p = 0; p < 2; ++p) {
    const ir::Chain& part = split.chains.parts[p];
    const std::string ns = kPartNames[p];
    auto pointers = [&](const std::vector<int>& tensors, const char* cast) {
      return absl::StrJoin(tensors, ", ", [&](std::string* s, int t) {
        absl::StrAppend(s, cast, Pointer(chain, part.tensors[t].name));
      });
    };
    w.Open("");
    w.Line(absl::StrCat("const void* const in[] = {", pointers(part.inputs, "(const void*)"), "};"));
    w.Line(absl::StrCat("void* const out[] = {", pointers(part.outputs, ""), "};"));
    w.Line(prepared[p] ? absl::StrCat("failed = ", ns, "::fusor_run_prepared(prep ? prep->part[", p,
                                      "] : 0, in, out, num_threads);")
                       : absl::StrCat("failed = ", ns, "::fusor_run(in, out, num_threads);"));
    w.Close();
    if (p == 0) w.Line("if (failed) return failed;");
  }
  w.Line("return failed;");
  w.Close();
  w.Line("");
  w.Line("extern \"C\" int fusor_run(const void* const* fusor_inputs, void* const* fusor_outputs, int num_threads) {");
  w.Line("  return fusor_split_run(0, fusor_inputs, fusor_outputs, num_threads);");
  w.Line("}");
}

// fusor_prepare, fusor_release and fusor_run_prepared over the parts'
// own, for a kernel one of whose parts packs constant inputs.
void EmitSplitPrepare(const ir::Chain& chain, const space::SplitSchedule& split, const std::array<bool, 2>& prepared,
                      emit::Writer& w) {
  w.Line("");
  w.Open("extern \"C\" void fusor_release(void* prepared)");
  w.Line("fusor_split_prep_t* p = (fusor_split_prep_t*)prepared;");
  w.Line("if (!p) return;");
  for (int p = 0; p < 2; ++p) {
    if (!prepared[p]) continue;
    w.Line(absl::StrCat("if (p->part[", p, "]) ", kPartNames[p], "::fusor_release(p->part[", p, "]);"));
  }
  w.Line("free(p);");
  w.Close();
  w.Line("");
  w.Line("// Packs each part's constant inputs once (other inputs are not read); null when memory ran out.");
  w.Open("extern \"C\" void* fusor_prepare(const void* const* fusor_inputs)");
  w.Line("fusor_split_prep_t* p = (fusor_split_prep_t*)calloc(1, sizeof(fusor_split_prep_t));");
  w.Line("if (!p) return 0;");
  for (int p = 0; p < 2; ++p) {
    if (!prepared[p]) continue;
    const ir::Chain& part = split.chains.parts[p];
    w.Open("");
    w.Line(absl::StrCat("const void* const in[] = {", absl::StrJoin(part.inputs, ", ", [&](std::string* s, int t) {
                          const int c = chain.FindTensor(part.tensors[t].name);
                          s->append(chain.tensors[c].role == ir::TensorRole::kInput
                                        ? Pointer(chain, part.tensors[t].name)
                                        : "0");
                        }), "};"));
    w.Line(absl::StrCat("p->part[", p, "] = ", kPartNames[p], "::fusor_prepare(in);"));
    w.Line(absl::StrCat("if (!p->part[", p, "]) { fusor_release(p); return 0; }"));
    w.Close();
  }
  w.Line("return p;");
  w.Close();
  w.Line("");
  w.Line("extern \"C\" int fusor_run_prepared(const void* prepared, const void* const* fusor_inputs,");
  w.Line("                                    void* const* fusor_outputs, int num_threads) {");
  w.Line("  return fusor_split_run((const fusor_split_prep_t*)prepared, fusor_inputs, fusor_outputs, num_threads);");
  w.Line("}");
}

}  // namespace

absl::StatusOr<KernelSource> EmitCpuSplitKernel(const ir::Chain& chain, const std::string& schedule_text,
                                                const hw::TargetDesc& target) {
  if (!chain.RangedDims().empty()) {
    return absl::InvalidArgumentError("a chain with ranged dims runs as one fused kernel, not split");
  }
  ASSIGN_OR_RETURN(space::SplitSchedule split, space::ParseSplit(schedule_text, chain));
  const std::string preamble = CpuKernelPreamble();
  std::string title = absl::StrCat("// fusor partly fused CPU kernel for chain '", chain.name, "'\n// schedule: ",
                                   schedule_text, "\n");
  std::set<std::string> includes;
  std::string parts_code;
  std::set<std::string> link_libs;
  nlohmann::json parts_meta = nlohmann::json::array();
  std::vector<std::string> packs;
  std::array<bool, 2> prepared{};
  for (int p = 0; p < 2; ++p) {
    const ir::Chain& part = split.chains.parts[p];
    ASSIGN_OR_RETURN(KernelSource kernel, PartKernel(part, split.texts[p], target));
    const size_t at = kernel.source.find(preamble);
    if (at == std::string::npos) return absl::InternalError("a part's kernel lacks the CPU preamble");
    // Its headers go before the namespaces; its entry points become the
    // namespace's own.
    std::string body;
    for (absl::string_view line : absl::StrSplit(kernel.source.substr(at + preamble.size()), '\n')) {
      if (absl::StartsWith(line, "#include")) {
        includes.insert(std::string(line));
      } else {
        absl::StrAppend(&body, line, "\n");
      }
    }
    body = absl::StrReplaceAll(body, {{"extern \"C\" ", "static "}});
    std::vector<std::string> ops;
    for (const ir::Op& op : part.ops) ops.push_back(part.tensors[op.output].name);
    absl::StrAppend(&title, "//   ", p == 0 ? "head" : "tail", " (", absl::StrJoin(ops, ", "), "): ", split.texts[p],
                    "\n");
    absl::StrAppend(&parts_code, "namespace ", kPartNames[p], " {\n", body, "}  // namespace ", kPartNames[p],
                    "\n\n");
    link_libs.insert(kernel.link_libs.begin(), kernel.link_libs.end());
    const nlohmann::json meta = nlohmann::json::parse(kernel.metadata_json);
    if (meta.contains("prepare")) {
      prepared[p] = true;
      for (const auto& pack : meta["prepare"]["packs"]) packs.push_back(pack.get<std::string>());
    }
    parts_meta.push_back({{"chain", ir::ChainToText(part)}, {"schedule", split.texts[p]}});
  }

  emit::Writer w;
  const bool any_prepared = prepared[0] || prepared[1];
  EmitSplitRun(chain, split, prepared, w);
  if (any_prepared) EmitSplitPrepare(chain, split, prepared, w);

  KernelSource k;
  k.source = absl::StrCat(title, preamble, absl::StrJoin(includes, "\n"), includes.empty() ? "" : "\n", "\n",
                          parts_code, w.Take());
  k.compile_flags = cpu::CompileFlags();
  k.link_libs.assign(link_libs.begin(), link_libs.end());
  nlohmann::json meta = cpu::KernelJson(chain, schedule_text);
  meta["parts"] = parts_meta;
  if (!k.link_libs.empty()) meta["link_libs"] = k.link_libs;
  if (any_prepared) {
    meta["prepare"] = cpu::PrepareJson(packs);
  }
  k.metadata_json = meta.dump(2);
  return k;
}

}  // namespace fusor::codegen
