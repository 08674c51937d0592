// The chain IR: tensors, affine index expressions and ops of a fused chain.
//
// A Chain is built only through BuildChain (spec.h), which checks it: every
// access is in bounds, every op reads only tensors defined before it, and
// every dim used in a body is in the op's output index or reduced. Code that
// receives a Chain may rely on these invariants.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace fusor::ir {

enum class DType { kF32, kF16, kBF16 };

absl::string_view DTypeName(DType dtype);  // "f32", "f16", "bf16"
absl::StatusOr<DType> ParseDType(absl::string_view name);
int DTypeBytes(DType dtype);

struct Dim {
  std::string name;
  int64_t extent = 0;  // its size; a ranged dim's largest
  // A ranged dim is a size that changes from call to call (a batch, a
  // sequence, a KV cache's length), written `m=65..256`: a kernel takes any
  // size in [min, extent], given at each call; everything that depends on
  // sizes (the space, the model, buffers) is planned at `extent`. It may
  // only index, as itself, the axes declared with it (BuildChain).
  // 0: the dim is exactly `extent`.
  int64_t min = 0;

  bool Ranged() const { return min > 0; }
};

// "128", or a ranged dim's "65..256".
std::string ExtentText(const Dim& dim);

// constant + sum of coefficient * dim, with terms sorted by dim and no zero
// coefficients.
struct AffineExpr {
  std::vector<std::pair<int, int64_t>> terms;  // (dim id, coefficient)
  int64_t constant = 0;

  static AffineExpr OfDim(int dim);
  bool IsPlainDim() const { return constant == 0 && terms.size() == 1 && terms[0].second == 1; }
  bool DependsOn(int dim) const;
  int64_t Coefficient(int dim) const;
  bool operator==(const AffineExpr& other) const = default;
};

struct Access {
  int tensor = -1;
  std::vector<AffineExpr> index;
};

enum class Func { kRelu, kGelu, kGeluTanh, kExp, kTanh, kSigmoid };
absl::string_view FuncName(Func func);

struct Expr {
  enum class Kind { kConst, kAccess, kAdd, kSub, kMul, kDiv, kNeg, kCall };
  Kind kind = Kind::kConst;
  double value = 0;           // kConst
  Access access;              // kAccess
  Func func = Func::kRelu;    // kCall
  std::vector<Expr> args;     // operands of kAdd..kCall

  static Expr Const(double v);
  static Expr Of(Access a);
  static Expr Binary(Kind kind, Expr lhs, Expr rhs);
  static Expr Unary(Kind kind, Expr arg);
  static Expr Call(Func f, Expr arg);
};

enum class OpKind { kSum, kSoftmax, kMap };
absl::string_view OpKindName(OpKind kind);  // "sum", "softmax", "map"

struct Op {
  OpKind kind = OpKind::kMap;
  int output = -1;           // tensor id
  std::vector<int> index;    // output dims, one per output axis
  std::vector<int> reduce;   // kSum: summed dims
  int axis = -1;             // kSoftmax: the normalized dim
  // kSoftmax: a causal softmax keeps only the entries with
  // axis <= causal_row + causal_offset (written `softmax(n <= m)` or
  // `softmax(n <= m + 3)`); the others are 0, as if their value were -inf.
  // causal_row == -1: every entry is kept.
  int causal_row = -1;
  int64_t causal_offset = 0;
  Expr body;

  bool Causal() const { return causal_row >= 0; }
};

enum class TensorRole { kInput, kIntermediate, kOutput };

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  // Per axis, the dim it was declared with, or -1 for an integer literal.
  std::vector<int> axis_dims;
  TensorRole role = TensorRole::kInput;
  int producer = -1;  // op id for op outputs
  // An input declared constant: the same from call to call (a model's
  // weights), so a kernel may prepare it once (pack it into its own layout).
  bool constant = false;

  int64_t NumElements() const;
};

struct Chain {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<Dim> dims;
  std::vector<Tensor> tensors;
  std::vector<Op> ops;       // in dependency order
  std::vector<int> inputs;   // tensor ids, in declaration order
  std::vector<int> outputs;  // tensor ids, in declaration order

  int FindDim(absl::string_view name) const;     // -1 if absent
  int FindTensor(absl::string_view name) const;  // -1 if absent
  // The ranged dims' ids, in declaration order: the order in which a
  // kernel of the chain takes their sizes.
  std::vector<int> RangedDims() const;
};

// `chain` at one size of its ranged dims (`sizes`, one per RangedDims(),
// in that order): every dim exact, the axes declared with a ranged dim at
// its size. INVALID_ARGUMENT naming the dim when a size is outside its
// range or the count is wrong.
absl::StatusOr<Chain> AtSizes(const Chain& chain, const std::vector<int64_t>& sizes);

// Calls `fn` on every access in `expr`, in left-to-right order.
template <typename Fn>
void ForEachAccess(const Expr& expr, Fn&& fn) {
  if (expr.kind == Expr::Kind::kAccess) fn(expr.access);
  for (const Expr& arg : expr.args) ForEachAccess(arg, fn);
}

// The op's result at the op's own point: its output indexed by its index
// dims, in order.
Access ResultAccess(const Op& op);

// The tensors `op` reads, each once, in the order of first access.
std::vector<int> TensorsRead(const Op& op);

// Printing in the text front end's syntax, with the chain's names.
std::string AffineToString(const AffineExpr& e, const Chain& chain);
std::string AccessToString(const Access& a, const Chain& chain);
std::string ExprToString(const Expr& e, const Chain& chain);
std::string OpToString(const Op& op, const Chain& chain);
// A softmax's axis as written: "n", or with its causal condition "n <= m",
// "n <= m + 3".
std::string SoftmaxAxisText(const Op& op, const Chain& chain);
// Of the `extent_axis` x `extent_row` entries of a causal condition
// `axis <= row + offset`, the share kept (1 for a softmax that is not causal).
double CausalShare(const Op& op, const Chain& chain);
// The whole chain as text that ParseChainText reads back to an equal chain.
std::string ChainToText(const Chain& chain);
// The text of a chain made of some of `chain`'s parts: `dims`, `ops`
// (ids, in order), reading `inputs` and writing `outputs` (tensor ids).
std::string ChainToText(const Chain& chain, const std::string& name, const std::vector<int>& dims,
                        const std::vector<int>& ops, const std::vector<int>& inputs, const std::vector<int>& outputs);

// FLOPs of one evaluation of the chain (multiply-add = 2); under a causal
// softmax, the sums over its rows and axis count the kept keys only, unless
// `dense` (what computing every key and masking does).
double ChainFlops(const Chain& chain, bool dense = false);

}  // namespace fusor::ir
