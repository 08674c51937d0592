// Constant folding of the small tensors an exported graph computes its
// shapes with (Shape -> Gather -> Unsqueeze -> Concat -> Reshape, position
// ids by Range or Slice, masks' shapes by ConstantOfShape and Where, a scale
// by Cast and Sqrt of a dim). Once the symbolic dims are bound, those are
// constants; folding them lets ONNX's shape inference give Reshape, Expand,
// Tile and Slice outputs known shapes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

namespace fusor::zoo {

// Most elements a folded tensor may have: shape computations are small;
// anything larger stays a node (its shape is still inferred).
inline constexpr int64_t kMaxFoldedElements = 1 << 16;

// Replaces each node whose inputs are all known (inline constants, earlier
// folds, Shape of a value whose shape the graph declares in full) by a
// Constant node with the same output. Reads shapes from the graph's inputs,
// value_info, outputs and initializers. Returns how many nodes it replaced.
int FoldShapeComputations(onnx::GraphProto& graph, int64_t opset);

// A tensor's ONNX element type, dims and elements (as doubles).
struct FoldedTensor {
  int type = 0;
  std::vector<int64_t> dims;
  std::vector<double> values;
};

// The value of `name` in `graph` when it is computed from constants only
// (initializers, Constant nodes: give the graph's inputs as such), each
// tensor on the way of at most `limit` elements; infinities are kept.
// nullopt when it does not fold.
std::optional<FoldedTensor> EvaluateConstant(onnx::GraphProto graph, int64_t opset, const std::string& name,
                                             int64_t limit);

}  // namespace fusor::zoo
