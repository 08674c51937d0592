// `fusor extract`: the fusible chains of a model — an ONNX file or a
// built-in model description (common/zoo) — printed as a table with the
// candidates that did not match and why, and optionally written out as
// chain files that `fusor tune` takes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/zoo/onnx_import.h"
#include "common/zoo/transformer.h"

namespace fusor::client {

struct Extraction {
  std::string model;
  std::vector<std::string> about;  // lines describing the model
  std::vector<zoo::ModelChain> chains;
  std::vector<std::string> rejected;
};

// A model description is at most 1 MiB, nested at most kMaxJsonDepth deep.
inline constexpr int64_t kMaxDescriptionBytes = int64_t{1} << 20;

// Reads `path` (*.onnx: an ONNX model, whose symbolic dims `dims` binds;
// otherwise a model description, where `dims` sets batch, seq or
// target_seq).
absl::StatusOr<Extraction> ExtractModel(const std::string& path, const std::map<std::string, int64_t>& dims);

std::string FormatExtraction(const Extraction& extraction);

// Writes each chain to DIR/<chain name>.fusor with where it came from in
// a comment; returns the paths.
absl::StatusOr<std::vector<std::string>> WriteExtraction(const Extraction& extraction, const std::string& dir);

// "name=value" to (name, value); INVALID_ARGUMENT otherwise.
absl::StatusOr<std::pair<std::string, int64_t>> ParseDimBinding(const std::string& text);

}  // namespace fusor::client
