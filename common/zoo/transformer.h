// Built-in model descriptions: a transformer given by its configuration
// expands to the fusible chains of its layers (issue: sweeps over model
// zoos without an ONNX file at hand).
//
// Per layer stack it yields the two memory-bound compute-intensive chains
// fusor fuses — attention (Q·Kᵀ, scale, mask or bias, softmax, ·V) and the
// feed-forward block (GEMM, bias, activation, GEMM; SwiGLU's two input
// GEMMs) — each once, with the layers it stands for. The projections
// around them are single GEMMs and are left to the BLAS.
//
// A description is JSON:
//   {"model": "bert-base", "architecture": "encoder", "hidden": 768,
//    "heads": 12, "kv_heads": 12, "ffn": 3072, "layers": 12,
//    "activation": "gelu", "mask": "padding", "bias": true,
//    "seq": 128, "batch": 1, "dtype": "f16", "source": "..."}
// architecture: encoder | decoder | encoder-decoder (then also
// "decoder_layers" and "target_seq"); activation: gelu (erf) | gelu_tanh
// (GPT-2's tanh approximation) | relu | swiglu;
// mask: none | padding (additive, per batch and key) | causal (a causal
// softmax, softmax(n <= m)) | bias (additive per head, query and key: T5's
// relative position bias; a decoder's self-attention adds the causal mask
// to it; a decoder's self-attention is always causal); attention_scale
// (default 1/sqrt(head dim)). kv_heads < heads is grouped-query attention: each K/V head
// serves heads / kv_heads query heads.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/ir/chain.h"

namespace fusor::zoo {

struct TransformerConfig {
  std::string model;
  std::string architecture = "encoder";
  int64_t hidden = 0, heads = 0, kv_heads = 0, ffn = 0, layers = 0;
  int64_t decoder_layers = 0;  // encoder-decoder only
  std::string activation = "gelu";
  std::string mask = "none";
  bool bias = true;  // the FFN's GEMMs add a bias
  int64_t seq = 0, target_seq = 0, batch = 1;
  ir::DType dtype = ir::DType::kF16;
  double attention_scale = 0;  // of Q·Kᵀ; 0: 1 / sqrt(head dim) (T5: 1)
  std::string source;          // where the shapes are published
};

// INVALID_ARGUMENT naming the field for a malformed description.
absl::StatusOr<TransformerConfig> ParseTransformerConfig(const std::string& json);

// Overrides batch, seq and target_seq (e.g. from --dim seq=512);
// INVALID_ARGUMENT for another name or a value below 1.
absl::Status BindDims(const std::map<std::string, int64_t>& dims, TransformerConfig& config);

struct ModelChain {
  ir::Chain chain;
  std::string role;     // "self-attention", "decoder cross-attention", "ffn", ...
  std::string layers;   // where it comes from, e.g. "encoder layers 1-12" or the ONNX nodes
  int instances = 0;    // how many times the model runs it
  std::string key;      // the chain's canonical key (AddDistinct sets it)
};

// Appends `chain` to `chains`, or folds it into the one with its canonical
// key: roles joined by " = " when they differ, sources by "; ", instances
// added.
void AddDistinct(std::vector<ModelChain>& chains, ModelChain chain);

// The chains of the model, each distinct one once.
absl::StatusOr<std::vector<ModelChain>> ExpandTransformer(const TransformerConfig& config);

}  // namespace fusor::zoo
