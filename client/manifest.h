// Zoo manifests for `fusor sweep`: the models of a sweep (ONNX files or
// built-in descriptions) and the sizes to sweep them at, in YAML or JSON:
//
//   name: transformer-zoo      # optional; default: the file's stem
//   budget: 8                  # optional: candidates measured per chain
//   models:
//     - description: models/bert_base.json   # relative to the manifest
//       batch: [1, 8]                         # one value or a list
//       seq: 128
//     - onnx: exported/encoder.onnx
//       name: my-encoder                      # optional
//       dims: {batch_size: 1, sequence: [128, 512]}
//
// `batch`, `seq` and `target_seq` are short for entries of `dims`. A model
// with lists expands to every combination, each a model of its own in the
// sweep and its report ("bert-base (batch=8, seq=128)").
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "client/extract.h"
#include "fusor/v1/scheduler.pb.h"

namespace fusor::client {

struct ManifestModel {
  // Empty: a description's model name, or an ONNX file's name without its
  // extension (exporters name every graph alike: "main_graph").
  std::string name;
  std::string path;  // resolved against the manifest's directory
  bool onnx = false;
  std::vector<std::pair<std::string, std::vector<int64_t>>> dims;  // in the order given
};

struct Manifest {
  std::string path;
  std::string name;
  int budget = 0;  // 0: the scheduler's default
  std::vector<ManifestModel> models;
};

// A manifest is at most 1 MiB (as a request to the scheduler), nested at
// most kMaxJsonDepth deep: checked before it is parsed.
inline constexpr int64_t kMaxManifestBytes = int64_t{1} << 20;

// INVALID_ARGUMENT naming the line, the model and the key for anything
// malformed or unknown; NOT_FOUND for a missing manifest or model file.
absl::StatusOr<Manifest> LoadManifest(const std::string& path);

// One model of a sweep at one binding of its dims.
struct SweepModel {
  std::string name;  // "bert-base (batch=8, seq=128)"
  Extraction extraction;
};

// Extracts every model at every binding; `on_model` (optional) hears of
// each as it is done. Fails on the first model that cannot be extracted,
// naming it.
absl::StatusOr<std::vector<SweepModel>> ExtractManifest(
    const Manifest& manifest, const std::function<void(const SweepModel&)>& on_model = nullptr);

// The scheduler's request: one entry per chain of each model.
v1::SweepRequest MakeSweepRequest(const Manifest& manifest, const std::vector<SweepModel>& models);

}  // namespace fusor::client
