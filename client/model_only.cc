#include "client/model_only.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/codegen/cpu/cpu_codegen.h"
#include "common/codegen/cuda/cuda_codegen.h"
#include "common/codegen/cuda/nvrtc.h"
#include "common/hw/devices.h"
#include "common/space/loop_nest.h"
#include "common/space/space.h"
#include "common/util/status_macros.h"

namespace fusor::client {
namespace {

// How many of the best-ranked candidates are tried before giving up.
constexpr int kMaxTries = 16;

absl::Status WriteFile(const std::string& path, const std::string& bytes, std::vector<std::string>& written) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
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

absl::StatusOr<ModelOnlyOutput> CompileModelOnly(const ir::Chain& chain, const hw::TargetDesc& target,
                                                 const std::string& name, const std::string& out_dir) {
  const bool gpu = target.backend == hw::Backend::kCuda;
  std::string no_nvrtc;
  const codegen::Nvrtc* nvrtc = codegen::Nvrtc::Get(&no_nvrtc);
  auto space = space::BuildSpace(chain, target);
  if (!space.ok()) return space.status();
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));

  ModelOnlyOutput out;
  const int tries = std::min<int>(kMaxTries, static_cast<int>(space->ranked.size()));
  for (int i = 0; i < tries; ++i) {
    const space::RankedSchedule& r = space->ranked[i];
    const std::string text = space::ScheduleToText(r.schedule, chain);
    auto nest = space::BuildLoopNest(chain, r.schedule, target);
    if (!nest.ok()) return nest.status();  // the space holds legal nests only
    nlohmann::json meta = {{"unmeasured", true},
                           {"note", "ranked by the cost model alone; never measured, never stored as a best record"},
                           {"chain", chain.name},
                           {"target", {{"device", target.device_name}, {"arch", target.arch}}},
                           {"rank", i + 1},
                           {"schedule", text},
                           {"tiling_expression", space::TilingExpression(r.schedule, chain)},
                           {"mapping", r.mappings},
                           {"predicted_s", r.prediction.t_estm_s}};
    std::vector<std::string> files;
    if (!gpu) {
      auto kernel = codegen::EmitCpuFusedKernel(chain, *nest, text, r.mappings);
      if (!kernel.ok()) return kernel.status();
      meta["kernel"] = nlohmann::json::parse(kernel->metadata_json);
      RETURN_IF_ERROR(WriteFile(absl::StrCat(out_dir, "/", name, ".cc"), kernel->source, files));
      RETURN_IF_ERROR(WriteFile(absl::StrCat(out_dir, "/", name, ".json"), meta.dump(2) + "\n", files));
    } else {
      auto kernel = codegen::EmitCudaFusedKernel(chain, *nest, text, r.mappings);
      if (!kernel.ok()) {
        out.skipped.push_back(absl::StrCat(text, ": ", kernel.status().message()));
        continue;
      }
      meta["kernel"] = nlohmann::json::parse(kernel->metadata_json);
      meta["header"] = "fusor_device.h";
      const std::string base = absl::StrCat(out_dir, "/", name);
      if (nvrtc != nullptr) {
        codegen::NvrtcOutput compiled =
            nvrtc->Compile(kernel->source, target.arch, {{"fusor_device.h", std::string(codegen::CudaDeviceHeader())}});
        const std::string why = compiled.ok ? codegen::CheckResources(compiled.usage, kernel->threads,
                                                                      kernel->shared_bytes,
                                                                      codegen::LimitsForArch(target.arch))
                                            : compiled.log;
        if (!why.empty()) {
          out.skipped.push_back(absl::StrCat(text, ": ", why));
          continue;
        }
        meta["compiler"] = {{"version", nvrtc->Version()},
                            {"options", compiled.options},
                            {"registers", compiled.usage.registers},
                            {"stack_bytes", compiled.usage.stack_bytes},
                            {"spill_store_bytes", compiled.usage.spill_store_bytes},
                            {"spill_load_bytes", compiled.usage.spill_load_bytes},
                            {"static_shared_bytes", compiled.usage.static_shared_bytes}};
        RETURN_IF_ERROR(WriteFile(base + ".cu", kernel->source, files));
        RETURN_IF_ERROR(WriteFile(base + ".cubin", compiled.cubin, files));
      } else {
        RETURN_IF_ERROR(WriteFile(base + ".cu", kernel->source, files));
      }
      RETURN_IF_ERROR(WriteFile(absl::StrCat(out_dir, "/fusor_device.h"), std::string(codegen::CudaDeviceHeader()), files));
      RETURN_IF_ERROR(WriteFile(base + ".json", meta.dump(2) + "\n", files));
    }
    out.files = files;
    out.schedule = text;
    out.mapping = r.mappings;
    out.predicted_s = r.prediction.t_estm_s;
    out.rank = i + 1;
    if (gpu && nvrtc == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("wrote the source and metadata to ", out_dir, " but no cubin: ", no_nvrtc));
    }
    return out;
  }
  std::string why;
  for (const std::string& s : out.skipped) absl::StrAppend(&why, "\n  ", s);
  return absl::FailedPreconditionError(
      absl::StrCat("none of the ", tries, " best-ranked candidates compiled within the target's limits:", why));
}

}  // namespace fusor::client
