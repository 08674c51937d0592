// ONNX import (Debian's libonnx): the fusible chains of an ONNX model's
// graph. Weights are never read — only the graph, the shapes and the few
// scalars a chain needs (an attention's scale) — so a model whose
// external data files are absent imports all the same.
//
// Symbolic dims are bound by name (--dim batch=8) before ONNX's shape
// inference runs; inference and the folding of shape computations
// (onnx_fold.h) then take turns. Recognized, each from the nodes exporters
// produce:
//  - attention: MatMul(Q, K') -> Div or Mul by a scalar -> optional Add of
//    a mask (broadcast as ONNX broadcasts) or Where(cond, scores, fill of
//    -1e4 or below), read as an additive mask -> Softmax over the last axis ->
//    MatMul(., V); a Transpose producing Q, K' or V folds into the chain's
//    indices (K' = Transpose(K) is read as K); SDPA decomposed (a scalar Mul
//    on each of Q and K', Where(IsNaN(P), 0, P) after the softmax); K and
//    V repeated per query head (repeat_kv: Reshape(Expand(Unsqueeze))) read
//    as grouped-query attention; also the single-node forms, ONNX's
//    Attention (opset 23, grouped-query included) and onnxruntime's
//    MultiHeadAttention and packed-projection Attention (whose shapes, with
//    the other contrib ops', come from onnx_contrib.h);
//  - GEMM chains: MatMul or Gemm -> optional bias (an Add, or Gemm's C)
//    -> Relu, Gelu (erf or tanh), onnxruntime's BiasGelu or FastGelu, or
//    GELU written out with Erf or Tanh -> MatMul or Gemm -> optional bias,
//    looking through the Reshapes that merge rows around a 2-D Gemm
//    (GPT-2's Conv1D); and SwiGLU: SiLU (x * Sigmoid(x)) of a gate MatMul
//    times an up MatMul of the same input -> MatMul;
//  - convolution chains: Conv (one group; a padded one reads its input
//    zero-padded ahead, as the chain's source says) -> optional Relu ->
//    unpadded 1x1 Conv.
// Every candidate that does not match says why, naming its node.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/zoo/transformer.h"

namespace fusor::zoo {

struct OnnxExtraction {
  std::string model;                  // the graph's name
  std::vector<ModelChain> chains;     // each distinct one once; layers: its source nodes
  std::vector<std::string> rejected;  // "node 'X' (Softmax): why"
};

// INVALID_ARGUMENT for a file that is not an ONNX model; NOT_FOUND when it
// cannot be read.
absl::StatusOr<OnnxExtraction> ExtractOnnx(const std::string& path, const std::map<std::string, int64_t>& dims);

}  // namespace fusor::zoo
