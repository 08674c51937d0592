#include "client/model_only.h"

#include <array>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/codegen/cpu/cpu_codegen.h"
#include "common/codegen/cuda/cuda_codegen.h"
#include "common/codegen/cuda/nvrtc.h"
#include "common/hw/devices.h"
#include "common/model/cost_model.h"
#include "common/space/loop_nest.h"
#include "common/space/space.h"
#include "common/space/split.h"
#include "common/util/files.h"
#include "common/util/status_macros.h"

namespace fusor::client {
namespace {

// Writes a file and records its path.
absl::Status WriteFile(const std::string& path, const std::string& bytes, std::vector<std::string>& written) {
  if (absl::Status st = fusor::WriteFile(path, bytes); !st.ok()) return absl::PermissionDeniedError(st.message());
  written.push_back(path);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<hw::TargetDesc> GpuTarget(const std::string& name) {
  if (auto device = hw::LookupDevice(name); device && device->backend == hw::Backend::kCuda) return *device;
  for (const std::string& device_name : hw::DeviceNames()) {
    auto device = hw::LookupDevice(device_name);
    if (device && device->backend == hw::Backend::kCuda && device->arch == name) return *device;
  }
  std::string known;
  for (const std::string& d : hw::DeviceNames()) absl::StrAppend(&known, known.empty() ? "" : ", ", d);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown GPU '", name, "': give a device (", known, ") or an arch (sm_80, sm_86, sm_89, sm_90)"));
}

std::vector<GpuCandidate> CompilingGpuCandidates(const ir::Chain& chain, const hw::TargetDesc& target,
                                                 const space::Space& space, int count,
                                                 std::vector<std::string>* skipped) {
  const codegen::Nvrtc* nvrtc = codegen::Nvrtc::Get();
  std::vector<GpuCandidate> out;
  const int tries = std::min<int>(count + 16, static_cast<int>(space.ranked.size()));
  for (int i = 0; i < tries && static_cast<int>(out.size()) < count; ++i) {
    GpuCandidate c;
    c.ranked = &space.ranked[i];
    c.rank = i + 1;
    c.schedule = space::ScheduleToText(c.ranked->schedule, chain);
    auto nest = space::BuildLoopNest(chain, c.ranked->schedule, target);
    auto kernel = nest.ok() ? codegen::EmitCudaFusedKernel(chain, *nest, c.schedule, c.ranked->mappings)
                            : absl::StatusOr<codegen::CudaKernel>(nest.status());
    if (!kernel.ok()) {
      skipped->push_back(absl::StrCat(c.schedule, ": ", kernel.status().message()));
      continue;
    }
    c.kernel = std::move(*kernel);
    std::string why;
    if (nvrtc != nullptr && !codegen::CompileProgram(codegen::FusedProgram(chain, c.kernel), target.arch,
                                                     std::string(codegen::CudaDeviceHeader()),
                                                     codegen::LimitsForArch(target.arch), &c.compiled, &why)) {
      skipped->push_back(absl::StrCat(c.schedule, ": ", why));
      continue;
    }
    out.push_back(std::move(c));
  }
  return out;
}

namespace {

// Says which candidate `out` is (its schedule, mapping, prediction and
// rank) and returns the metadata of an unmeasured pick.
nlohmann::json DescribePick(const ir::Chain& chain, const hw::TargetDesc& target, const space::RankedSchedule& r,
                            int rank, const std::string& text, ModelOnlyOutput& out) {
  out.schedule = text;
  out.mapping = r.mappings;
  out.predicted_s = r.prediction.t_estm_s;
  out.rank = rank;
  return nlohmann::json{{"unmeasured", true},
                        {"note", "ranked by the cost model alone; never measured, never stored as a best record"},
                        {"chain", chain.name},
                        {"target", {{"device", target.device_name}, {"arch", target.arch}}},
                        {"rank", rank},
                        {"schedule", text},
                        {"tiling_expression", space::TilingExpression(r.schedule, chain)},
                        {"mapping", r.mappings},
                        {"predicted_s", r.prediction.t_estm_s}};
}

// A CPU target's --schedule 'split after T: HEAD | TAIL': the chain in two
// parts, as a CPU answer may run it, each part's prediction (fused or
// unfused) summed.
absl::StatusOr<ModelOnlyOutput> WriteSplitCpu(const ir::Chain& chain, const hw::TargetDesc& target,
                                              const std::string& base, const std::string& schedule_text) {
  ModelOnlyOutput out;
  ASSIGN_OR_RETURN(space::SplitSchedule split, space::ParseSplit(schedule_text, chain));
  ASSIGN_OR_RETURN(codegen::KernelSource kernel, codegen::EmitCpuSplitKernel(chain, schedule_text, target));
  out.schedule = schedule_text;
  std::array<std::string, 2> mappings = split.texts;  // an unfused part's is its text
  for (int p = 0; p < 2; ++p) {
    const ir::Chain& part = split.chains.parts[p];
    if (!space::UnfusedVendor(split.texts[p]).empty()) {
      out.predicted_s += model::PredictUnfused(part, target).t_estm_s;
      continue;
    }
    ASSIGN_OR_RETURN(space::Schedule given, space::ParseSchedule(split.texts[p], part));
    ASSIGN_OR_RETURN(space::LoopNest nest, space::BuildLoopNest(part, given, target));
    mappings[p] = space::DescribeMappings(part, nest);
    out.predicted_s += model::Predict(nest, target, part).t_estm_s;
  }
  out.mapping = absl::StrCat(mappings[0], " | ", mappings[1]);
  const nlohmann::json meta = {{"unmeasured", true},
                               {"note", "never measured, never stored as a best record"},
                               {"chain", chain.name},
                               {"target", {{"device", target.device_name}, {"arch", target.arch}}},
                               {"schedule", schedule_text},
                               {"mapping", out.mapping},
                               {"predicted_s", out.predicted_s},
                               {"kernel", nlohmann::json::parse(kernel.metadata_json)}};
  RETURN_IF_ERROR(WriteFile(base + ".cc", kernel.source, out.files));
  RETURN_IF_ERROR(WriteFile(base + ".json", meta.dump(2) + "\n", out.files));
  return out;
}

// A CPU target: the model's pick, or the fused schedule given, with its
// rank in the pruned space (0 when it is not there).
absl::StatusOr<ModelOnlyOutput> WriteFusedCpu(const ir::Chain& chain, const hw::TargetDesc& target,
                                              const space::Space& space, const std::string& base,
                                              const std::string& schedule_text) {
  ModelOnlyOutput out;
  space::RankedSchedule r = space.ranked[0];
  int rank = 1;
  if (!schedule_text.empty()) {
    ASSIGN_OR_RETURN(space::Schedule given, space::ParseSchedule(schedule_text, chain));
    ASSIGN_OR_RETURN(space::LoopNest nest, space::BuildLoopNest(chain, given, target));
    r = {nest.schedule, model::Predict(nest, target, chain), space::DescribeMappings(chain, nest)};
    rank = 0;
    for (size_t i = 0; i < space.ranked.size() && rank == 0; ++i) {
      if (space.ranked[i].schedule == r.schedule) rank = static_cast<int>(i) + 1;
    }
  }
  const std::string text = space::ScheduleToText(r.schedule, chain);
  ASSIGN_OR_RETURN(space::LoopNest nest, space::BuildLoopNest(chain, r.schedule, target));
  ASSIGN_OR_RETURN(codegen::KernelSource kernel, codegen::EmitCpuFusedKernel(chain, nest, text, r.mappings));
  nlohmann::json meta = DescribePick(chain, target, r, rank, text, out);
  meta["kernel"] = nlohmann::json::parse(kernel.metadata_json);
  RETURN_IF_ERROR(WriteFile(base + ".cc", kernel.source, out.files));
  RETURN_IF_ERROR(WriteFile(base + ".json", meta.dump(2) + "\n", out.files));
  return out;
}

// A GPU target: the best-ranked candidate that compiles within its limits,
// with the device header its source includes.
absl::StatusOr<ModelOnlyOutput> WriteBestGpu(const ir::Chain& chain, const hw::TargetDesc& target,
                                             const space::Space& space, const std::string& out_dir,
                                             const std::string& base) {
  ModelOnlyOutput out;
  std::vector<GpuCandidate> best = CompilingGpuCandidates(chain, target, space, 1, &out.skipped);
  if (best.empty()) {
    std::string why;
    for (const std::string& s : out.skipped) absl::StrAppend(&why, "\n  ", s);
    return absl::FailedPreconditionError(
        absl::StrCat("none of the best-ranked candidates compiled within the target's limits:", why));
  }
  const GpuCandidate& c = best[0];
  nlohmann::json meta = DescribePick(chain, target, *c.ranked, c.rank, c.schedule, out);
  meta["kernel"] = nlohmann::json::parse(c.kernel.metadata_json);
  meta["header"] = "fusor_device.h";
  RETURN_IF_ERROR(WriteFile(base + ".cu", c.kernel.source, out.files));
  std::string no_nvrtc;
  const codegen::Nvrtc* nvrtc = codegen::Nvrtc::Get(&no_nvrtc);
  if (nvrtc != nullptr) {
    const codegen::ResourceUsage& u = c.compiled.usage[0];
    meta["compiler"] = {{"version", nvrtc->Version()},
                        {"options", c.compiled.options},
                        {"registers", u.registers},
                        {"stack_bytes", u.stack_bytes},
                        {"spill_store_bytes", u.spill_store_bytes},
                        {"spill_load_bytes", u.spill_load_bytes},
                        {"static_shared_bytes", u.static_shared_bytes}};
    RETURN_IF_ERROR(WriteFile(base + ".cubin", c.compiled.cubins[0], out.files));
  }
  RETURN_IF_ERROR(WriteFile(absl::StrCat(out_dir, "/fusor_device.h"), std::string(codegen::CudaDeviceHeader()),
                            out.files));
  RETURN_IF_ERROR(WriteFile(base + ".json", meta.dump(2) + "\n", out.files));
  if (nvrtc == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("wrote the source and metadata to ", out_dir, " but no cubin: ", no_nvrtc));
  }
  return out;
}

}  // namespace

absl::StatusOr<ModelOnlyOutput> CompileModelOnly(const ir::Chain& chain, const hw::TargetDesc& target,
                                                 const std::string& name, const std::string& out_dir,
                                                 const std::string& schedule_text) {
  if (!schedule_text.empty() && target.backend == hw::Backend::kCuda) {
    return absl::InvalidArgumentError("--schedule is for CPU targets; a GPU's pick must compile within its limits");
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));

  const std::string base = absl::StrCat(out_dir, "/", name);
  // A split is for a CPU target: --schedule is refused for a GPU above.
  if (space::IsSplitText(schedule_text)) return WriteSplitCpu(chain, target, base, schedule_text);
  auto space = space::BuildSpace(chain, target);
  if (!space.ok()) return space.status();
  if (space->ranked.empty()) return absl::FailedPreconditionError("the pruned space is empty");
  if (target.backend != hw::Backend::kCuda) return WriteFusedCpu(chain, target, *space, base, schedule_text);
  return WriteBestGpu(chain, target, *space, out_dir, base);
}

}  // namespace fusor::client
