#include "client/sweep_report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "client/report.h"
#include "common/util/files.h"
#include "common/util/status_macros.h"
#include "common/util/text.h"

namespace fusor::client {
namespace {

std::string Duration(double s) {
  if (s < 0) return "?";
  const int64_t t = static_cast<int64_t>(std::llround(s));
  if (t < 60) return absl::StrCat(t, "s");
  if (t < 3600) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%dh%02dm", t / 3600, (t % 3600) / 60);
}

std::string Ms(double s) { return s > 0 ? absl::StrFormat("%.4g", s * 1e3) : ""; }

std::string Speedup(double x) { return x > 0 ? absl::StrFormat("%.2fx", x) : "-"; }

std::string Date(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

// The report's results grouped by model, in the report's order.
std::vector<std::pair<std::string, std::vector<const v1::SweepChainResult*>>> ByModel(const v1::SweepReport& r) {
  std::vector<std::pair<std::string, std::vector<const v1::SweepChainResult*>>> out;
  std::map<std::string, size_t> index;
  for (const v1::SweepChainResult& c : r.results()) {
    auto [it, added] = index.emplace(c.model(), out.size());
    if (added) out.push_back({c.model(), {}});
    out[it->second].second.push_back(&c);
  }
  return out;
}

std::string TargetLine(const v1::Target& t) {
  return absl::StrCat(t.device_name().empty() ? t.arch() : t.device_name(), " (", t.arch(), ", target ",
                      t.fingerprint(), ")");
}

// Every name in a report is text from outside (a model's, a chain's, an
// error): each format escapes it for itself, after Echo has written its
// control characters, bidirectional controls and invalid UTF-8 as escapes.
std::string CsvField(const std::string& s) {
  std::string text = Echo(s, std::string::npos);
  // A spreadsheet would run a field that starts like a formula.
  if (!text.empty() && absl::StrContains("=+-@", text[0])) text = "'" + text;
  if (text.find_first_of(",\"'") == std::string::npos) return text;
  return absl::StrCat("\"", absl::StrReplaceAll(text, {{"\"", "\"\""}}), "\"");
}

std::string Xml(const std::string& s) {
  return absl::StrReplaceAll(Echo(s, std::string::npos),
                             {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}, {"'", "&apos;"}});
}

std::string MdCell(const std::string& s) {
  return absl::StrReplaceAll(Echo(s, std::string::npos), {{"|", "\\|"}, {"<", "&lt;"}, {">", "&gt;"}, {"`", "\\`"}});
}

struct Counts {
  int chains = 0, cache = 0, tuned = 0, failed = 0, other = 0;
  double tuning_s = 0;  // spent by this sweep
};

Counts CountDistinct(const v1::SweepReport& r) {
  Counts c;
  std::map<std::string, const v1::SweepChainResult*> distinct;
  for (const v1::SweepChainResult& x : r.results()) distinct.emplace(x.workload_key(), &x);
  for (const auto& [key, x] : distinct) {
    ++c.chains;
    if (x->state() == "cache") ++c.cache;
    else if (x->state() == "tuned") ++c.tuned, c.tuning_s += x->tuning_s();
    else if (x->state() == "failed") ++c.failed;
    else ++c.other;
  }
  return c;
}

}  // namespace

std::string FormatSweepProgress(const v1::SweepProgress& p) {
  constexpr int kWidth = 20;
  const int chains = std::max(1, p.chains());
  const int filled = std::min(kWidth, p.done() * kWidth / chains);
  std::string out = absl::StrFormat("[%s%s] %d/%d chains: %d from the cache, %d tuned", std::string(filled, '#'),
                                    std::string(kWidth - filled, '.'), p.done(), p.chains(), p.cache_hits(),
                                    p.tuned());
  if (p.failed() > 0) absl::StrAppendFormat(&out, ", %d failed", p.failed());
  std::vector<std::string> tuning;
  for (const v1::SweepChainProgress& t : p.tuning()) {
    tuning.push_back(absl::StrFormat("%s %d/%d", t.chain().empty() ? t.workload_key().substr(0, 8) : t.chain(),
                                     t.measured(), t.budget()));
  }
  if (!tuning.empty()) absl::StrAppend(&out, "; tuning ", absl::StrJoin(tuning, ", "));
  absl::StrAppend(&out, "; ", Duration(p.elapsed_s()), " elapsed");
  if (p.done() < p.chains()) absl::StrAppend(&out, ", ETA ", p.eta_s() < 0 ? "unknown yet" : Duration(p.eta_s()));
  return out;
}

std::vector<ModelTotals> TotalsPerModel(const v1::SweepReport& report) {
  std::vector<ModelTotals> out;
  for (const auto& [model, chains] : ByModel(report)) {
    ModelTotals t;
    t.model = model;
    for (const v1::SweepChainResult* c : chains) {
      ++t.chains;
      if (c->best_s() <= 0 || c->baseline_s() <= 0) continue;
      ++t.measured;
      t.baseline_s += c->instances() * c->baseline_s();
      t.fused_s += c->instances() * c->best_s();
    }
    out.push_back(t);
  }
  return out;
}

std::string SweepReportMarkdown(const v1::SweepReport& r, const std::vector<SweepModel>& models) {
  const Counts n = CountDistinct(r);
  std::string out = absl::StrCat("# Sweep ", MdCell(r.name()), "\n\n");
  absl::StrAppend(&out, "- sweep ", r.sweep_id(), " (", r.state(), "), started ", Date(r.created_unix_ms()),
                  ", finished ", Date(r.finished_unix_ms()), "\n");
  absl::StrAppend(&out, "- target ", MdCell(TargetLine(r.target())), "; budget ", r.budget(), " candidates per chain\n");
  absl::StrAppend(&out, "- ", r.results_size(), " chains in ", ByModel(r).size(), " models, ", n.chains,
                  " distinct: ", n.cache, " from the cache, ", n.tuned, " tuned (",
                  absl::StrFormat("%.1f", n.tuning_s), " s of tuning), ", n.failed, " failed");
  if (n.other > 0) absl::StrAppend(&out, ", ", n.other, " not finished");
  absl::StrAppend(&out, "\n\nTimes are medians of the best fused kernel and of the unfused chain (vendor BLAS per "
                        "GEMM and separate passes) on the target; a model's total is over one forward pass of its "
                        "fusible chains (each chain times the number of times the model runs it).\n\n");
  absl::StrAppend(&out, "## Models\n\n| model | chains | unfused (ms) | fused (ms) | speedup |\n|---|---:|---:|---:|---:|\n");
  for (const ModelTotals& t : TotalsPerModel(r)) {
    absl::StrAppend(&out, "| ", MdCell(t.model), " | ", t.chains, t.measured < t.chains ? absl::StrCat(" (", t.measured, " measured)") : "",
                    " | ", Ms(t.baseline_s), " | ", Ms(t.fused_s), " | ", Speedup(t.speedup()), " |\n");
  }
  for (const auto& [model, chains] : ByModel(r)) {
    absl::StrAppend(&out, "\n## ", MdCell(model), "\n\n");
    for (const SweepModel& m : models) {
      if (m.name != model) continue;
      for (const std::string& line : m.extraction.about) absl::StrAppend(&out, "- ", MdCell(line), "\n");
      if (!m.extraction.about.empty()) absl::StrAppend(&out, "\n");
    }
    absl::StrAppend(&out, "| chain | role | from | runs | result | fused (ms) | unfused (ms) | speedup | tuning (s) |\n"
                          "|---|---|---|---:|---|---:|---:|---:|---:|\n");
    for (const v1::SweepChainResult* c : chains) {
      std::string result = c->state();
      if (c->state() == "failed") absl::StrAppend(&result, ": ", c->error().substr(0, 160));
      absl::StrAppend(&out, "| ", MdCell(c->chain()), " | ", MdCell(c->role()), " | ", MdCell(c->source()), " | ",
                      c->instances(), " | ", MdCell(result), " | ", Ms(c->best_s()), " | ", Ms(c->baseline_s()),
                      " | ", Speedup(c->speedup()), " | ",
                      c->tuning_s() > 0 ? absl::StrFormat("%.1f", c->tuning_s()) : "", " |\n");
    }
  }
  bool any_rejected = false;
  for (const SweepModel& m : models) {
    if (m.extraction.rejected.empty() && !m.extraction.chains.empty()) continue;
    if (!any_rejected) absl::StrAppend(&out, "\n## Not fused\n\n");
    any_rejected = true;
    if (m.extraction.chains.empty()) absl::StrAppend(&out, "- ", MdCell(m.name), ": no fusible chain\n");
    for (const std::string& why : m.extraction.rejected) absl::StrAppend(&out, "- ", MdCell(m.name), ": ", MdCell(why), "\n");
  }
  return out;
}

std::string SweepReportCsv(const v1::SweepReport& r) {
  std::string out =
      "model,chain,role,source,instances,workload_key,result,fused_ms,unfused_ms,speedup,tuning_s,candidates,"
      "task_id,error\n";
  for (const v1::SweepChainResult& c : r.results()) {
    absl::StrAppend(&out, CsvField(c.model()), ",", CsvField(c.chain()), ",", CsvField(c.role()), ",",
                    CsvField(c.source()), ",", c.instances(), ",", c.workload_key(), ",", c.state(), ",",
                    Ms(c.best_s()), ",", Ms(c.baseline_s()), ",",
                    c.speedup() > 0 ? absl::StrFormat("%.4g", c.speedup()) : "", ",",
                    c.tuning_s() > 0 ? absl::StrFormat("%.2f", c.tuning_s()) : "", ",", c.candidates_measured(), ",",
                    c.task_id(), ",", CsvField(c.error()), "\n");
  }
  return out;
}

std::string SweepReportJson(const v1::SweepReport& r, const std::vector<SweepModel>& models) {
  nlohmann::json j;
  j["sweep_id"] = r.sweep_id();
  j["name"] = r.name();
  j["state"] = r.state();
  j["target"] = {{"fingerprint", r.target().fingerprint()}, {"arch", r.target().arch()},
                 {"device", r.target().device_name()}};
  j["budget"] = r.budget();
  j["created"] = Date(r.created_unix_ms());
  j["finished"] = Date(r.finished_unix_ms());
  const std::vector<ModelTotals> totals = TotalsPerModel(r);
  nlohmann::json out_models = nlohmann::json::array();
  for (const auto& [model, chains] : ByModel(r)) {
    nlohmann::json m;
    m["model"] = model;
    for (const ModelTotals& t : totals) {
      if (t.model != model) continue;
      m["unfused_s"] = t.baseline_s;
      m["fused_s"] = t.fused_s;
      m["speedup"] = t.speedup();
      m["chains_measured"] = t.measured;
    }
    for (const SweepModel& sm : models) {
      if (sm.name == model) m["not_fused"] = sm.extraction.rejected;
    }
    nlohmann::json cs = nlohmann::json::array();
    for (const v1::SweepChainResult* c : chains) {
      cs.push_back({{"chain", c->chain()},
                    {"role", c->role()},
                    {"source", c->source()},
                    {"instances", c->instances()},
                    {"workload_key", c->workload_key()},
                    {"result", c->state()},
                    {"error", c->error()},
                    {"fused_s", c->best_s()},
                    {"unfused_s", c->baseline_s()},
                    {"speedup", c->speedup()},
                    {"tuning_s", c->tuning_s()},
                    {"candidates_measured", c->candidates_measured()},
                    {"schedule", c->schedule()},
                    {"task_id", c->task_id()}});
    }
    m["chains"] = std::move(cs);
    out_models.push_back(std::move(m));
  }
  j["models"] = std::move(out_models);
  // ASCII only (a bidi control in a name is \u202e, not a reversed terminal line), and invalid
  // UTF-8 in a name from outside becomes U+FFFD instead of failing the report.
  return j.dump(2, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string SweepReportSvg(const v1::SweepReport& r) {
  // A horizontal bar per chain, grouped under its model's total; the axis
  // is the speedup, with a line at 1x (no gain).
  constexpr int kLabel = 380, kPlot = 420, kRow = 20, kTop = 56, kRight = 70;
  const auto groups = ByModel(r);
  const std::vector<ModelTotals> totals = TotalsPerModel(r);
  double top = 2;
  for (const v1::SweepChainResult& c : r.results()) top = std::max(top, c.speedup());
  for (const ModelTotals& t : totals) top = std::max(top, t.speedup());
  top = std::ceil(top);
  const int rows = r.results_size() + static_cast<int>(groups.size());
  const int width = kLabel + kPlot + kRight, height = kTop + rows * kRow + 40;
  auto x = [&](double v) { return kLabel + v / top * kPlot; };
  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      width, height);
  absl::StrAppendFormat(&out, "<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">%s</text>\n",
                        Xml(absl::StrCat("Sweep ", r.name(), ": fused vs unfused, speedup per chain")));
  absl::StrAppendFormat(&out, "<text x=\"10\" y=\"40\" fill=\"#555\">%s</text>\n",
                        Xml(absl::StrCat(TargetLine(r.target()), "; bold rows: a model's fusible chains in one "
                                                                 "forward pass")));
  const int plot_bottom = kTop + rows * kRow;
  for (int tick = 0; tick <= static_cast<int>(top); ++tick) {
    absl::StrAppendFormat(&out,
                          "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\"/>\n<text x=\"%.1f\" "
                          "y=\"%d\" text-anchor=\"middle\" fill=\"#555\">%dx</text>\n",
                          x(tick), kTop - 4, x(tick), plot_bottom, tick == 1 ? "#333" : "#ddd", x(tick),
                          plot_bottom + 16, tick);
  }
  int row = 0;
  auto bar = [&](const std::string& label, double speedup, const std::string& note, bool bold) {
    const double y = kTop + row * kRow;
    absl::StrAppendFormat(&out, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\"%s>%s</text>\n", kLabel - 8, y + 14,
                          bold ? " font-weight=\"bold\"" : "", Xml(label));
    if (speedup > 0) {
      const char* fill = speedup >= 1 ? (bold ? "#1b7837" : "#5aae61") : "#d6604d";
      absl::StrAppendFormat(&out,
                            "<rect x=\"%d\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"%s\"/>\n<text x=\"%.1f\" "
                            "y=\"%.1f\">%s</text>\n",
                            kLabel, y + 3, x(speedup) - kLabel, kRow - 6, fill, x(speedup) + 4, y + 14,
                            Xml(Speedup(speedup)));
    } else {
      absl::StrAppendFormat(&out, "<text x=\"%d\" y=\"%.1f\" fill=\"#999\">%s</text>\n", kLabel + 4, y + 14,
                            Xml(note));
    }
    ++row;
  };
  for (const auto& [model, chains] : groups) {
    for (const ModelTotals& t : totals) {
      if (t.model == model) bar(model, t.speedup(), "not measured", true);
    }
    for (const v1::SweepChainResult* c : chains) {
      std::string label = absl::StrCat(c->chain(), " (", c->role(), ")");
      if (c->instances() > 1) absl::StrAppend(&label, " x", c->instances());
      bar(label, c->speedup(), c->state() == "failed" ? "failed" : c->best_s() > 0 ? "no baseline" : c->state(),
          false);
    }
  }
  out += "</svg>\n";
  return out;
}

absl::StatusOr<std::vector<std::string>> WriteSweepReport(const v1::SweepReport& report,
                                                          const std::vector<SweepModel>& models,
                                                          const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const std::vector<std::pair<std::string, std::string>> files = {
      {"report.md", SweepReportMarkdown(report, models)},
      {"report.csv", SweepReportCsv(report)},
      {"report.json", SweepReportJson(report, models)},
      {"speedups.svg", SweepReportSvg(report)},
  };
  std::vector<std::string> paths;
  for (const auto& [name, text] : files) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    RETURN_IF_ERROR(WriteFile(path, text));
    paths.push_back(path);
  }
  return paths;
}

}  // namespace fusor::client
