// Output shapes of the onnxruntime contrib operators (domain
// com.microsoft) that its transformer optimizer writes. ONNX's shape
// inference does not know them, so without these rules everything after
// the first fused node of an optimized model has an unknown shape.
#pragma once

#include <onnx/onnx_pb.h>

namespace fusor::zoo {

// Declares (in value_info, or in place of a partial declaration) each
// output of a known contrib node whose shape follows from its inputs' (all
// dims known) and that the graph does not declare in full: Attention, MultiHeadAttention, EmbedLayerNormalization,
// SkipLayerNormalization and SkipSimplifiedLayerNormalization, BiasGelu,
// FastGelu, Gelu, QuickGelu and BiasAdd. Returns how many it added.
int InferContribShapes(onnx::GraphProto& graph);

}  // namespace fusor::zoo
