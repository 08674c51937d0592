// `fusor sweep`: every fusible chain of the models in a zoo manifest, each
// distinct chain tuned once, and the report.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "client/cli_common.h"
#include "client/client.h"
#include "client/manifest.h"

namespace fusor::cli {

struct SweepCommand {
  CLI::App* cmd = nullptr;
  std::string manifest_path;
  std::string out_dir;
  int budget = 0;
  bool detach = false;
  // The manifest and its models, set by PrepareSweep.
  std::pair<client::Manifest, std::vector<client::SweepModel>> plan;
};
void AddSweep(CLI::App& app, SweepCommand& c);
// Reads the manifest and extracts its models before any scheduler starts,
// so that a bad manifest costs nothing. The exit status when the sweep
// cannot go on, else nullopt.
std::optional<int> PrepareSweep(const GlobalOptions& g, SweepCommand& c);
int RunSweep(client::Client& client, const GlobalOptions& g, const SweepCommand& c);

}  // namespace fusor::cli
