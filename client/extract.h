// `fusor extract`: the fusible chains of a model, from a built-in model
// description (common/zoo), printed as a table and optionally written out
// as chain files that `fusor tune` takes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/zoo/transformer.h"

namespace fusor::client {

struct Extraction {
  zoo::TransformerConfig config;
  std::vector<zoo::ModelChain> chains;
};

// Reads `path` (a model description; ONNX files are refused with the
// reason) and binds `dims` (batch, seq, target_seq).
absl::StatusOr<Extraction> ExtractModel(const std::string& path, const std::map<std::string, int64_t>& dims);

std::string FormatExtraction(const Extraction& extraction);

// Writes each chain to DIR/<chain name>.fusor with where it came from in
// a comment; returns the paths.
absl::StatusOr<std::vector<std::string>> WriteExtraction(const Extraction& extraction, const std::string& dir);

// "name=value" to (name, value); INVALID_ARGUMENT otherwise.
absl::StatusOr<std::pair<std::string, int64_t>> ParseDimBinding(const std::string& text);

}  // namespace fusor::client
