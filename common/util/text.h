// Text from outside (names, inputs) made safe to echo: in errors, logs,
// terminals and files.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace fusor {

// `input` as an error or log line may show it: control characters (C0, DEL,
// C1) and the Unicode bidirectional controls (U+202A..U+202E,
// U+2066..U+2069) written as escapes (\n, \x1b, \u009b, \u202e), invalid
// UTF-8 as \xNN, and cut after `max_bytes` of output with the input's
// length said (std::string::npos: never cut).
std::string Echo(absl::string_view input, size_t max_bytes = 200);

// Names of workers, models, sweeps and tokens: 1 to kMaxNameBytes of
// A-Z a-z 0-9 . _ - + : (no path separators, spaces or controls), not "."
// or "..". INVALID_ARGUMENT naming `what` otherwise.
inline constexpr size_t kMaxNameBytes = 128;
absl::Status CheckName(absl::string_view name, absl::string_view what);
// Labels (a sweep entry's model, "bert-base (batch=8, seq=128)"): at most
// `max_bytes` of printable UTF-8, which Echo leaves as it is.
absl::Status CheckLabel(absl::string_view label, absl::string_view what, size_t max_bytes = 256);
// `name` with every character CheckName refuses replaced by '_' and cut to
// kMaxNameBytes ("_" when nothing is left): a name made from a file's stem.
std::string SafeName(absl::string_view name);

}  // namespace fusor
