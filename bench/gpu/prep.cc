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
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "bench/gpu/inputs.h"
#include "client/model_only.h"
#include "common/codegen/cpu/prelude.h"
#include "common/codegen/cuda/cuda_codegen.h"
#include "common/ir/parse.h"
#include "common/ir/reference.h"
#include "common/space/space.h"
#include "common/util/files.h"

namespace {

using namespace fusor;

constexpr uint64_t kSeed = 20261202;

int Prepare(const std::string& chain_path, const hw::TargetDesc& target, int top, const std::string& out_root) {
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
  for (size_t i = 0; i < candidates.size(); ++i) {
    const client::GpuCandidate& c = candidates[i];
    codegen::Program program = codegen::FusedProgram(*chain, c.kernel);
    program.steps[0].what = absl::StrCat(c.schedule, "  [", c.ranked->mappings, "] model ",
                                         c.ranked->prediction.t_estm_s * 1e6, " us");
    std::ofstream(absl::StrCat(dir, "/candidate_", i, ".prog")) << codegen::ProgramToText(program);
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
      auto kernel = nest.ok() ? codegen::EmitCudaFusedKernel(*chain, *nest, text, c.ranked->mappings)
                              : absl::StatusOr<codegen::CudaKernel>(nest.status());
      if (!kernel.ok()) {
        std::cerr << chain->name << ": " << text << ": " << kernel.status() << "\n";
        continue;
      }
      codegen::Program program = codegen::FusedProgram(*chain, *kernel);
      program.steps[0].what = absl::StrCat(text, "  [", c.ranked->mappings, "] launch variant of #", i);
      std::ofstream(absl::StrCat(dir, "/candidate_", written++, ".prog")) << codegen::ProgramToText(program);
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
  if (argc < 5) {
    std::cerr << "usage: fusor-bench-gpu-prep OUT_DIR TARGET(h200|sm_90|...) TOP CHAIN_FILE...\n";
    return 2;
  }
  auto target = client::GpuTarget(argv[2]);
  if (!target.ok()) {
    std::cerr << target.status() << "\n";
    return 2;
  }
  const int top = std::atoi(argv[3]);
  int rc = 0;
  for (int i = 4; i < argc; ++i) rc |= Prepare(argv[i], *target, top, argv[1]);
  return rc;
}
