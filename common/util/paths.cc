#include "common/util/paths.h"

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace fusor {

std::string DefaultDatabasePath(const std::string& xdg_data_home, const std::string& home) {
  if (!xdg_data_home.empty()) return xdg_data_home + "/fusor/tuning.db";
  if (!home.empty()) return home + "/.local/share/fusor/tuning.db";
  return "fusor-tuning.db";
}

absl::Status EnsureParentDirectory(const std::string& file_path) {
  if (file_path == ":memory:") return absl::OkStatus();
  std::filesystem::path parent = std::filesystem::path(file_path).parent_path();
  if (parent.empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", parent.string(), ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace fusor
