#include "common/util/text.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fusor {
namespace {

bool NameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-' || c == '+' || c == ':';
}

// The length of the UTF-8 sequence at `s[i]` (0: not valid UTF-8 there, as
// RFC 3629 has it: no overlong forms, no surrogates, nothing past U+10FFFF).
size_t Utf8Length(absl::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  const size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  const unsigned char b = static_cast<unsigned char>(s[i + 1]);
  const unsigned char lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
  const unsigned char hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
  if (b < lo || b > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return 0;
  }
  return n;
}

}  // namespace

std::string Echo(absl::string_view input, size_t max_bytes) {
  std::string out;
  size_t i = 0;
  for (; i < input.size() && out.size() < max_bytes;) {
    const unsigned char c = static_cast<unsigned char>(input[i]);
    const size_t n = Utf8Length(input, i);
    if (n == 0) {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", c));
      ++i;
      continue;
    }
    if (n == 1) {
      if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c < 0x20 || c == 0x7f) {
        absl::StrAppend(&out, absl::StrFormat("\\x%02x", c));
      } else {
        out += static_cast<char>(c);
      }
    } else if (n == 2 && c == 0xc2 && static_cast<unsigned char>(input[i + 1]) < 0xa0) {
      // C1 controls (U+0080..U+009F; U+009B starts a terminal escape on some).
      absl::StrAppend(&out, absl::StrFormat("\\u%04x", static_cast<unsigned char>(input[i + 1])));
    } else if (n == 3 && c == 0xe2) {
      // U+202A..U+202E are E2 80 AA..AE; U+2066..U+2069 are E2 81 A6..A9.
      const unsigned char b1 = static_cast<unsigned char>(input[i + 1]), b2 = static_cast<unsigned char>(input[i + 2]);
      if ((b1 == 0x80 && b2 >= 0xaa && b2 <= 0xae) || (b1 == 0x81 && b2 >= 0xa6 && b2 <= 0xa9)) {
        absl::StrAppend(&out, absl::StrFormat("\\u%04x", ((b1 & 0x3f) << 6 | (b2 & 0x3f)) + 0x2000));
      } else {
        out.append(input.data() + i, n);
      }
    } else {
      out.append(input.data() + i, n);
    }
    i += n;
  }
  if (i < input.size()) absl::StrAppend(&out, "... (", input.size(), " bytes)");
  return out;
}

absl::Status CheckName(absl::string_view name, absl::string_view what) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " name is empty"));
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " name '", Echo(name, 40), "' is longer than ", kMaxNameBytes,
                                                   " bytes"));
  }
  for (char c : name) {
    if (!NameChar(c)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " name '", Echo(name), "' has '", Echo(absl::string_view(&c, 1)),
                                                     "': names are letters, digits and . _ - + :"));
    }
  }
  if (name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat(what, " name '", name, "' is not a name"));
  }
  return absl::OkStatus();
}

absl::Status CheckLabel(absl::string_view label, absl::string_view what, size_t max_bytes) {
  if (label.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", Echo(label, 40), "' is longer than ", max_bytes, " bytes"));
  }
  if (Echo(label, max_bytes) != label) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", Echo(label), "' holds control characters or invalid UTF-8"));
  }
  return absl::OkStatus();
}

std::string SafeName(absl::string_view name) {
  std::string out;
  for (char c : name.substr(0, kMaxNameBytes)) out += NameChar(c) ? c : '_';
  if (out.empty() || out == "." || out == "..") out = "_";
  return out;
}

}  // namespace fusor
