#include "client/cli_sweep.h"

#include <unistd.h>

#include <chrono>
#include <iostream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/report.h"
#include "client/sweep_report.h"
#include "common/util/log.h"
#include "common/util/text.h"

namespace fusor::cli {
namespace {

using fusor::client::Client;

// The manifest's models, extracted before any scheduler starts so that a
// bad manifest costs nothing.
absl::StatusOr<std::pair<fusor::client::Manifest, std::vector<fusor::client::SweepModel>>> PlanSweep(
    const std::string& path, int budget) {
  auto manifest = fusor::client::LoadManifest(path);
  if (!manifest.ok()) return manifest.status();
  if (budget > 0) manifest->budget = budget;
  std::set<std::string> keys;
  int chains = 0;
  auto models = fusor::client::ExtractManifest(*manifest, [&](const fusor::client::SweepModel& m) {
    for (const auto& c : m.extraction.chains) keys.insert(c.key);
    chains += static_cast<int>(m.extraction.chains.size());
    std::cerr << absl::StrCat("  ", fusor::Echo(m.name), ": ", m.extraction.chains.size(), " chains",
                              m.extraction.rejected.empty()
                                  ? ""
                                  : absl::StrCat(" (", m.extraction.rejected.size(), " candidates not fused)"),
                              "\n");
  });
  if (!models.ok()) return models.status();
  std::cerr << absl::StrCat("sweep ", manifest->name, ": ", models->size(), " models, ", chains, " chains, ",
                            keys.size(), " distinct\n");
  if (chains == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": no model has a fusible chain"));
  return std::make_pair(std::move(*manifest), std::move(*models));
}

// The summary of a finished sweep: its chains by state, the totals per
// model and the files written; 1 when a chain failed.
int PrintSweepSummary(const fusor::v1::SweepReport& report, const std::vector<std::string>& written) {
  int failed = 0, cache = 0, tuned = 0;
  for (const auto& r : report.results()) {
    failed += r.state() == "failed";
    cache += r.state() == "cache";
    tuned += r.state() == "tuned";
  }
  std::cout << absl::StrFormat("sweep %s %s: %d chains (%d from the cache, %d tuned, %d failed)\n",
                               report.sweep_id(), report.state(), report.results_size(), cache, tuned, failed);
  std::cout << absl::StrFormat("%-44s %6s %12s %12s %8s\n", "model", "chains", "unfused", "fused", "speedup");
  for (const auto& t : fusor::client::TotalsPerModel(report)) {
    std::cout << absl::StrFormat("%-44s %6d %12s %12s %8s\n", t.model, t.chains,
                                 fusor::client::FormatSeconds(t.baseline_s), fusor::client::FormatSeconds(t.fused_s),
                                 t.speedup() > 0 ? absl::StrFormat("%.2fx", t.speedup()) : "-");
  }
  for (size_t i = 0; i < written.size(); ++i) std::cout << (i == 0 ? "wrote " : "      ") << written[i] << "\n";
  return failed > 0 ? 1 : 0;
}

}  // namespace

void AddSweep(CLI::App& app, SweepCommand& c) {
  c.cmd = app.add_subcommand(
      "sweep", "tune every fusible chain of the models in a zoo manifest (YAML or JSON), each distinct chain once, "
               "and write the report; resumes an interrupted sweep");
  c.cmd->add_option("manifest", c.manifest_path, "zoo manifest, e.g. examples/zoo.yaml")
      ->required()
      ->check(CLI::ExistingFile);
  c.cmd->add_option("-o,--out", c.out_dir, "report directory (default: fusor-sweep-<name>)");
  c.cmd->add_option("--budget", c.budget,
                    "candidates to measure per chain (default: the manifest's, else the scheduler's)");
  c.cmd->add_flag("--detach", c.detach, "with --server: start the sweep and return; it runs in the scheduler");
}

std::optional<int> PrepareSweep(const GlobalOptions& g, SweepCommand& c) {
  if (c.detach && g.server.empty()) {
    std::cerr << "fusor: --detach needs --server: an embedded scheduler stops with this process\n";
    return 2;
  }
  fusor::SetLogLevel("warn");
  auto planned = PlanSweep(c.manifest_path, c.budget);
  if (!planned.ok()) return Fail(planned.status());
  c.plan = std::move(*planned);
  return std::nullopt;
}

int RunSweep(Client& client, const GlobalOptions& g, const SweepCommand& c) {
  const fusor::client::Manifest& manifest = c.plan.first;
  const std::vector<fusor::client::SweepModel>& models = c.plan.second;
  // A sweep is followed until it ends unless --timeout says otherwise.
  const absl::Duration deadline = g.timeout_given ? absl::Seconds(g.timeout_s) : absl::Hours(24 * 365);
  fusor::v1::SweepRequest req = fusor::client::MakeSweepRequest(manifest, models);
  *req.mutable_target() = Selector(g);
  req.set_detach(c.detach);
  const bool tty = isatty(STDERR_FILENO);
  int last_done = -1;
  auto last_line = std::chrono::steady_clock::now();
  auto report = client.Sweep(
      req,
      [&](const fusor::v1::SweepEvent& e) {
        if (e.has_started()) {
          const auto& s = e.started();
          std::cerr << absl::StrCat("sweep ", s.sweep_id(), s.resumed() ? " resumed" : " started", ": ", s.chains(),
                                    " distinct chains, budget ", s.budget(), " each, target ",
                                    s.target_fingerprint(),
                                    c.detach ? "" : "\n  (interrupting is safe: the same command resumes it)", "\n");
        } else if (e.has_progress()) {
          const std::string line = "  " + fusor::client::FormatSweepProgress(e.progress());
          const auto now = std::chrono::steady_clock::now();
          if (tty) {
            std::cerr << "\r\033[K" << line << std::flush;
          } else if (e.progress().done() != last_done || now - last_line > std::chrono::seconds(30)) {
            std::cerr << line << "\n";
            last_line = now;
          }
          last_done = e.progress().done();
        } else if (e.has_report() && tty) {
          std::cerr << "\n";
        }
      },
      deadline);
  if (!report.ok()) {
    if (tty) std::cerr << "\n";
    if (!g.server.empty() && absl::IsDeadlineExceeded(report.status())) {
      std::cerr << "fusor: stopped following the sweep (--timeout); it goes on in the scheduler, and the same "
                   "command follows it again\n";
    }
    return Fail(report.status());
  }
  if (c.detach) {
    std::cout << "sweep " << report->sweep_id() << " runs in the scheduler; the same command without --detach "
              << "follows it and writes the report\n";
    return 0;
  }
  // -o, else fusor-sweep-<name> under the working directory.
  const std::string out_dir = c.out_dir.empty() ? "fusor-sweep-" + fusor::SafeName(manifest.name) : c.out_dir;
  auto written = fusor::client::WriteSweepReport(*report, models, out_dir);
  if (!written.ok()) return Fail(written.status());
  return PrintSweepSummary(*report, *written);
}

}  // namespace fusor::cli
