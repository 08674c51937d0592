// ChainSpec: a chain as written, before checking. Both front ends (text and
// JSON, and the proto conversion at the service edges) fill a ChainSpec and
// call BuildChain, so every source of workloads gets the same checks and the
// same error messages, located by line/column or by field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/ir/chain.h"

namespace fusor::ir {

// Where a piece of a spec came from: a text line/column or a JSON field.
struct Where {
  std::string field;  // e.g. "ops[1].expr"; empty for text input
  int line = 0;       // 1-based; 0 for JSON input
  int column = 0;     // 1-based; 0 when unknown

  // The same place moved `offset` characters to the right.
  Where At(int offset) const;
  // "line 3, column 7" or "ops[1].expr, column 7" or "dims[0].extent".
  std::string ToString() const;
};

// Hard limits on what one workload may contain. Exceeding one is an
// INVALID_ARGUMENT error naming the limit.
struct Limits {
  int max_dims = 16;
  int max_tensors = 32;
  int max_ops = 16;
  int max_rank = 8;
  int64_t max_extent = int64_t{1} << 24;
  int64_t max_tensor_elements = int64_t{1} << 30;
  // Iterations of one op (output elements times reduced elements).
  double max_op_points = 1e13;
  int max_expr_nodes = 256;
  // Nesting of parentheses, calls and signs in one expression (value or
  // index). It bounds the recursion of the parser and of every walker of
  // the tree after it (canonicalizer, printer, reference interpreter).
  int max_expr_depth = 64;
  size_t max_spec_bytes = 64 * 1024;
};

struct DimSpec {
  std::string name;
  int64_t extent = 0;
  int64_t min = 0;  // a ranged dim's smallest size (Dim::min); 0: exactly extent
  Where where;
};

struct TensorSpec {
  std::string name;
  std::vector<std::string> shape;  // dim names or integer literals
  bool constant = false;           // the same from call to call (Tensor::constant)
  Where where;
};

struct OpSpec {
  std::string output;
  std::vector<std::string> index;
  OpKind kind = OpKind::kMap;
  std::vector<std::string> reduce;  // kSum
  std::string axis;                 // kSoftmax
  std::string expr;
  Where where;       // the op as a whole
  Where expr_where;  // the first character of `expr`
};

struct ChainSpec {
  std::string name;
  std::optional<DType> dtype;
  std::vector<DimSpec> dims;
  std::vector<TensorSpec> inputs;
  std::vector<OpSpec> ops;
  std::vector<std::string> outputs;
  std::vector<Where> output_wheres;  // parallel to outputs
  Where where;                       // the spec as a whole
};

// Checks `spec` and builds the chain. Errors are INVALID_ARGUMENT and start
// with the location of the offending piece.
absl::StatusOr<Chain> BuildChain(const ChainSpec& spec, const Limits& limits = Limits());

}  // namespace fusor::ir
