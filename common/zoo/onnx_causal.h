// Causal masks in exported graphs. Exporters write a causal mask as a
// tensor the graph computes (transformers builds it from a position range
// compared with a position range, the attention_mask input and a fill; older
// exports from Trilu or a lower-triangular constant). Whether a mask is
// causal is read from what it computes: its subgraph is evaluated, with
// every graph input it reads given (all ones, then random 0/1 values twice),
// and the keys it masks are compared with n <= m + offset.
#pragma once

#include <cstdint>
#include <string>

#include <onnx/onnx_pb.h>

#include "absl/status/statusor.h"

namespace fusor::zoo {

struct CausalMask {
  // For every input tried, every key past the row's m + offset is masked,
  // and with all-ones inputs exactly those are: a causal softmax with that
  // offset computes the same, whatever else the mask does.
  bool causal = false;
  int64_t offset = 0;
  // And for every input tried the mask is that and nothing else (0 on every
  // kept key, no padding): the chain needs no mask input at all.
  bool whole = false;
  // When not causal: whether the mask was evaluated (false: too large, or
  // its evaluation ran out of time or memory), and why not causal (what
  // was found, or why it could not be computed).
  bool evaluated = true;
  std::string why;
};

// Reads `mask` (a value of `graph`, bound dims folded), broadcast to scores
// [..., rows, keys]: an additive mask (masked: -1e4 or below), or with
// `kept_if` 0 or 1 the condition of a Where that keeps the scores where the
// condition is `kept_if`. The evaluation runs in a child process (bounded in
// time and memory): a damaged graph cannot take the caller down. An error
// only when the child cannot run.
absl::StatusOr<CausalMask> ReadCausalMask(const onnx::GraphProto& graph, int64_t opset, const std::string& mask,
                                          int64_t rows, int64_t keys, int kept_if = -1);

}  // namespace fusor::zoo
