#include "client/extract.h"

#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/util/files.h"
#include "common/util/status_macros.h"

namespace fusor::client {

absl::StatusOr<Extraction> ExtractModel(const std::string& path, const std::map<std::string, int64_t>& dims) {
  Extraction e;
  if (absl::EndsWith(absl::AsciiStrToLower(path), ".onnx")) {
    ASSIGN_OR_RETURN(zoo::OnnxExtraction onnx, zoo::ExtractOnnx(path, dims));
    e.model = onnx.model.empty() ? path : onnx.model;
    e.about.push_back(absl::StrCat("ONNX graph from ", path));
    e.chains = std::move(onnx.chains);
    e.rejected = std::move(onnx.rejected);
    return e;
  }
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, kMaxDescriptionBytes));
  auto config = zoo::ParseTransformerConfig(text);
  if (!config.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", config.status().message()));
  zoo::TransformerConfig& c = *config;
  RETURN_IF_ERROR(zoo::BindDims(dims, c));
  ASSIGN_OR_RETURN(e.chains, zoo::ExpandTransformer(c));
  e.model = c.model;
  std::string line = absl::StrCat(c.architecture, ", hidden ", c.hidden, ", ", c.heads, " heads");
  if (c.kv_heads != c.heads) absl::StrAppend(&line, " (", c.kv_heads, " K/V heads)");
  absl::StrAppend(&line, ", ffn ", c.ffn, " (", c.activation, "), batch ", c.batch, ", seq ", c.seq);
  if (c.architecture == "encoder-decoder") absl::StrAppend(&line, ", target seq ", c.target_seq);
  absl::StrAppend(&line, ", ", ir::DTypeName(c.dtype));
  e.about.push_back(line);
  if (!c.source.empty()) e.about.push_back("shapes: " + c.source);
  return e;
}

std::string FormatExtraction(const Extraction& e) {
  std::string out = absl::StrCat(e.model, "\n");
  for (const std::string& line : e.about) absl::StrAppend(&out, "  ", line, "\n");
  absl::StrAppend(&out, absl::StrFormat("  %-32s %-24s %5s  %-12s  %s\n", "chain", "role", "runs", "key", "from"));
  int runs = 0;
  for (const zoo::ModelChain& m : e.chains) {
    absl::StrAppend(&out, absl::StrFormat("  %-32s %-24s %5d  %-12s  %s\n", m.chain.name, m.role, m.instances,
                                          m.key.substr(0, 12), m.layers));
    runs += m.instances;
  }
  absl::StrAppend(&out, "  ", e.chains.size(), " distinct chains, run ", runs, " times per forward pass\n");
  for (const std::string& r : e.rejected) absl::StrAppend(&out, "  not fused: ", r, "\n");
  return out;
}

absl::StatusOr<std::vector<std::string>> WriteExtraction(const Extraction& e, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::vector<std::string> paths;
  for (const zoo::ModelChain& m : e.chains) {
    const std::string path = absl::StrCat(dir, "/", m.chain.name, ".fusor");
    RETURN_IF_ERROR(WriteFile(path, absl::StrCat("# ", e.model, ": ", m.role, " (", m.layers, ", run ", m.instances,
                                                 " times per forward pass)\n", ir::ChainToText(m.chain))));
    paths.push_back(path);
  }
  return paths;
}

absl::StatusOr<std::pair<std::string, int64_t>> ParseDimBinding(const std::string& text) {
  std::pair<std::string, std::string> kv = absl::StrSplit(text, absl::MaxSplits('=', 1));
  int64_t value = 0;
  if (kv.first.empty() || !absl::SimpleAtoi(kv.second, &value)) {
    return absl::InvalidArgumentError(absl::StrCat("--dim takes NAME=VALUE (e.g. seq=512), not '", text, "'"));
  }
  return std::make_pair(kv.first, value);
}

}  // namespace fusor::client
