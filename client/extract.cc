#include "client/extract.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/ir/canonical.h"
#include "common/util/status_macros.h"

namespace fusor::client {

absl::StatusOr<Extraction> ExtractModel(const std::string& path, const std::map<std::string, int64_t>& dims) {
  if (absl::EndsWith(absl::AsciiStrToLower(path), ".onnx")) {
    return absl::UnimplementedError(absl::StrCat(
        path, ": ONNX import is not built yet; describe the model as JSON instead (see examples/models/)"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  auto config = zoo::ParseTransformerConfig(text.str());
  if (!config.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", config.status().message()));
  Extraction e;
  e.config = *config;
  RETURN_IF_ERROR(zoo::BindDims(dims, e.config));
  ASSIGN_OR_RETURN(e.chains, zoo::ExpandTransformer(e.config));
  return e;
}

std::string FormatExtraction(const Extraction& e) {
  const zoo::TransformerConfig& c = e.config;
  std::string out = absl::StrCat(c.model, ": ", c.architecture, ", hidden ", c.hidden, ", ", c.heads, " heads");
  if (c.kv_heads != c.heads) absl::StrAppend(&out, " (", c.kv_heads, " K/V heads)");
  absl::StrAppend(&out, ", ffn ", c.ffn, " (", c.activation, "), batch ", c.batch, ", seq ", c.seq);
  if (c.architecture == "encoder-decoder") absl::StrAppend(&out, ", target seq ", c.target_seq);
  absl::StrAppend(&out, ", ", ir::DTypeName(c.dtype), "\n");
  if (!c.source.empty()) absl::StrAppend(&out, "  shapes: ", c.source, "\n");
  absl::StrAppend(&out, absl::StrFormat("  %-32s %-24s %-24s %5s  %s\n", "chain", "role", "stands for", "runs", "key"));
  int runs = 0;
  for (const zoo::ModelChain& m : e.chains) {
    absl::StrAppend(&out, absl::StrFormat("  %-32s %-24s %-24s %5d  %s\n", m.chain.name, m.role, m.layers, m.instances,
                                          ir::Canonicalize(m.chain).key.substr(0, 12)));
    runs += m.instances;
  }
  absl::StrAppend(&out, "  ", e.chains.size(), " distinct chains, run ", runs, " times per forward pass\n");
  return out;
}

absl::StatusOr<std::vector<std::string>> WriteExtraction(const Extraction& e, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::vector<std::string> paths;
  for (const zoo::ModelChain& m : e.chains) {
    const std::string path = absl::StrCat(dir, "/", m.chain.name, ".fusor");
    std::ofstream f(path);
    f << "# " << e.config.model << ": " << m.role << " (" << m.layers << ", run " << m.instances
      << " times per forward pass)\n"
      << ir::ChainToText(m.chain);
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
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
