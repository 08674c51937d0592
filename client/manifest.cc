#include "client/manifest.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/files.h"
#include "common/util/status_macros.h"
#include "common/util/text.h"
#include "proto/wire/convert.h"

namespace fusor::client {
namespace {

// "zoo.yaml:7: " for messages about a node.
std::string Where(const std::string& path, const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  return mark.is_null() ? absl::StrCat(path, ": ") : absl::StrCat(path, ":", mark.line + 1, ": ");
}

absl::StatusOr<int64_t> PositiveInt(const std::string& path, const YAML::Node& node, const std::string& what) {
  int64_t value = 0;
  if (!node.IsScalar() || !absl::SimpleAtoi(node.Scalar(), &value) || value < 1) {
    return absl::InvalidArgumentError(absl::StrCat(Where(path, node), what, " must be a positive integer"));
  }
  return value;
}

// One value or a non-empty list of them.
absl::StatusOr<std::vector<int64_t>> Values(const std::string& path, const YAML::Node& node, const std::string& what) {
  std::vector<int64_t> out;
  if (node.IsSequence()) {
    if (node.size() == 0) return absl::InvalidArgumentError(absl::StrCat(Where(path, node), what, " has no values"));
    for (const YAML::Node& v : node) {
      ASSIGN_OR_RETURN(int64_t x, PositiveInt(path, v, what));
      out.push_back(x);
    }
    return out;
  }
  ASSIGN_OR_RETURN(int64_t x, PositiveInt(path, node, what));
  out.push_back(x);
  return out;
}

absl::StatusOr<ManifestModel> ParseModel(const std::string& path, const std::filesystem::path& dir,
                                         const YAML::Node& node, size_t index) {
  const std::string what = absl::StrCat("models[", index, "]");
  if (!node.IsMap()) return absl::InvalidArgumentError(absl::StrCat(Where(path, node), what, " must be a mapping"));
  ManifestModel m;
  std::set<std::string> dims_seen;
  auto add_dim = [&](const std::string& name, const YAML::Node& value) -> absl::Status {
    if (!dims_seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(Where(path, value), what, ": dim '", name, "' given twice"));
    }
    ASSIGN_OR_RETURN(std::vector<int64_t> values, Values(path, value, absl::StrCat(what, ".", name)));
    m.dims.emplace_back(name, std::move(values));
    return absl::OkStatus();
  };
  int files = 0;
  for (const auto& kv : node) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& value = kv.second;
    if (key == "description" || key == "onnx") {
      if (!value.IsScalar() || value.Scalar().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(Where(path, value), what, ".", key, " must be a file path"));
      }
      ++files;
      m.onnx = key == "onnx";
      std::filesystem::path file(value.Scalar());
      m.path = (file.is_absolute() ? file : dir / file).lexically_normal().string();
      if (!std::filesystem::is_regular_file(m.path)) {
        return absl::NotFoundError(absl::StrCat(Where(path, value), what, ": no such file '", m.path, "'"));
      }
    } else if (key == "name") {
      if (!value.IsScalar() || value.Scalar().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(Where(path, value), what, ".name must be a string"));
      }
      if (absl::Status st = CheckName(value.Scalar(), "model"); !st.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(Where(path, value), st.message()));
      }
      m.name = value.Scalar();
    } else if (key == "batch" || key == "seq" || key == "target_seq") {
      RETURN_IF_ERROR(add_dim(key, value));
    } else if (key == "dims") {
      if (!value.IsMap()) {
        return absl::InvalidArgumentError(absl::StrCat(Where(path, value), what, ".dims must map names to sizes"));
      }
      for (const auto& dim : value) RETURN_IF_ERROR(add_dim(dim.first.Scalar(), dim.second));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(Where(path, kv.first), what, ": unknown key '", key,
                                                     "' (expected description or onnx, name, batch, seq, "
                                                     "target_seq, dims)"));
    }
  }
  if (files != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(path, node), what, " needs exactly one of 'description' (a model description) and "
                                              "'onnx' (an ONNX file)"));
  }
  return m;
}

// Nesting of flow collections ([ and {) at most kMaxJsonDepth deep, and of
// block ones (each level indents, or opens with "- " or "? ") at most
// kMaxYamlIndent columns: what a manifest needs, with room to spare.
constexpr size_t kMaxYamlIndent = 256;

absl::Status CheckYamlDepth(const std::string& text, const std::string& path) {
  RETURN_IF_ERROR(CheckJsonDepth(text, path));
  size_t line = 1, at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const size_t indent = text.find_first_not_of(" \t-?:", at);
    if (std::min(indent, end) - at > kMaxYamlIndent) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line, ": nests deeper than ", kMaxYamlIndent, " columns of indentation (limit)"));
    }
    at = end + 1;
    ++line;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Manifest> LoadManifest(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) return absl::NotFoundError(absl::StrCat("no manifest '", path, "'"));
  // Bounded before parsing: the YAML parser recurses over nesting.
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path, kMaxManifestBytes));
  RETURN_IF_ERROR(CheckYamlDepth(text, path));
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", e.mark.line + 1, ": not YAML or JSON: ", e.msg));
  }
  if (!root.IsMap()) return absl::InvalidArgumentError(absl::StrCat(path, ": a manifest is a mapping with 'models'"));
  Manifest m;
  m.path = path;
  m.name = SafeName(std::filesystem::path(path).stem().string());
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  bool has_models = false;
  try {
    for (const auto& kv : root) {
      const std::string key = kv.first.Scalar();
      if (key == "name") {
        if (!kv.second.IsScalar() || kv.second.Scalar().empty()) {
          return absl::InvalidArgumentError(absl::StrCat(Where(path, kv.second), "name must be a string"));
        }
        // It names the report's directory: no path in it.
        if (absl::Status st = CheckName(kv.second.Scalar(), "sweep"); !st.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(Where(path, kv.second), st.message()));
        }
        m.name = kv.second.Scalar();
      } else if (key == "budget") {
        ASSIGN_OR_RETURN(int64_t budget, PositiveInt(path, kv.second, "budget"));
        m.budget = static_cast<int>(std::min<int64_t>(budget, 1 << 20));
      } else if (key == "models") {
        if (!kv.second.IsSequence() || kv.second.size() == 0) {
          return absl::InvalidArgumentError(absl::StrCat(Where(path, kv.second), "models must be a non-empty list"));
        }
        has_models = true;
        for (size_t i = 0; i < kv.second.size(); ++i) {
          ASSIGN_OR_RETURN(ManifestModel model, ParseModel(path, dir, kv.second[i], i));
          m.models.push_back(std::move(model));
        }
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(Where(path, kv.first), "unknown key '", key, "' (expected name, budget, models)"));
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", e.mark.line + 1, ": ", e.msg));
  }
  if (!has_models) return absl::InvalidArgumentError(absl::StrCat(path, ": no 'models' list"));
  return m;
}

absl::StatusOr<std::vector<SweepModel>> ExtractManifest(const Manifest& manifest,
                                                        const std::function<void(const SweepModel&)>& on_model) {
  std::vector<SweepModel> out;
  std::set<std::string> names;
  for (const ManifestModel& model : manifest.models) {
    // Every combination of the dims' values, the last dim varying fastest.
    std::vector<size_t> at(model.dims.size(), 0);
    while (true) {
      std::map<std::string, int64_t> binding;
      std::vector<std::string> shown;
      for (size_t d = 0; d < model.dims.size(); ++d) {
        binding[model.dims[d].first] = model.dims[d].second[at[d]];
        shown.push_back(absl::StrCat(model.dims[d].first, "=", model.dims[d].second[at[d]]));
      }
      auto extraction = ExtractModel(model.path, binding);
      if (!extraction.ok()) {
        return absl::Status(extraction.status().code(),
                            absl::StrCat(manifest.path, ": model '", model.name.empty() ? model.path : model.name,
                                         "'", shown.empty() ? "" : absl::StrCat(" at ", absl::StrJoin(shown, ", ")),
                                         ": ", extraction.status().message()));
      }
      SweepModel sm;
      sm.name = !model.name.empty() ? model.name
                : model.onnx      ? std::filesystem::path(model.path).stem().string()
                                  : extraction->model;
      if (!shown.empty()) absl::StrAppend(&sm.name, " (", absl::StrJoin(shown, ", "), ")");
      if (!names.insert(sm.name).second) {
        return absl::InvalidArgumentError(absl::StrCat(manifest.path, ": model '", sm.name,
                                                       "' is listed twice; give one of them another name"));
      }
      sm.extraction = std::move(*extraction);
      if (on_model) on_model(sm);
      out.push_back(std::move(sm));
      size_t d = model.dims.size();
      while (d > 0 && ++at[d - 1] == model.dims[d - 1].second.size()) at[--d] = 0;
      if (d == 0) break;
    }
  }
  return out;
}

v1::SweepRequest MakeSweepRequest(const Manifest& manifest, const std::vector<SweepModel>& models) {
  v1::SweepRequest request;
  request.set_name(manifest.name);
  request.mutable_options()->set_budget(manifest.budget);
  for (const SweepModel& model : models) {
    for (const zoo::ModelChain& c : model.extraction.chains) {
      v1::SweepEntry* e = request.add_entries();
      e->set_model(model.name);
      e->set_role(c.role);
      e->set_source(c.layers);
      e->set_instances(c.instances);
      *e->mutable_chain() = wire::ChainToProto(c.chain);
    }
  }
  return request;
}

}  // namespace fusor::client
