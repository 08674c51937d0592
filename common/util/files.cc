#include "common/util/files.h"

#include <fstream>
#include <sstream>

namespace fusor {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  if (!out) return absl::InternalError("cannot write " + path);
  return absl::OkStatus();
}

}  // namespace fusor
