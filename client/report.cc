#include "client/report.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/space/split.h"
#include "common/util/text.h"

namespace fusor::client {

std::string FormatSeconds(double s) {
  if (s <= 0) return "-";
  if (s < 1e-3) return absl::StrFormat("%.1f us", s * 1e6);
  if (s < 1) return absl::StrFormat("%.3f ms", s * 1e3);
  return absl::StrFormat("%.2f s", s);
}

// How a split schedule ("split after T: HEAD | TAIL") runs its parts, in words.
static std::string SplitParts(const std::string& schedule) {
  absl::StatusOr<space::SplitWords> words = space::ReadSplitWords(schedule);
  if (!words.ok()) return schedule;
  std::string out = absl::StrCat("the chain in two kernels run in turn, split after ", words->tensor, ": ");
  for (int p = 0; p < 2; ++p) {
    const std::string vendor = space::UnfusedVendor(words->texts[p]);
    absl::StrAppend(&out, p == 0 ? "the head " : ", the tail ", vendor.empty() ? "fused" : "unfused, through " + vendor);
  }
  return out;
}

std::string FormatResult(const std::string& name, const v1::TuneResult& r) {
  const v1::Prediction& p = r.best().prediction();
  const v1::Measurement& m = r.best_measurement();
  const v1::Target& t = r.target();
  std::string out;
  absl::StrAppendFormat(&out, "workload   %s (key %s)\n", name, r.workload_key());
  absl::StrAppendFormat(&out, "target     %s (%s, %s, %d cores)\n", t.fingerprint(), t.arch(), t.device_name(),
                        t.compute_units());
  const std::string source = r.source_key().empty() ? "" : absl::StrCat("workload ", r.source_key());
  if (r.answer() == "transferred" && !r.validated()) {
    absl::StrAppendFormat(&out, "answer     transferred from %s (its schedule fitted to these sizes); not yet "
                          "measured here: compile --transfer validates and times it\n", source);
  } else if (r.answer() == "transferred") {
    absl::StrAppendFormat(&out, "answer     transferred from %s, validated and timed at these sizes by task %s%s\n",
                          source, r.task_id(), r.from_cache() ? " (from the cache)" : "");
  } else if (r.answer() == "covered") {
    absl::StrAppendFormat(&out, "answer     from the cache: the record of %s, whose range holds these sizes (task %s)\n",
                          source, r.task_id());
  } else if (r.from_cache()) {
    absl::StrAppendFormat(&out, "answer     from the cache (tuned by task %s%s, no new measurement)\n", r.task_id(),
                          r.origin().empty() ? "" : absl::StrCat(", imported from ", r.origin()));
  } else {
    absl::StrAppendFormat(&out, "answer     tuned now by task %s: %d candidates measured (%d failed) in %.1f s\n",
                          r.task_id(), r.candidates_measured(), r.candidates_failed(), r.tuning_s());
  }
  if (!r.served_dims().empty()) {
    absl::StrAppendFormat(&out, "range      %s  (one kernel: it takes these dims' sizes at each call)\n",
                          r.served_dims());
  }
  absl::StrAppendFormat(&out, "schedule   %s\n", r.best().schedule().text());
  // (A scheduler older than transfers sends no answer and validates whatever it answers.)
  if (r.answer() == "transferred" && !r.validated()) {
    absl::StrAppendFormat(&out, "mapping    %s\n", r.best().mapping().text());
    absl::StrAppendFormat(&out, "predicted  %s  (t_mem %s + t_comp %s) x alpha %.2f\n", FormatSeconds(p.t_estm_s()),
                          FormatSeconds(p.t_mem_s()), FormatSeconds(p.t_comp_s()), p.alpha());
    return out;
  }
  if (r.best().schedule().text().rfind(space::kUnfusedPrefix, 0) == 0) {
    absl::StrAppendFormat(&out, "measured   %s  median of %d samples, spread %.0f%% (%s GEMMs + vector passes, "
                          "validated)\n",
                          FormatSeconds(m.median_s()), m.samples_s_size(), 100 * m.spread(), r.baseline_kind());
    if (r.fused_s() > 0) {
      const bool split = space::IsSplitText(r.fused_schedule());
      absl::StrAppendFormat(&out, "fused      %s  the best %s (%s), measured in the same task\n",
                            FormatSeconds(r.fused_s()), split ? "candidate, partly fused" : "fused kernel",
                            r.fused_schedule());
      absl::StrAppendFormat(&out, "unfused wins: fusion does not pay here (the %s runs at %.2fx the "
                            "unfused chain's speed); the answer runs the chain unfused\n",
                            split ? "partly fused chain" : "fused kernel", m.median_s() / r.fused_s());
    }
    return out;
  }
  if (space::IsSplitText(r.best().schedule().text())) {
    absl::StrAppendFormat(&out, "parts      %s\n", SplitParts(r.best().schedule().text()));
  }
  absl::StrAppendFormat(&out, "mapping    %s\n", r.best().mapping().text());
  absl::StrAppendFormat(&out, "predicted  %s  (t_mem %s + t_comp %s) x alpha %.2f\n", FormatSeconds(p.t_estm_s()),
                        FormatSeconds(p.t_mem_s()), FormatSeconds(p.t_comp_s()), p.alpha());
  absl::StrAppendFormat(&out, "measured   %s  median of %d samples, spread %.0f%% (max relative error %.1e)\n",
                        FormatSeconds(m.median_s()), m.samples_s_size(), 100 * m.spread(), m.max_rel_error());
  const v1::Measurement& b = r.baseline();
  const std::string what = absl::StrCat("unfused: ", r.baseline_kind().empty() ? "vendor BLAS" : r.baseline_kind(),
                                        " GEMMs + vector passes, measured in the same task");
  if (r.baseline_s() > 0) {
    absl::StrAppendFormat(&out, "baseline   %s  median of %d samples, spread %.0f%% (%s)\n", FormatSeconds(r.baseline_s()),
                          b.samples_s_size(), 100 * b.spread(), what);
    absl::StrAppendFormat(&out, "speedup    %.2fx over the unfused baseline\n", r.speedup());
  } else if (b.status() == v1::MEASUREMENT_STATUS_NOISY) {
    absl::StrAppendFormat(&out, "baseline   noisy: its samples spread too far on every try (the machine was busy)\n");
    absl::StrAppendFormat(&out, "speedup    not shown: there is no trusted baseline to compare with\n");
  } else {
    absl::StrAppendFormat(&out, "baseline   not measured (the baseline job failed)\n");
  }
  return out;
}

std::string FormatExplanation(const std::string& name, const v1::Explanation& why) {
  std::string out;
  absl::StrAppendFormat(&out, "why        %s (key %s, family %s)\n", name, why.workload_key(), why.family_key());
  if (why.nearest_key().empty()) {
    absl::StrAppendFormat(&out, "nearest    none: %s\n", why.summary());
    return out;
  }
  absl::StrAppendFormat(&out, "nearest    workload %s on target %s (salt %s)\n", why.nearest_key(),
                        why.nearest_target(), why.nearest_salt());
  if (why.differences().empty()) absl::StrAppendFormat(&out, "differs    in nothing of the key\n");
  for (int i = 0; i < why.differences_size(); ++i) {
    const v1::Difference& d = why.differences(i);
    absl::StrAppendFormat(&out, "%s %s: %s here, %s there\n", i == 0 ? "differs   " : "          ", d.field(),
                          d.wanted().empty() ? "(none)" : d.wanted(), d.found().empty() ? "(none)" : d.found());
  }
  return out;
}

std::string FormatProgress(const v1::TuneProgress& p) {
  constexpr int kWidth = 24;
  const int budget = p.budget() > 0 ? p.budget() : 1;
  const int filled = std::min(kWidth, p.measured() * kWidth / budget);
  std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
  std::string out = absl::StrFormat("[%s] %d/%d measured", bar, p.measured(), p.budget());
  if (p.failed() > 0) {
    absl::StrAppendFormat(&out, ", %d failed", p.failed());
    if (p.noisy() > 0) absl::StrAppendFormat(&out, " (%d noisy)", p.noisy());
  }
  if (p.best_s() > 0) absl::StrAppendFormat(&out, ", best %s (%s)", FormatSeconds(p.best_s()), p.best_schedule());
  return out;
}

std::string FormatWorkers(const v1::ListWorkersResponse& workers, int64_t now_ms) {
  std::string out = absl::StrFormat("%-20s %-24s %-6s %-21s %-14s %5s %9s %10s %6s %s\n", "WORKER", "NAME", "STATE",
                                    "TARGET", "ARCH", "CORES", "W GB/s", "P GFLOP/s", "JOBS", "LAST SEEN");
  for (const v1::WorkerInfo& w : workers.workers()) {
    // Names from before they were checked at registration: escaped, one line each.
    absl::StrAppendFormat(&out, "%-20s %-24s %-6s %-21s %-14s %5d %9.1f %10.1f %6d %.0f s ago\n", Echo(w.worker_id(), 64),
                          Echo(w.name(), 64), w.state(), Echo(w.target().fingerprint(), 64), Echo(w.target().arch(), 64),
                          w.target().compute_units(), w.target().bandwidth_bytes_per_s() / 1e9,
                          w.target().peak_flops() / 1e9, w.jobs_done(),
                          static_cast<double>(now_ms - w.last_seen_unix_ms()) / 1000);
  }
  if (workers.workers().empty()) out += "(no workers have registered)\n";
  return out;
}

std::string FormatTask(const v1::TaskInfo& t) {
  std::string out = absl::StrFormat("task       %s\nstate      %s\nworkload   %s\ntarget     %s\nprogress   %s\n",
                                    t.task_id(), t.state(), t.workload_key(), t.target_fingerprint(),
                                    FormatProgress(t.progress()));
  if (!t.error().empty()) absl::StrAppendFormat(&out, "error      %s\n", t.error());
  return out;
}

}  // namespace fusor::client
