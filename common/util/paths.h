// Default locations, computed from values main() reads from the
// environment (libraries never read it themselves).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace fusor {

// $XDG_DATA_HOME/fusor/tuning.db, else $HOME/.local/share/fusor/tuning.db,
// else ./fusor-tuning.db. Pass the variables' values ("" when unset).
std::string DefaultDatabasePath(const std::string& xdg_data_home, const std::string& home);

// Creates the directory that will hold `file_path`, if missing.
absl::Status EnsureParentDirectory(const std::string& file_path);

}  // namespace fusor
