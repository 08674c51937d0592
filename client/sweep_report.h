// What `fusor sweep` shows and writes: the progress line, and the report
// per model and per chain as Markdown, CSV, JSON and an SVG chart of
// speedups.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/manifest.h"
#include "fusor/v1/scheduler.pb.h"

namespace fusor::client {

// One line: a bar of chains done, cache hits, tuned, failed, the chains
// being tuned with their candidates measured, and the ETA.
std::string FormatSweepProgress(const v1::SweepProgress& progress);

// A model's fusible chains over one forward pass: the sum over its chains
// of instances x time, unfused and fused, where both were measured.
struct ModelTotals {
  std::string model;
  int chains = 0;
  int measured = 0;  // chains with both times
  double baseline_s = 0;
  double fused_s = 0;
  double speedup() const { return fused_s > 0 ? baseline_s / fused_s : 0; }
};
std::vector<ModelTotals> TotalsPerModel(const v1::SweepReport& report);

// The report's files in `dir` (created): report.md, report.csv,
// report.json and speedups.svg; returns their paths. `models` adds what
// the extraction found but could not fuse.
absl::StatusOr<std::vector<std::string>> WriteSweepReport(const v1::SweepReport& report,
                                                          const std::vector<SweepModel>& models,
                                                          const std::string& dir);

std::string SweepReportMarkdown(const v1::SweepReport& report, const std::vector<SweepModel>& models);
std::string SweepReportCsv(const v1::SweepReport& report);
std::string SweepReportJson(const v1::SweepReport& report, const std::vector<SweepModel>& models);
std::string SweepReportSvg(const v1::SweepReport& report);

}  // namespace fusor::client
