#include "common/zoo/transformer.h"

#include <cctype>
#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ir/canonical.h"
#include "common/ir/parse.h"
#include "common/util/files.h"
#include "common/util/status_macros.h"

namespace fusor::zoo {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(const std::string& model, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("model '", model, "': ", message));
}

std::string Identifier(const std::string& name) {
  std::string out;
  for (char c : name) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out.empty() || std::isdigit(static_cast<unsigned char>(out[0])) ? "m_" + out : out;
}

// The heads' index: "h" for multi-head attention; "g,r" (K/V head, query
// head within its group) for grouped-query attention, K and V indexed by g.
struct Heads {
  std::string dims, query, kv;
};
Heads HeadsOf(const TransformerConfig& c) {
  if (c.kv_heads == c.heads) return {absl::StrCat(" h=", c.heads), "h", "h"};
  return {absl::StrCat(" g=", c.kv_heads, " r=", c.heads / c.kv_heads), "g,r", "g"};
}

// Attention over `queries` x `keys` positions; `mask`: none, padding,
// causal, bias or bias+causal.
absl::StatusOr<ir::Chain> Attention(const TransformerConfig& c, const std::string& name, int64_t queries,
                                    int64_t keys, const std::string& mask, double scale) {
  const Heads h = HeadsOf(c);
  const int64_t d = c.hidden / c.heads;
  std::string inputs = absl::StrCat("Q[b,", h.query, ",m,d] K[b,", h.kv, ",n,d] V[b,", h.kv, ",n,e]");
  std::string add;
  if (mask == "padding") {
    inputs += " M[b,n]";
    add = " + M[b,n]";
  }
  if (mask == "bias" || mask == "bias+causal") {
    inputs += absl::StrCat(" B[", h.query, ",m,n]");
    add += absl::StrCat(" + B[", h.query, ",m,n]");
  }
  // Causal: the softmax drops the keys past the query (as many as the keys).
  std::string axis = "n";
  if (mask == "causal" || mask == "bias+causal") {
    if (queries == keys) {
      axis = "n <= m";
    } else {
      inputs += " C[m,n]";
      add += " + C[m,n]";
    }
  }
  const std::string point = absl::StrCat("b,", h.query, ",m");
  const std::string text = absl::StrCat(
      "chain ", name, "\ndtype ", ir::DTypeName(c.dtype), "\ndim b=", c.batch, h.dims, " m=", queries, " n=", keys,
      " d=", d, " e=", d, "\nin ", inputs, "\n",
      "S[", point, ",n] = sum(d) Q[b,", h.query, ",m,d] * K[b,", h.kv, ",n,d]",
      scale == 1 ? "" : absl::StrCat(" * ", scale), "\n",
      "P[", point, ",n] = softmax(", axis, ") S[", point, ",n]", add, "\n",
      "O[", point, ",e] = sum(n) P[", point, ",n] * V[b,", h.kv, ",n,e]\nout O\n");
  return ir::ParseChainText(text);
}

absl::StatusOr<ir::Chain> FeedForward(const TransformerConfig& c, const std::string& name, int64_t tokens) {
  std::string text = absl::StrCat("chain ", name, "\ndtype ", ir::DTypeName(c.dtype), "\ndim t=", tokens,
                                  " c=", c.hidden, " f=", c.ffn, " o=", c.hidden, "\n");
  if (c.activation == "swiglu") {
    absl::StrAppend(&text,
                    "in X[t,c] WG[c,f] WU[c,f] WD[f,o]\n"
                    "const WG WU WD\n"
                    "G[t,f] = sum(c) X[t,c] * WG[c,f]\n"
                    "U[t,f] = sum(c) X[t,c] * WU[c,f]\n"
                    "A[t,f] = G[t,f] * sigmoid(G[t,f]) * U[t,f]\n"
                    "Y[t,o] = sum(f) A[t,f] * WD[f,o]\nout Y\n");
  } else {
    const std::string h = c.bias ? "H[t,f] + B1[f]" : "H[t,f]";
    absl::StrAppend(&text, "in X[t,c] W1[c,f] W2[f,o]", c.bias ? " B1[f] B2[o]" : "", "\n",
                    "const W1 W2", c.bias ? " B1 B2" : "", "\n",  // the model's weights
                    "H[t,f] = sum(c) X[t,c] * W1[c,f]\n",
                    "A[t,f] = ", c.activation, "(", h, ")\n",
                    "Y[t,o] = sum(f) A[t,f] * W2[f,o]\n",
                    c.bias ? "Z[t,o] = Y[t,o] + B2[o]\nout Z\n" : "out Y\n");
  }
  return ir::ParseChainText(text);
}

std::string Range(const std::string& what, int64_t layers) {
  return layers == 1 ? absl::StrCat(what, " 1") : absl::StrCat(what, "s 1-", layers);
}

}  // namespace

void AddDistinct(std::vector<ModelChain>& chains, ModelChain chain) {
  chain.key = ir::Canonicalize(chain.chain).key;
  for (ModelChain& m : chains) {
    if (m.key != chain.key) continue;
    if (m.role != chain.role) m.role += " = " + chain.role;
    m.layers += "; " + chain.layers;
    m.instances += chain.instances;
    return;
  }
  chains.push_back(std::move(chain));
}

absl::StatusOr<TransformerConfig> ParseTransformerConfig(const std::string& text) {
  RETURN_IF_ERROR(CheckJsonDepth(text, "model description"));
  const Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("a model description is a JSON object");
  TransformerConfig c;
  c.model = j.value("model", "");
  if (c.model.empty()) return absl::InvalidArgumentError("a model description needs \"model\" (its name)");
  static const char* kKnown[] = {"model",      "architecture", "hidden", "heads",      "kv_heads", "ffn",
                                 "layers",     "decoder_layers", "activation", "mask", "bias",     "seq",
                                 "target_seq", "batch",        "dtype",  "source", "attention_scale"};
  for (const auto& [key, value] : j.items()) {
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      return Invalid(c.model, absl::StrCat("unknown field \"", key, "\""));
    }
  }
  try {
    c.architecture = j.value("architecture", c.architecture);
    c.hidden = j.at("hidden").get<int64_t>();
    c.heads = j.at("heads").get<int64_t>();
    c.kv_heads = j.value("kv_heads", c.heads);
    c.ffn = j.at("ffn").get<int64_t>();
    c.layers = j.at("layers").get<int64_t>();
    c.decoder_layers = j.value("decoder_layers", int64_t{0});
    c.activation = j.value("activation", c.activation);
    c.mask = j.value("mask", c.mask);
    c.bias = j.value("bias", c.bias);
    c.seq = j.at("seq").get<int64_t>();
    c.target_seq = j.value("target_seq", int64_t{0});
    c.batch = j.value("batch", c.batch);
    c.source = j.value("source", "");
    const std::string dtype = j.value("dtype", "f16");
    if (dtype == "f32") {
      c.dtype = ir::DType::kF32;
    } else if (dtype == "bf16") {
      c.dtype = ir::DType::kBF16;
    } else if (dtype != "f16") {
      return Invalid(c.model, absl::StrCat("dtype must be f16, bf16 or f32, not \"", dtype, "\""));
    }
    c.attention_scale = j.value("attention_scale", 0.0);
  } catch (const Json::exception& e) {
    return Invalid(c.model, absl::StrCat("a field is missing or has the wrong type (", e.what(), ")"));
  }
  for (const auto& [name, value] : {std::pair{"hidden", c.hidden}, std::pair{"heads", c.heads},
                                    std::pair{"kv_heads", c.kv_heads}, std::pair{"ffn", c.ffn},
                                    std::pair{"layers", c.layers}, std::pair{"seq", c.seq},
                                    std::pair{"batch", c.batch}}) {
    if (value < 1) return Invalid(c.model, absl::StrCat(name, " must be at least 1"));
  }
  if (c.attention_scale < 0) return Invalid(c.model, "attention_scale must be positive");
  if (c.hidden % c.heads != 0) return Invalid(c.model, "heads must divide hidden");
  if (c.heads % c.kv_heads != 0) return Invalid(c.model, "kv_heads must divide heads");
  if (c.architecture != "encoder" && c.architecture != "decoder" && c.architecture != "encoder-decoder") {
    return Invalid(c.model, "architecture must be encoder, decoder or encoder-decoder");
  }
  if (c.architecture == "encoder-decoder") {
    if (c.decoder_layers < 1) return Invalid(c.model, "an encoder-decoder needs decoder_layers");
    if (c.target_seq == 0) c.target_seq = c.seq;
  }
  if (c.activation != "gelu" && c.activation != "gelu_tanh" && c.activation != "relu" && c.activation != "swiglu") {
    return Invalid(c.model, "activation must be gelu, gelu_tanh, relu or swiglu");
  }
  if (c.mask != "none" && c.mask != "padding" && c.mask != "causal" && c.mask != "bias") {
    return Invalid(c.model, "mask must be none, padding, causal or bias");
  }
  return c;
}

absl::Status BindDims(const std::map<std::string, int64_t>& dims, TransformerConfig& config) {
  for (const auto& [name, value] : dims) {
    if (value < 1) return Invalid(config.model, absl::StrCat("--dim ", name, " must be at least 1"));
    if (name == "batch") {
      config.batch = value;
    } else if (name == "seq") {
      config.seq = value;
    } else if (name == "target_seq" && config.architecture == "encoder-decoder") {
      config.target_seq = value;
    } else {
      return Invalid(config.model,
                     absl::StrCat("no dim '", name, "' to bind (batch, seq",
                                  config.architecture == "encoder-decoder" ? ", target_seq" : "", ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ModelChain>> ExpandTransformer(const TransformerConfig& c) {
  const std::string base = Identifier(c.model);
  const double scale =
      c.attention_scale > 0 ? c.attention_scale : 1.0 / std::sqrt(static_cast<double>(c.hidden / c.heads));
  std::vector<ModelChain> out;
  auto add = [&](absl::StatusOr<ir::Chain> chain, const std::string& role, const std::string& layers,
                 int64_t instances) -> absl::Status {
    if (!chain.ok()) return Invalid(c.model, absl::StrCat(role, ": ", chain.status().message()));
    AddDistinct(out, {std::move(*chain), role, layers, static_cast<int>(instances)});
    return absl::OkStatus();
  };
  const bool enc_dec = c.architecture == "encoder-decoder";
  const std::string stack = enc_dec ? "encoder layer" : "layer";
  // A decoder's self-attention is causal (T5's adds its position bias).
  const std::string self_mask = c.architecture == "encoder" ? c.mask
                                : c.mask == "bias"          ? "bias+causal"
                                                            : "causal";
  const std::string first_mask = c.architecture == "decoder" ? self_mask : c.mask;
  RETURN_IF_ERROR(add(Attention(c, base + "_self_attention", c.seq, c.seq, first_mask, scale), "self-attention",
                      Range(stack, c.layers), c.layers));
  RETURN_IF_ERROR(add(FeedForward(c, base + "_ffn", c.batch * c.seq), "ffn", Range(stack, c.layers), c.layers));
  if (enc_dec) {
    const std::string dec = "decoder layer";
    RETURN_IF_ERROR(add(Attention(c, base + "_decoder_self_attention", c.target_seq, c.target_seq, self_mask, scale),
                        "decoder self-attention", Range(dec, c.decoder_layers), c.decoder_layers));
    RETURN_IF_ERROR(add(Attention(c, base + "_cross_attention", c.target_seq, c.seq, "none", scale),
                        "cross-attention", Range(dec, c.decoder_layers), c.decoder_layers));
    RETURN_IF_ERROR(add(FeedForward(c, base + "_decoder_ffn", c.batch * c.target_seq), "decoder ffn",
                        Range(dec, c.decoder_layers), c.decoder_layers));
  }
  return out;
}

}  // namespace fusor::zoo
