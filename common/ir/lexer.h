// Tokens of the chain text format and of expression strings (internal to ir/).
#pragma once

#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "common/ir/spec.h"

namespace fusor::ir {

struct Token {
  enum class Kind { kIdent, kNumber, kPunct, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;
  int offset = 0;  // 0-based offset within the lexed string

  bool Is(char c) const { return kind == Kind::kPunct && text.size() == 1 && text[0] == c; }
};

// Splits `text` into tokens, ending with a kEnd token at text.size().
// Identifiers are [A-Za-z_][A-Za-z0-9_]*; numbers are decimal with an
// optional fraction and exponent; punctuation is one of []()=,+-*/< ("<=" is two tokens).
absl::StatusOr<std::vector<Token>> Lex(absl::string_view text, const Where& where);

bool IsIdentifier(absl::string_view s);

}  // namespace fusor::ir
