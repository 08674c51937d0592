#include "common/ir/lexer.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "common/util/text.h"

namespace fusor::ir {

bool IsIdentifier(absl::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

absl::StatusOr<std::vector<Token>> Lex(absl::string_view text, const Where& where) {
  std::vector<Token> tokens;
  size_t i = 0;
  while (i < text.size()) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (std::isspace(c)) {
      ++i;
      continue;
    }
    Token tok;
    tok.offset = static_cast<int>(i);
    if (std::isalpha(c) || c == '_') {
      size_t j = i;
      while (j < text.size() &&
             (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '_')) {
        ++j;
      }
      tok.kind = Token::Kind::kIdent;
      tok.text = std::string(text.substr(i, j - i));
      i = j;
    } else if (c == '.' && i + 1 < text.size() && text[i + 1] == '.') {
      tok.kind = Token::Kind::kPunct;  // a range: 65..256
      tok.text = "..";
      i += 2;
    } else if (std::isdigit(c) || (c == '.' && i + 1 < text.size() &&
                                   std::isdigit(static_cast<unsigned char>(text[i + 1])))) {
      size_t j = i;
      while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
      if (j < text.size() && text[j] == '.' && !(j + 1 < text.size() && text[j + 1] == '.')) {
        ++j;
        while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
      }
      if (j < text.size() && (text[j] == 'e' || text[j] == 'E')) {
        size_t k = j + 1;
        if (k < text.size() && (text[k] == '+' || text[k] == '-')) ++k;
        if (k < text.size() && std::isdigit(static_cast<unsigned char>(text[k]))) {
          while (k < text.size() && std::isdigit(static_cast<unsigned char>(text[k]))) ++k;
          j = k;
        }
      }
      if (j < text.size() &&
          (std::isalpha(static_cast<unsigned char>(text[j])) || text[j] == '_')) {
        return absl::InvalidArgumentError(
            absl::StrCat(where.At(static_cast<int>(i)).ToString(), ": malformed number '",
                         Echo(text.substr(i, j + 1 - i), 40), "'"));
      }
      tok.kind = Token::Kind::kNumber;
      tok.text = std::string(text.substr(i, j - i));
      i = j;
    } else if (absl::string_view("[]()=,+-*/<").find(static_cast<char>(c)) !=
               absl::string_view::npos) {
      tok.kind = Token::Kind::kPunct;
      tok.text = std::string(1, static_cast<char>(c));
      ++i;
    } else {
      std::string shown = std::isprint(c) ? std::string(1, static_cast<char>(c))
                                          : absl::StrCat("\\x", absl::Hex(c));
      return absl::InvalidArgumentError(absl::StrCat(where.At(static_cast<int>(i)).ToString(),
                                                     ": unexpected character '", shown, "'"));
    }
    // Errors quote tokens: a name or number is bounded, so none echoes a long input.
    if (tok.text.size() > kMaxNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(where.At(tok.offset).ToString(), ": '", Echo(tok.text, 40),
                                                     "' is longer than ", kMaxNameBytes, " bytes"));
    }
    tokens.push_back(std::move(tok));
  }
  Token end;
  end.kind = Token::Kind::kEnd;
  end.offset = static_cast<int>(text.size());
  tokens.push_back(end);
  return tokens;
}

}  // namespace fusor::ir
