// The chain text front end.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/ir/lexer.h"
#include "common/ir/parse.h"
#include "common/util/status_macros.h"

namespace fusor::ir {
namespace {

absl::Status Error(const Where& where, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(where.ToString(), ": ", message));
}

class LineParser {
 public:
  LineParser(absl::string_view line, std::vector<Token> tokens, int line_no)
      : line_(line), tokens_(std::move(tokens)), line_no_(line_no) {}

  const Token& Peek() const { return tokens_[pos_]; }
  const Token& Next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool AtEnd() const { return Peek().kind == Token::Kind::kEnd; }
  Where WhereOf(const Token& tok) const { return Where{"", line_no_, tok.offset + 1}; }
  // The rest of the line from the current token on.
  absl::string_view Rest() const { return line_.substr(Peek().offset); }

  absl::StatusOr<std::string> Ident(absl::string_view what) {
    const Token& tok = Peek();
    if (tok.kind != Token::Kind::kIdent) return Unexpected(what);
    Next();
    return tok.text;
  }

  // A non-negative integer literal.
  absl::StatusOr<int64_t> Integer(absl::string_view what) {
    const Token& num = Peek();
    if (num.kind != Token::Kind::kNumber || num.text.find_first_not_of("0123456789") != std::string::npos) {
      return Unexpected(what);
    }
    if (num.text.size() > 12) return Error(WhereOf(num), "extent is too large");
    Next();
    return std::stoll(num.text);
  }

  absl::Status Expect(char c) {
    if (!Peek().Is(c)) return Unexpected(absl::StrCat("'", std::string(1, c), "'"));
    Next();
    return absl::OkStatus();
  }

  absl::Status Unexpected(absl::string_view expected) const {
    const Token& tok = Peek();
    std::string got = tok.kind == Token::Kind::kEnd ? "end of line" : "'" + tok.text + "'";
    return Error(WhereOf(tok), absl::StrCat("expected ", expected, " but found ", got));
  }

  // A softmax's axis and ')' after "softmax(": NAME, or a causal condition
  // NAME <= NAME [+ NUMBER], returned as written for BuildChain to check.
  absl::StatusOr<std::string> SoftmaxAxis() {
    ASSIGN_OR_RETURN(std::string axis, Ident("the softmax axis"));
    if (Peek().Is(',')) return Error(WhereOf(Peek()), "softmax takes exactly one axis");
    if (Peek().Is('<')) {
      Next();
      RETURN_IF_ERROR(Expect('='));
      ASSIGN_OR_RETURN(std::string row, Ident("a dim name after '<='"));
      absl::StrAppend(&axis, " <= ", row);
      if (Peek().Is('+')) {
        Next();
        if (Peek().kind != Token::Kind::kNumber) return Unexpected("an integer offset after '+'");
        absl::StrAppend(&axis, " + ", Next().text);
      }
    }
    RETURN_IF_ERROR(Expect(')'));
    return axis;
  }

  // NAME[, NAME]* ']' after an opening bracket/paren has been consumed.
  absl::StatusOr<std::vector<std::string>> NameList(char close, bool allow_numbers) {
    std::vector<std::string> names;
    while (true) {
      const Token& tok = Peek();
      if (tok.kind == Token::Kind::kIdent ||
          (allow_numbers && tok.kind == Token::Kind::kNumber)) {
        names.push_back(tok.text);
        Next();
      } else {
        return Unexpected(allow_numbers ? "a dim name or extent" : "a dim name");
      }
      if (Peek().Is(',')) {
        Next();
        continue;
      }
      RETURN_IF_ERROR(Expect(close));
      return names;
    }
  }

 private:
  absl::string_view line_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int line_no_;
};

absl::Status ParseOpLine(LineParser& p, ChainSpec& spec) {
  OpSpec op;
  op.where = p.WhereOf(p.Peek());
  ASSIGN_OR_RETURN(op.output, p.Ident("a statement (chain, dtype, dim, in, out) or an op"));
  if (!p.Peek().Is('[')) {
    return p.Unexpected(absl::StrCat("'[' after '", op.output,
                                     "' (an op looks like NAME[dims] = expression)"));
  }
  p.Next();
  ASSIGN_OR_RETURN(op.index, p.NameList(']', false));
  RETURN_IF_ERROR(p.Expect('='));
  const Token& head = p.Peek();
  if (head.kind == Token::Kind::kIdent && (head.text == "sum" || head.text == "softmax")) {
    bool is_sum = head.text == "sum";
    p.Next();
    RETURN_IF_ERROR(p.Expect('('));
    if (is_sum) {
      op.kind = OpKind::kSum;
      ASSIGN_OR_RETURN(op.reduce, p.NameList(')', false));
    } else {
      op.kind = OpKind::kSoftmax;
      ASSIGN_OR_RETURN(op.axis, p.SoftmaxAxis());
    }
  } else {
    op.kind = OpKind::kMap;
  }
  if (p.AtEnd()) return p.Unexpected("an expression");
  op.expr_where = p.WhereOf(p.Peek());
  op.expr = std::string(p.Rest());
  while (!op.expr.empty() && (op.expr.back() == ' ' || op.expr.back() == '\t' ||
                              op.expr.back() == '\r')) {
    op.expr.pop_back();
  }
  spec.ops.push_back(std::move(op));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ChainSpec> ParseChainTextSpec(absl::string_view text, const Limits& limits) {
  if (text.size() > limits.max_spec_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("workload text is ", text.size(),
                                                   " bytes; the limit is ", limits.max_spec_bytes));
  }
  ChainSpec spec;
  spec.where = Where{"", 1, 0};
  bool saw_name = false, saw_dtype = false;
  int line_no = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    absl::string_view line = raw.substr(0, raw.find('#'));
    Where line_where{"", line_no, 1};
    ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(line, line_where));
    LineParser p(line, std::move(tokens), line_no);
    if (p.AtEnd()) continue;
    const Token& first = p.Peek();
    Where at = p.WhereOf(first);
    if (first.kind == Token::Kind::kIdent && first.text == "chain") {
      p.Next();
      if (saw_name) return Error(at, "the chain is named twice");
      saw_name = true;
      ASSIGN_OR_RETURN(spec.name, p.Ident("a chain name"));
    } else if (first.kind == Token::Kind::kIdent && first.text == "dtype") {
      p.Next();
      if (saw_dtype) return Error(at, "dtype is given twice");
      saw_dtype = true;
      Where w = p.WhereOf(p.Peek());
      ASSIGN_OR_RETURN(std::string name, p.Ident("f32, f16 or bf16"));
      auto dtype = ParseDType(name);
      if (!dtype.ok()) return Error(w, dtype.status().message());
      spec.dtype = *dtype;
    } else if (first.kind == Token::Kind::kIdent && first.text == "dim") {
      p.Next();
      if (p.AtEnd()) return p.Unexpected("NAME=EXTENT");
      while (!p.AtEnd()) {
        DimSpec d;
        d.where = p.WhereOf(p.Peek());
        ASSIGN_OR_RETURN(d.name, p.Ident("a dim name"));
        RETURN_IF_ERROR(p.Expect('='));
        ASSIGN_OR_RETURN(d.extent, p.Integer("an integer extent (or a range: MIN..MAX)"));
        if (p.Peek().kind == Token::Kind::kPunct && p.Peek().text == "..") {  // a ranged dim: MIN..MAX
          if (d.extent < 1) return Error(d.where, absl::StrCat("dim '", d.name, "': a range starts at 1 or more"));
          p.Next();
          d.min = d.extent;
          ASSIGN_OR_RETURN(d.extent, p.Integer("the range's largest size after '..'"));
        }
        spec.dims.push_back(std::move(d));
      }
    } else if (first.kind == Token::Kind::kIdent && first.text == "in") {
      p.Next();
      if (p.AtEnd()) return p.Unexpected("NAME[dims]");
      while (!p.AtEnd()) {
        TensorSpec t;
        t.where = p.WhereOf(p.Peek());
        ASSIGN_OR_RETURN(t.name, p.Ident("a tensor name"));
        RETURN_IF_ERROR(p.Expect('['));
        ASSIGN_OR_RETURN(t.shape, p.NameList(']', true));
        spec.inputs.push_back(std::move(t));
      }
    } else if (first.kind == Token::Kind::kIdent && first.text == "const") {
      p.Next();
      if (p.AtEnd()) return p.Unexpected("an input tensor name");
      while (!p.AtEnd()) {
        const Where where = p.WhereOf(p.Peek());
        ASSIGN_OR_RETURN(std::string name, p.Ident("an input tensor name"));
        auto it = std::find_if(spec.inputs.begin(), spec.inputs.end(),
                               [&](const TensorSpec& t) { return t.name == name; });
        if (it == spec.inputs.end()) {
          return Error(where, absl::StrCat("'", name, "' is not an input declared before this line: only inputs "
                                           "can be constant"));
        }
        it->constant = true;
      }
    } else if (first.kind == Token::Kind::kIdent && first.text == "out") {
      p.Next();
      if (p.AtEnd()) return p.Unexpected("an output tensor name");
      while (!p.AtEnd()) {
        spec.output_wheres.push_back(p.WhereOf(p.Peek()));
        ASSIGN_OR_RETURN(std::string name, p.Ident("an output tensor name"));
        spec.outputs.push_back(std::move(name));
      }
    } else {
      RETURN_IF_ERROR(ParseOpLine(p, spec));
    }
  }
  return spec;
}

absl::StatusOr<Chain> ParseChainText(absl::string_view text, const Limits& limits) {
  ASSIGN_OR_RETURN(ChainSpec spec, ParseChainTextSpec(text, limits));
  return BuildChain(spec, limits);
}

absl::StatusOr<Chain> ParseChain(absl::string_view source, const Limits& limits) {
  size_t first = source.find_first_not_of(" \t\r\n");
  if (first != absl::string_view::npos && source[first] == '{') {
    return ParseChainJson(source, limits);
  }
  return ParseChainText(source, limits);
}

}  // namespace fusor::ir
