// Constant folding of the small tensors an exported graph computes its
// shapes with (Shape -> Gather -> Unsqueeze -> Concat -> Reshape, position
// ids by Range or Slice, masks' shapes by ConstantOfShape and Where, a scale
// by Cast and Sqrt of a dim). Once the symbolic dims are bound, those are
// constants; folding them lets ONNX's shape inference give Reshape, Expand,
// Tile and Slice outputs known shapes.
#pragma once

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

}  // namespace fusor::zoo
