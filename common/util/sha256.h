// SHA-256 of a byte string, for cache keys and fingerprints.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

namespace fusor {

// Lower-case hex digest of `data` (64 characters).
std::string Sha256Hex(absl::string_view data);

}  // namespace fusor
