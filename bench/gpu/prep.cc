// fusor-bench-gpu-prep: prepares the GPU device check on a machine without
// a GPU. For each chain it writes, under OUT/<chain>/:
//   manifest.txt      dtype, inputs and outputs (elements), FLOPs, the
//                     bytes every implementation must move, seed, tolerance
//   expected.f32      the float64 reference on the deterministic inputs
//                     (inputs.h), as float32, outputs concatenated
//   candidate_<i>.prog  the model's best fused candidates that NVRTC
//                     compiles within the target's limits (program.h),
//                     then other launches (intermediates in registers,
//                     warps, stages) of the two best
//   baseline.prog     the unfused baseline (cuBLAS + separate kernels)
// The runner (runner.cc) then measures them on the GPU.
//
// With --cubins DIR it also compiles every candidate for the target's arch
// with NVRTC and writes DIR/<chain>.<candidate>.cubin and .json (launch
// shape and ptxas's report), which bench/gpu/sass_stats.py reads: the
// kernels' static figures without a GPU.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "bench/gpu/inputs.h"
#include "client/model_only.h"
#include "common/codegen/cpu/prelude.h"
#include "common/codegen/cuda/cuda_codegen.h"
#include "common/codegen/cuda/nvrtc.h"
#include "common/ir/parse.h"
#include "common/ir/reference.h"
#include "common/space/space.h"
#include "common/util/files.h"

namespace {

using namespace fusor;

constexpr uint64_t kSeed = 20261202;

// DIR/<chain>.<name>.cubin and .json for the static figures.
bool WriteCubin(const std::string& dir, const ir::Chain& chain, const hw::TargetDesc& target, const std::string& name,
                const codegen::Program& program) {
  codegen::CompiledProgram compiled;
  std::string why;
  if (!codegen::CompileProgram(program, target.arch, std::string(codegen::CudaDeviceHeader()),
                               codegen::LimitsForArch(target.arch), &compiled, &why)) {
    std::cerr << chain.name << " " << name << ": " << why << "\n";
    return false;
  }
  const codegen::KernelStep& k = program.steps[0].kernel;
  const codegen::ResourceUsage& u = compiled.usage[0];
  const std::string stem = absl::StrCat(dir, "/", chain.name, ".", name);
  std::ofstream(stem + ".cubin", std::ios::binary) << compiled.cubins[0];
  nlohmann::json meta = {{"chain", chain.name},        {"label", name},
                         {"what", program.steps[0].what}, {"kernel", k.name},
                         {"arch", target.arch},          {"sm_count", target.compute_units},
                         {"grid", k.grid},               {"threads", k.threads},
                         {"dynamic_shared_bytes", k.shared_bytes}, {"static_shared_bytes", u.static_shared_bytes},
                         {"registers", u.registers},     {"spill_store_bytes", u.spill_store_bytes},
                         {"spill_load_bytes", u.spill_load_bytes}};
  std::ofstream(stem + ".json") << meta.dump(1) << "\n";
  return true;
}

int Prepare(const std::string& chain_path, const hw::TargetDesc& target, int top, const std::string& out_root,
            const std::string& cubin_dir) {
  auto text = ReadFile(chain_path);
  auto chain = text.ok() ? ir::ParseChainText(*text) : absl::StatusOr<ir::Chain>(text.status());
  if (!chain.ok()) {
    std::cerr << chain_path << ": " << chain.status() << "\n";
    return 1;
  }
  const std::string dir = out_root + "/" + chain->name;
  std::filesystem::create_directories(dir);
  // The reference on the deterministic inputs, rounded to the dtype first.
  std::vector<std::vector<double>> inputs;
  for (size_t i = 0; i < chain->inputs.size(); ++i) {
    std::vector<double> v =
        bench::DeviceCheckInput(kSeed, static_cast<int>(i), chain->tensors[chain->inputs[i]].NumElements());
    for (double& x : v) {
      const float f = static_cast<float>(x);
      if (chain->dtype == ir::DType::kF16) {
        x = codegen::rt::fusor_f16_to_f32(codegen::rt::fusor_f32_to_f16(f));
      } else if (chain->dtype == ir::DType::kBF16) {
        x = codegen::rt::fusor_bf16_to_f32(codegen::rt::fusor_f32_to_bf16(f));
      } else {
        x = f;
      }
    }
    inputs.push_back(std::move(v));
  }
  auto reference = ir::EvaluateReference(*chain, inputs);
  if (!reference.ok()) {
    std::cerr << chain->name << ": " << reference.status() << "\n";
    return 1;
  }
  {
    std::ofstream f(dir + "/expected.f32", std::ios::binary);
    for (const auto& out : *reference) {
      for (double x : out) {
        const float v = static_cast<float>(x);
        f.write(reinterpret_cast<const char*>(&v), 4);
      }
    }
  }
  const int bytes = ir::DTypeBytes(chain->dtype);
  double min_bytes = 0;
  std::ofstream m(dir + "/manifest.txt");
  m << "chain " << chain->name << "\ndtype " << ir::DTypeName(chain->dtype) << "\nseed " << kSeed << "\ntolerance "
    << codegen::CudaTolerance(chain->dtype) << "\nflops " << ir::ChainFlops(*chain) << "\n";
  m << "inputs " << chain->inputs.size() << "\n";
  for (int t : chain->inputs) {
    m << chain->tensors[t].name << " " << chain->tensors[t].NumElements() << "\n";
    min_bytes += static_cast<double>(chain->tensors[t].NumElements()) * bytes;
  }
  m << "outputs " << chain->outputs.size() << "\n";
  for (int t : chain->outputs) {
    m << chain->tensors[t].name << " " << chain->tensors[t].NumElements() << "\n";
    min_bytes += static_cast<double>(chain->tensors[t].NumElements()) * bytes;
  }
  m << "min_bytes " << min_bytes << "\n";

  auto space = space::BuildSpace(*chain, target);
  if (!space.ok()) {
    std::cerr << chain->name << ": " << space.status() << "\n";
    return 1;
  }
  std::vector<std::string> skipped;
  const std::vector<client::GpuCandidate> candidates =
      client::CompilingGpuCandidates(*chain, target, *space, top, &skipped);
  std::set<std::string> written_texts;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const client::GpuCandidate& c = candidates[i];
    written_texts.insert(space::ScheduleToText(c.ranked->schedule, *chain));
    codegen::Program program = codegen::FusedProgram(*chain, c.kernel);
    program.steps[0].what = absl::StrCat(c.schedule, "  [", c.ranked->mappings, "] model ",
                                         c.ranked->prediction.t_estm_s * 1e6, " us");
    std::ofstream(absl::StrCat(dir, "/candidate_", i, ".prog")) << codegen::ProgramToText(program);
    if (!cubin_dir.empty()) WriteCubin(cubin_dir, *chain, target, absl::StrCat("candidate_", i), program);
  }
  // Other launches of the two best: what the search would measure next,
  // which the model cannot rank (the runner rejects what does not fit).
  int written = static_cast<int>(candidates.size());
  for (size_t i = 0; i < std::min<size_t>(2, candidates.size()); ++i) {
    const client::GpuCandidate& c = candidates[i];
    std::vector<space::Schedule> variants;
    if (auto r = space::RegisterResidentVariant(*chain, c.ranked->schedule, target)) {
      variants.push_back(*r);
      variants.push_back(*r);
      variants.back().stages = 1;
    }
    for (const auto& [warps, stages] : {std::pair{4, 1}, std::pair{8, 2}, std::pair{2, 2}}) {
      variants.push_back(c.ranked->schedule);
      variants.back().warps = warps;
      variants.back().stages = stages;
    }
    for (const space::Schedule& variant : variants) {
      const std::string text = space::ScheduleToText(variant, *chain);
      auto nest = space::BuildLoopNest(*chain, variant, target);
      if (!nest.ok() || !written_texts.insert(text).second) continue;  // not a launch of this kernel, or a repeat
      auto kernel = codegen::EmitCudaFusedKernel(*chain, *nest, text, c.ranked->mappings);
      if (!kernel.ok()) {
        std::cerr << chain->name << ": " << text << ": " << kernel.status() << "\n";
        continue;
      }
      codegen::Program program = codegen::FusedProgram(*chain, *kernel);
      program.steps[0].what = absl::StrCat(text, "  [", c.ranked->mappings, "] launch variant of #", i);
      std::ofstream(absl::StrCat(dir, "/candidate_", written, ".prog")) << codegen::ProgramToText(program);
      if (!cubin_dir.empty()) WriteCubin(cubin_dir, *chain, target, absl::StrCat("candidate_", written), program);
      ++written;
    }
  }
  auto baseline = codegen::EmitCudaUnfusedBaseline(*chain, target);
  if (!baseline.ok()) {
    std::cerr << chain->name << ": baseline: " << baseline.status() << "\n";
    return 1;
  }
  std::ofstream(dir + "/baseline.prog") << codegen::ProgramToText(*baseline);
  std::cout << chain->name << ": " << written << " candidates, baseline of " << baseline->steps.size()
            << " steps -> " << dir << "\n";
  return written > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string cubin_dir;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--cubins" && i + 1 < argc) {
      cubin_dir = argv[++i];
    } else {
      args.push_back(argv[i]);
    }
  }
  if (args.size() < 4) {
    std::cerr << "usage: fusor-bench-gpu-prep [--cubins DIR] OUT_DIR TARGET(h200|sm_90|...) TOP CHAIN_FILE...\n";
    return 2;
  }
  auto target = client::GpuTarget(args[1]);
  if (!target.ok()) {
    std::cerr << target.status() << "\n";
    return 2;
  }
  if (!cubin_dir.empty()) std::filesystem::create_directories(cubin_dir);
  const int top = std::atoi(args[2].c_str());
  int rc = 0;
  for (size_t i = 3; i < args.size(); ++i) rc |= Prepare(args[i], *target, top, args[0], cubin_dir);
  return rc;
}
