// Whole-file reads and writes with errors as Status.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusor {

// NOT_FOUND when `path` cannot be read.
absl::StatusOr<std::string> ReadFile(const std::string& path);
// INTERNAL when `path` cannot be written.
absl::Status WriteFile(const std::string& path, const std::string& bytes);

}  // namespace fusor
