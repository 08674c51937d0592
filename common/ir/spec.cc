#include "common/ir/spec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "common/ir/lexer.h"
#include "common/util/status_macros.h"
#include "common/util/text.h"

namespace fusor::ir {

Where Where::At(int offset) const {
  Where w = *this;
  w.column = (column > 0 ? column : 1) + offset;
  return w;
}

std::string Where::ToString() const {
  std::string s;
  if (line > 0) {
    s = absl::StrCat("line ", line);
  } else if (!field.empty()) {
    s = field;
  } else {
    s = "workload";
  }
  if (column > 0) absl::StrAppend(&s, ", column ", column);
  return s;
}

namespace {

absl::Status Error(const Where& where, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(where.ToString(), ": ", message));
}

const std::set<std::string, std::less<>>& ReservedWords() {
  static const auto* words = new std::set<std::string, std::less<>>{
      "sum", "softmax", "relu", "gelu", "gelu_tanh", "exp", "tanh", "sigmoid",
      "chain", "dtype", "dim", "in", "out"};
  return *words;
}

absl::Status CheckName(absl::string_view name, absl::string_view what, const Where& where) {
  if (!IsIdentifier(name)) {
    return Error(where, absl::StrCat(what, " name '", Echo(name), "' is not an identifier"));
  }
  if (name.size() > kMaxNameBytes) {
    return Error(where, absl::StrCat(what, " name '", Echo(name, 40), "' is longer than ", kMaxNameBytes, " bytes"));
  }
  if (ReservedWords().count(name) > 0) {
    return Error(where, absl::StrCat(what, " name '", name, "' is a reserved word"));
  }
  return absl::OkStatus();
}

std::optional<Func> LookupFunc(absl::string_view name) {
  if (name == "relu") return Func::kRelu;
  if (name == "gelu") return Func::kGelu;
  if (name == "gelu_tanh") return Func::kGeluTanh;
  if (name == "exp") return Func::kExp;
  if (name == "tanh") return Func::kTanh;
  if (name == "sigmoid") return Func::kSigmoid;
  return std::nullopt;
}

constexpr int64_t kMaxIndexValue = int64_t{1} << 31;

// Recursive-descent parser for one expression string against a partly
// built chain (the tensors defined so far).
class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, const Where& where, const Chain& chain,
             const Limits& limits)
      : tokens_(std::move(tokens)), where_(where), chain_(chain), limits_(limits) {}

  absl::StatusOr<Expr> ParseAll() {
    ASSIGN_OR_RETURN(Expr e, ParseSum());
    if (Peek().kind != Token::Kind::kEnd) {
      return ErrorAt(Peek(), absl::StrCat("unexpected '", Peek().text, "' after the expression"));
    }
    return e;
  }

 private:
  const Token& Peek() const { return tokens_[pos_]; }
  const Token& Next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }

  absl::Status ErrorAt(const Token& tok, absl::string_view message) const {
    return Error(where_.At(tok.offset), message);
  }

  absl::Status CountNode(const Token& tok) {
    if (++nodes_ > limits_.max_expr_nodes) {
      return ErrorAt(tok, absl::StrCat("expression has more than ", limits_.max_expr_nodes,
                                       " nodes (limit)"));
    }
    return absl::OkStatus();
  }

  // Counts one level of nesting for as long as it lives.
  class Nested {
   public:
    explicit Nested(int& depth) : depth_(depth) { ++depth_; }
    ~Nested() { --depth_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    int& depth_;
  };

  absl::Status CheckDepth(const Token& tok) const {
    if (depth_ > limits_.max_expr_depth) {
      return ErrorAt(tok, absl::StrCat("expression nests deeper than ", limits_.max_expr_depth, " levels (limit)"));
    }
    return absl::OkStatus();
  }

  absl::Status Expect(char c) {
    if (!Peek().Is(c)) {
      std::string got = Peek().kind == Token::Kind::kEnd ? "end of input" : "'" + Peek().text + "'";
      return ErrorAt(Peek(), absl::StrCat("expected '", std::string(1, c), "' but found ", got));
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<Expr> ParseSum() {
    ASSIGN_OR_RETURN(Expr lhs, ParseProduct());
    while (Peek().Is('+') || Peek().Is('-')) {
      const Token& op = Next();
      RETURN_IF_ERROR(CountNode(op));
      ASSIGN_OR_RETURN(Expr rhs, ParseProduct());
      lhs = Expr::Binary(op.Is('+') ? Expr::Kind::kAdd : Expr::Kind::kSub, std::move(lhs),
                         std::move(rhs));
    }
    return lhs;
  }

  absl::StatusOr<Expr> ParseProduct() {
    ASSIGN_OR_RETURN(Expr lhs, ParseUnary());
    while (Peek().Is('*') || Peek().Is('/')) {
      const Token& op = Next();
      RETURN_IF_ERROR(CountNode(op));
      ASSIGN_OR_RETURN(Expr rhs, ParseUnary());
      lhs = Expr::Binary(op.Is('*') ? Expr::Kind::kMul : Expr::Kind::kDiv, std::move(lhs),
                         std::move(rhs));
    }
    return lhs;
  }

  // Every cycle of the recursion passes here.
  absl::StatusOr<Expr> ParseUnary() {
    Nested nested(depth_);
    RETURN_IF_ERROR(CheckDepth(Peek()));
    if (Peek().Is('-')) {
      const Token& op = Next();
      RETURN_IF_ERROR(CountNode(op));
      ASSIGN_OR_RETURN(Expr arg, ParseUnary());
      if (arg.kind == Expr::Kind::kConst) return Expr::Const(-arg.value);
      return Expr::Unary(Expr::Kind::kNeg, std::move(arg));
    }
    return ParsePrimary();
  }

  absl::StatusOr<Expr> ParsePrimary() {
    const Token& tok = Peek();
    RETURN_IF_ERROR(CountNode(tok));
    if (tok.kind == Token::Kind::kNumber) {
      Next();
      char* end = nullptr;
      double v = std::strtod(tok.text.c_str(), &end);
      if (!std::isfinite(v)) return ErrorAt(tok, absl::StrCat("number '", tok.text, "' is not finite"));
      return Expr::Const(v);
    }
    if (tok.Is('(')) {
      Next();
      ASSIGN_OR_RETURN(Expr e, ParseSum());
      RETURN_IF_ERROR(Expect(')'));
      return e;
    }
    if (tok.kind != Token::Kind::kIdent) {
      std::string got = tok.kind == Token::Kind::kEnd ? "end of input" : "'" + tok.text + "'";
      return ErrorAt(tok, absl::StrCat("expected a tensor access, number or function, found ", got));
    }
    Next();
    if (auto func = LookupFunc(tok.text)) {
      if (!Peek().Is('(')) return ErrorAt(Peek(), absl::StrCat("expected '(' after ", tok.text));
      Next();
      ASSIGN_OR_RETURN(Expr arg, ParseSum());
      RETURN_IF_ERROR(Expect(')'));
      return Expr::Call(*func, std::move(arg));
    }
    if (tok.text == "sum" || tok.text == "softmax") {
      return ErrorAt(tok, absl::StrCat("'", tok.text,
                                       "' may only start the right-hand side of an op"));
    }
    int tensor = chain_.FindTensor(tok.text);
    if (tensor < 0) {
      if (chain_.FindDim(tok.text) >= 0) {
        return ErrorAt(tok, absl::StrCat("dim '", tok.text,
                                         "' used as a value; only tensor elements are values"));
      }
      return ErrorAt(tok, absl::StrCat("unknown tensor '", tok.text,
                                       "' (not an input or the output of an earlier op)"));
    }
    if (!Peek().Is('[')) {
      return ErrorAt(Peek(), absl::StrCat("expected '[' after tensor '", tok.text, "'"));
    }
    Next();
    Access access;
    access.tensor = tensor;
    std::vector<int> offsets;
    while (true) {
      offsets.push_back(Peek().offset);
      ASSIGN_OR_RETURN(AffineExpr idx, ParseAffine());
      access.index.push_back(std::move(idx));
      if (Peek().Is(',')) {
        Next();
        continue;
      }
      RETURN_IF_ERROR(Expect(']'));
      break;
    }
    const Tensor& t = chain_.tensors[tensor];
    if (access.index.size() != t.shape.size()) {
      return ErrorAt(tok, absl::StrCat("tensor '", t.name, "' has ", t.shape.size(),
                                       " axes but is indexed with ", access.index.size()));
    }
    for (size_t a = 0; a < access.index.size(); ++a) {
      const AffineExpr& e = access.index[a];
      RETURN_IF_ERROR(CheckRangedIndex(t, a, e, where_.At(offsets[a])));
      int64_t lo = e.constant, hi = e.constant;
      for (const auto& [d, c] : e.terms) {
        int64_t span = c * (chain_.dims[d].extent - 1);
        (span > 0 ? hi : lo) += span;
      }
      if (lo < 0 || hi >= t.shape[a]) {
        Where w = where_.At(offsets[a]);
        return Error(w, absl::StrCat("index '", AffineToString(e, chain_), "' of '", t.name,
                                     "' axis ", a, " ranges over [", lo, ", ", hi,
                                     "] but the axis has extent ", t.shape[a]));
      }
    }
    Expr e = Expr::Of(std::move(access));
    return e;
  }

  // A ranged dim changes size from call to call, and with it the axes
  // declared with it: such an axis is indexed by its dim alone, so that
  // every access stays in bounds at every size (an axis of fixed extent
  // in bounds at the largest sizes is at every smaller one).
  absl::Status CheckRangedIndex(const Tensor& t, size_t axis, const AffineExpr& e, const Where& w) const {
    const int declared = t.axis_dims[axis];
    if (declared >= 0 && chain_.dims[declared].Ranged() && !(e.IsPlainDim() && e.terms[0].first == declared)) {
      return Error(w, absl::StrCat("axis ", axis, " of '", t.name, "' is declared with ranged dim '",
                                   chain_.dims[declared].name, "', so it is indexed by '", chain_.dims[declared].name,
                                   "' alone, not '", AffineToString(e, chain_), "'"));
    }
    return absl::OkStatus();
  }

  // Affine index: integer-weighted sum of dims plus a constant.
  absl::StatusOr<AffineExpr> ParseAffine() {
    ASSIGN_OR_RETURN(AffineExpr lhs, ParseAffineTerm());
    while (Peek().Is('+') || Peek().Is('-')) {
      const Token& op = Next();
      ASSIGN_OR_RETURN(AffineExpr rhs, ParseAffineTerm());
      ASSIGN_OR_RETURN(lhs, Combine(lhs, rhs, op.Is('-') ? -1 : 1, op));
    }
    return lhs;
  }

  absl::StatusOr<AffineExpr> ParseAffineTerm() {
    const Token& start = Peek();
    ASSIGN_OR_RETURN(AffineExpr lhs, ParseAffineFactor());
    while (Peek().Is('*')) {
      const Token& op = Next();
      ASSIGN_OR_RETURN(AffineExpr rhs, ParseAffineFactor());
      if (!lhs.terms.empty() && !rhs.terms.empty()) {
        return ErrorAt(start, "index expression is not affine (product of two dims)");
      }
      if (lhs.terms.empty()) std::swap(lhs, rhs);
      ASSIGN_OR_RETURN(lhs, Combine(AffineExpr(), lhs, rhs.constant, op));
    }
    return lhs;
  }

  // Every cycle of the recursion passes here.
  absl::StatusOr<AffineExpr> ParseAffineFactor() {
    const Token& tok = Peek();
    Nested nested(depth_);
    RETURN_IF_ERROR(CheckDepth(tok));
    if (tok.Is('-')) {
      Next();
      ASSIGN_OR_RETURN(AffineExpr e, ParseAffineFactor());
      return Combine(AffineExpr(), e, -1, tok);
    }
    if (tok.Is('(')) {
      Next();
      ASSIGN_OR_RETURN(AffineExpr e, ParseAffine());
      RETURN_IF_ERROR(Expect(')'));
      return e;
    }
    if (tok.kind == Token::Kind::kNumber) {
      Next();
      if (tok.text.find_first_of(".eE") != std::string::npos) {
        return ErrorAt(tok, absl::StrCat("index coefficient '", tok.text, "' is not an integer"));
      }
      if (tok.text.size() > 12) return ErrorAt(tok, "index constant is too large");
      AffineExpr e;
      e.constant = std::stoll(tok.text);
      return e;
    }
    if (tok.kind == Token::Kind::kIdent) {
      Next();
      int d = chain_.FindDim(tok.text);
      if (d < 0) return ErrorAt(tok, absl::StrCat("unknown dim '", tok.text, "' in index"));
      return AffineExpr::OfDim(d);
    }
    std::string got = tok.kind == Token::Kind::kEnd ? "end of input" : "'" + tok.text + "'";
    return ErrorAt(tok, absl::StrCat("expected a dim or integer in index, found ", got));
  }

  // lhs + scale * rhs, normalized. Coefficients and constants stay within
  // kMaxIndexValue, so that bounds checks on them cannot overflow.
  absl::StatusOr<AffineExpr> Combine(const AffineExpr& lhs, const AffineExpr& rhs, int64_t scale,
                                     const Token& at) const {
    bool overflow = false;
    auto add_scaled = [&](int64_t& into, int64_t v) {
      int64_t product = 0;
      overflow = overflow || __builtin_mul_overflow(scale, v, &product) ||
                 __builtin_add_overflow(into, product, &into) || into > kMaxIndexValue ||
                 into < -kMaxIndexValue;
    };
    AffineExpr out = lhs;
    add_scaled(out.constant, rhs.constant);
    for (const auto& [d, c] : rhs.terms) {
      auto it = std::find_if(out.terms.begin(), out.terms.end(),
                             [d = d](const auto& t) { return t.first == d; });
      if (it == out.terms.end()) {
        out.terms.push_back({d, 0});
        it = out.terms.end() - 1;
      }
      add_scaled(it->second, c);
    }
    if (overflow) {
      return ErrorAt(at, absl::StrCat("index coefficient or constant beyond +-", kMaxIndexValue));
    }
    std::erase_if(out.terms, [](const auto& t) { return t.second == 0; });
    std::sort(out.terms.begin(), out.terms.end());
    return out;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  Where where_;
  const Chain& chain_;
  const Limits& limits_;
  int nodes_ = 0;
  int depth_ = 0;
};

absl::StatusOr<int> ResolveDim(const Chain& chain, const std::string& name, const Where& where) {
  int d = chain.FindDim(name);
  if (d < 0) return Error(where, absl::StrCat("unknown dim '", name, "'"));
  return d;
}

// A softmax's axis, "n", or "n <= m" / "n <= m + 3" for a causal softmax.
absl::Status ResolveSoftmaxAxis(const Chain& chain, const OpSpec& spec, Op& op) {
  const std::vector<std::string> parts = absl::StrSplit(spec.axis, "<=");
  auto in_index = [&](int d) { return std::find(op.index.begin(), op.index.end(), d) != op.index.end(); };
  ASSIGN_OR_RETURN(op.axis, ResolveDim(chain, std::string(absl::StripAsciiWhitespace(parts[0])), spec.where));
  if (!in_index(op.axis)) {
    return Error(spec.where, absl::StrCat("softmax axis '", chain.dims[op.axis].name, "' is not in the output index"));
  }
  if (parts.size() == 1) return absl::OkStatus();
  const std::string usage = "a causal softmax is written softmax(n <= m) or softmax(n <= m + 3)";
  if (parts.size() > 2) return Error(spec.where, usage);
  const std::vector<std::string> terms = absl::StrSplit(parts[1], '+');
  if (terms.size() > 2) return Error(spec.where, usage);
  const std::string row(absl::StripAsciiWhitespace(terms[0]));
  if (!IsIdentifier(row)) return Error(spec.where, usage);
  ASSIGN_OR_RETURN(op.causal_row, ResolveDim(chain, row, spec.where));
  if (op.causal_row == op.axis || !in_index(op.causal_row)) {
    return Error(spec.where, absl::StrCat("the causal condition of softmax(", spec.axis,
                                          ") compares the axis with another dim of the output index; ", usage));
  }
  if (terms.size() == 2 && !absl::SimpleAtoi(absl::StripAsciiWhitespace(terms[1]), &op.causal_offset)) {
    return Error(spec.where, absl::StrCat("the offset in softmax(", spec.axis, ") is not an integer; ", usage));
  }
  if (op.causal_offset < 0 || op.causal_offset >= chain.dims[op.axis].extent) {
    return Error(spec.where, absl::StrCat("the offset in softmax(", spec.axis, ") must be in [0, ",
                                          chain.dims[op.axis].extent, "): a negative one leaves rows with no entry"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> ResolveDimList(const Chain& chain,
                                                const std::vector<std::string>& names,
                                                const Where& where, absl::string_view what) {
  std::vector<int> dims;
  for (const std::string& n : names) {
    ASSIGN_OR_RETURN(int d, ResolveDim(chain, n, where));
    if (std::find(dims.begin(), dims.end(), d) != dims.end()) {
      return Error(where, absl::StrCat("dim '", n, "' appears twice in the ", what));
    }
    dims.push_back(d);
  }
  return dims;
}

void CollectDims(const Expr& e, std::set<int>& dims) {
  ForEachAccess(e, [&](const Access& a) {
    for (const AffineExpr& idx : a.index) {
      for (const auto& [d, c] : idx.terms) dims.insert(d);
    }
  });
}

absl::Status BuildOp(const OpSpec& spec, const Limits& limits, Chain& chain) {
  RETURN_IF_ERROR(CheckName(spec.output, "tensor", spec.where));
  if (chain.FindTensor(spec.output) >= 0) {
    return Error(spec.where, absl::StrCat("tensor '", spec.output, "' is defined twice"));
  }
  if (chain.FindDim(spec.output) >= 0) {
    return Error(spec.where, absl::StrCat("'", spec.output, "' is both a dim and a tensor"));
  }
  if (spec.index.empty()) {
    return Error(spec.where, absl::StrCat("op output '", spec.output, "' has no index"));
  }
  if (static_cast<int>(spec.index.size()) > limits.max_rank) {
    return Error(spec.where, absl::StrCat("tensor '", spec.output, "' has ", spec.index.size(),
                                          " axes; the limit is ", limits.max_rank));
  }
  Op op;
  op.kind = spec.kind;
  ASSIGN_OR_RETURN(op.index, ResolveDimList(chain, spec.index, spec.where, "output index"));
  if (op.kind == OpKind::kSum) {
    if (spec.reduce.empty()) return Error(spec.where, "sum() needs at least one reduced dim");
    ASSIGN_OR_RETURN(op.reduce, ResolveDimList(chain, spec.reduce, spec.where, "reduce list"));
    for (int d : op.reduce) {
      if (std::find(op.index.begin(), op.index.end(), d) != op.index.end()) {
        return Error(spec.where, absl::StrCat("dim '", chain.dims[d].name,
                                              "' is both in the output index and reduced"));
      }
    }
  } else if (!spec.reduce.empty()) {
    return Error(spec.where, "only a sum op reduces dims");
  }
  if (op.kind == OpKind::kSoftmax) {
    RETURN_IF_ERROR(ResolveSoftmaxAxis(chain, spec, op));
  } else if (!spec.axis.empty()) {
    return Error(spec.where, "only a softmax op has an axis");
  }
  if (spec.expr.empty()) return Error(spec.expr_where, "empty expression");
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(spec.expr, spec.expr_where));
  ExprParser parser(std::move(tokens), spec.expr_where, chain, limits);
  ASSIGN_OR_RETURN(op.body, parser.ParseAll());

  std::set<int> used;
  CollectDims(op.body, used);
  for (int d : used) {
    bool in_index = std::find(op.index.begin(), op.index.end(), d) != op.index.end();
    bool reduced = std::find(op.reduce.begin(), op.reduce.end(), d) != op.reduce.end();
    if (!in_index && !reduced) {
      return Error(spec.expr_where,
                   absl::StrCat("dim '", chain.dims[d].name, "' is used in the expression but is ",
                                op.kind == OpKind::kSum ? "neither in the output index nor reduced"
                                                        : "not in the output index"));
    }
  }
  for (int d : op.reduce) {
    if (used.count(d) == 0) {
      return Error(spec.where, absl::StrCat("reduced dim '", chain.dims[d].name,
                                            "' does not appear in the expression"));
    }
  }

  Tensor t;
  t.name = spec.output;
  t.role = TensorRole::kIntermediate;
  t.producer = static_cast<int>(chain.ops.size());
  double points = 1;
  for (int d : op.index) {
    t.shape.push_back(chain.dims[d].extent);
    t.axis_dims.push_back(d);
    points *= static_cast<double>(chain.dims[d].extent);
  }
  if (t.NumElements() > limits.max_tensor_elements) {
    return Error(spec.where, absl::StrCat("tensor '", t.name, "' has ", t.NumElements(),
                                          " elements; the limit is ", limits.max_tensor_elements));
  }
  for (int d : op.reduce) points *= static_cast<double>(chain.dims[d].extent);
  if (points > limits.max_op_points) {
    return Error(spec.where, absl::StrCat("op '", t.name, "' iterates over ", points,
                                          " points; the limit is ", limits.max_op_points));
  }
  op.output = static_cast<int>(chain.tensors.size());
  chain.tensors.push_back(std::move(t));
  chain.ops.push_back(std::move(op));
  return absl::OkStatus();
}

// The spec's dims, each named once with an extent in range.
absl::Status AddDims(const ChainSpec& spec, const Limits& limits, Chain& chain) {
  for (const DimSpec& d : spec.dims) {
    RETURN_IF_ERROR(CheckName(d.name, "dim", d.where));
    if (chain.FindDim(d.name) >= 0) {
      return Error(d.where, absl::StrCat("dim '", d.name, "' is declared twice"));
    }
    if (d.extent < 1 || d.extent > limits.max_extent) {
      return Error(d.where, absl::StrCat("dim '", d.name, "' has extent ", d.extent,
                                         "; extents must be in [1, ", limits.max_extent, "]"));
    }
    if (d.min < 0 || d.min > d.extent) {
      return Error(d.where, absl::StrCat("dim '", d.name, "' ranges over ", d.min, "..", d.extent,
                                         "; a range runs from 1 up to its largest size"));
    }
    // A range of one size is that size.
    chain.dims.push_back({d.name, d.extent, d.min < d.extent ? d.min : 0});
  }
  return absl::OkStatus();
}

// Input `ts`: a new name, a shape of known dims or numeric extents.
absl::Status AddInput(const TensorSpec& ts, const Limits& limits, Chain& chain) {
  RETURN_IF_ERROR(CheckName(ts.name, "tensor", ts.where));
  if (chain.FindTensor(ts.name) >= 0) {
    return Error(ts.where, absl::StrCat("tensor '", ts.name, "' is declared twice"));
  }
  if (chain.FindDim(ts.name) >= 0) {
    return Error(ts.where, absl::StrCat("'", ts.name, "' is both a dim and a tensor"));
  }
  if (ts.shape.empty()) return Error(ts.where, absl::StrCat("tensor '", ts.name, "' has no shape"));
  if (static_cast<int>(ts.shape.size()) > limits.max_rank) {
    return Error(ts.where, absl::StrCat("tensor '", ts.name, "' has ", ts.shape.size(),
                                        " axes; the limit is ", limits.max_rank));
  }
  Tensor t;
  t.name = ts.name;
  t.role = TensorRole::kInput;
  t.constant = ts.constant;
  for (const std::string& s : ts.shape) {
    int d = chain.FindDim(s);
    if (d >= 0) {
      if (ts.constant && chain.dims[d].Ranged()) {
        return Error(ts.where, absl::StrCat("constant '", ts.name, "' is declared with ranged dim '", s,
                                            "': a constant is the same from call to call, its shape too"));
      }
      t.shape.push_back(chain.dims[d].extent);
      t.axis_dims.push_back(d);
      continue;
    }
    bool numeric = !s.empty() && s.size() <= 12 &&
                   std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!numeric) {
      return Error(ts.where, absl::StrCat("unknown dim '", s, "' in the shape of '", ts.name, "'"));
    }
    int64_t extent = std::stoll(s);
    if (extent < 1 || extent > limits.max_extent) {
      return Error(ts.where, absl::StrCat("axis extent ", s, " of '", ts.name,
                                          "' must be in [1, ", limits.max_extent, "]"));
    }
    t.shape.push_back(extent);
    t.axis_dims.push_back(-1);
  }
  if (t.NumElements() > limits.max_tensor_elements) {
    return Error(ts.where, absl::StrCat("tensor '", t.name, "' has ", t.NumElements(),
                                        " elements; the limit is ", limits.max_tensor_elements));
  }
  chain.inputs.push_back(static_cast<int>(chain.tensors.size()));
  chain.tensors.push_back(std::move(t));
  return absl::OkStatus();
}

// The outputs the spec names: computed, each once.
absl::Status MarkOutputs(const ChainSpec& spec, Chain& chain) {
  for (size_t i = 0; i < spec.outputs.size(); ++i) {
    const Where& w = i < spec.output_wheres.size() ? spec.output_wheres[i] : spec.where;
    int t = chain.FindTensor(spec.outputs[i]);
    if (t < 0) return Error(w, absl::StrCat("unknown output tensor '", spec.outputs[i], "'"));
    if (chain.tensors[t].role == TensorRole::kInput) {
      return Error(w, absl::StrCat("output '", spec.outputs[i], "' is an input, not computed"));
    }
    if (chain.tensors[t].role == TensorRole::kOutput) {
      return Error(w, absl::StrCat("output '", spec.outputs[i], "' is listed twice"));
    }
    chain.tensors[t].role = TensorRole::kOutput;
    chain.outputs.push_back(t);
  }
  return absl::OkStatus();
}

// Every op must feed an output (an unused op is almost always a typo), and
// every input must be read.
absl::Status CheckEverythingUsed(const ChainSpec& spec, const Chain& chain) {
  std::vector<bool> used(chain.tensors.size(), false);
  for (const Op& op : chain.ops) {
    ForEachAccess(op.body, [&](const Access& a) { used[a.tensor] = true; });
  }
  for (size_t i = 0; i < chain.ops.size(); ++i) {
    const Tensor& t = chain.tensors[chain.ops[i].output];
    if (t.role == TensorRole::kIntermediate && !used[chain.ops[i].output]) {
      return Error(spec.ops[i].where,
                   absl::StrCat("result '", t.name, "' is neither used nor an output"));
    }
  }
  for (int t : chain.inputs) {
    if (!used[t]) {
      return Error(spec.where, absl::StrCat("input '", chain.tensors[t].name, "' is never used"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Chain> BuildChain(const ChainSpec& spec, const Limits& limits) {
  Chain chain;
  chain.name = spec.name.empty() ? "chain" : spec.name;
  if (!IsIdentifier(chain.name) || chain.name.size() > kMaxNameBytes) {
    return Error(spec.where, absl::StrCat("chain name '", Echo(chain.name, 40), "' is not an identifier of at most ",
                                          kMaxNameBytes, " bytes"));
  }
  chain.dtype = spec.dtype.value_or(DType::kF32);

  if (static_cast<int>(spec.dims.size()) > limits.max_dims) {
    return Error(spec.where, absl::StrCat("workload has ", spec.dims.size(),
                                          " dims; the limit is ", limits.max_dims));
  }
  RETURN_IF_ERROR(AddDims(spec, limits, chain));

  size_t tensor_count = spec.inputs.size() + spec.ops.size();
  if (static_cast<int>(tensor_count) > limits.max_tensors) {
    return Error(spec.where, absl::StrCat("workload has ", tensor_count,
                                          " tensors; the limit is ", limits.max_tensors));
  }
  if (static_cast<int>(spec.ops.size()) > limits.max_ops) {
    return Error(spec.where, absl::StrCat("workload has ", spec.ops.size(),
                                          " ops; the limit is ", limits.max_ops));
  }

  for (const TensorSpec& ts : spec.inputs) RETURN_IF_ERROR(AddInput(ts, limits, chain));
  if (chain.inputs.empty()) return Error(spec.where, "workload declares no input tensors");
  if (spec.ops.empty()) return Error(spec.where, "workload has no ops");

  for (const OpSpec& op : spec.ops) RETURN_IF_ERROR(BuildOp(op, limits, chain));

  if (spec.outputs.empty()) return Error(spec.where, "workload names no output (add 'out NAME')");
  RETURN_IF_ERROR(MarkOutputs(spec, chain));
  RETURN_IF_ERROR(CheckEverythingUsed(spec, chain));
  return chain;
}

}  // namespace fusor::ir
