#include "client/reference_data.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/ir/parse.h"
#include "common/ir/reference.h"
#include "common/ir/regroup.h"
#include "common/util/files.h"
#include "common/util/status_macros.h"
#include "worker/validate.h"

namespace fusor::client {

absl::StatusOr<std::vector<std::string>> WriteReferenceData(const ir::Chain& chain, uint64_t seed,
                                                            const std::string& out_dir) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  std::vector<std::vector<double>> inputs = worker::RandomInputs(chain, seed);
  for (std::vector<double>& values : inputs) values = worker::RoundToDType(chain.dtype, values);
  ASSIGN_OR_RETURN(std::vector<std::vector<double>> outputs, ir::EvaluateReference(chain, inputs));
  std::vector<std::string> written;
  auto write = [&](int tensor, const std::vector<double>& values, nlohmann::json& list) -> absl::Status {
    const ir::Tensor& t = chain.tensors[tensor];
    const std::string file = absl::StrCat(t.name, ".f64");
    std::string bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double));
    RETURN_IF_ERROR(WriteFile(absl::StrCat(out_dir, "/", file), bytes));
    written.push_back(absl::StrCat(out_dir, "/", file));
    list.push_back({{"name", t.name}, {"shape", t.shape}, {"file", file}});
    return absl::OkStatus();
  };
  nlohmann::json manifest = {{"chain", nlohmann::json::parse(ir::ChainToJson(chain))},
                             {"dtype", std::string(ir::DTypeName(chain.dtype))},
                             {"seed", seed},
                             {"tolerance", worker::Tolerance(chain.dtype)},
                             {"tolerance_rule", "|out - ref| <= tolerance * (|ref| + rms(ref)) per output"},
                             {"element", "raw little-endian float64, row-major"},
                             {"inputs", nlohmann::json::array()},
                             {"outputs", nlohmann::json::array()},
                             {"regroupings", nlohmann::json::array()}};
  // The other association orders of its sums: the same outputs, other FLOPs.
  for (const ir::Regroup& r : ir::Regroupings(chain)) {
    ASSIGN_OR_RETURN(ir::Chain regrouped, ir::ApplyRegroup(chain, r));
    manifest["regroupings"].push_back(
        {{"text", ir::RegroupToText(chain, r)}, {"chain", nlohmann::json::parse(ir::ChainToJson(regrouped))}});
  }
  for (size_t i = 0; i < chain.inputs.size(); ++i) RETURN_IF_ERROR(write(chain.inputs[i], inputs[i], manifest["inputs"]));
  for (size_t i = 0; i < chain.outputs.size(); ++i) {
    RETURN_IF_ERROR(write(chain.outputs[i], outputs[i], manifest["outputs"]));
  }
  RETURN_IF_ERROR(WriteFile(absl::StrCat(out_dir, "/manifest.json"), manifest.dump(2) + "\n"));
  written.push_back(absl::StrCat(out_dir, "/manifest.json"));
  return written;
}

}  // namespace fusor::client
