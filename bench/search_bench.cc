// Benchmarks of the MCFuser engine on this CPU (results in RESULTS.md):
//   space       generate + place + prune + rank, with schedules/s
//   fidelity    measure schedules spread over the ranked space; Spearman
//               rank correlation of t_estm with the measured median, and
//               how far the model's top-1 is from the best measured;
//               --save keeps the measurements for `learned`
//   convergence the default search against a much longer one: how many
//               candidates and seconds until within 5% of the long
//               search's best, against measuring the whole pruned space;
//               --learn-from also runs it ranked by a learned model
//   learned     leave one chain out over saved fidelity measurements: the
//               learned model (trained on the other chains) against the
//               analytical one, by Spearman and top-1
// Candidates are measured exactly as a worker does (isolated child,
// validation first, median of repeats).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <numeric>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "common/ir/parse.h"
#include "common/model/learned_model.h"
#include "common/search/search_strategy.h"
#include "common/space/space.h"
#include "worker/cpu/cpu_target.h"
#include "worker/job.h"
#include "common/util/process.h"

namespace {

using Clock = std::chrono::steady_clock;
using fusor::worker::JobOutcome;

struct Bench {
  fusor::ir::Chain chain;
  fusor::hw::TargetDesc target;
  std::string self, scratch = "/tmp", blas_dir;
  std::string cache_dir;  // references and the precompiled preamble, kept as a worker keeps them
  double time_budget_s = 0.2;

  // Median seconds of one schedule (0 if it failed) and the wall time spent.
  std::pair<double, double> Measure(const std::string& schedule) const {
    fusor::worker::JobSpec spec;
    spec.kind = fusor::worker::JobKind::kCandidate;
    spec.chain_json = fusor::ir::ChainToJson(chain);
    spec.schedule_text = schedule;
    spec.target = target;
    spec.blas_dir = blas_dir;
    spec.cache_dir = cache_dir;
    spec.timing.time_budget_s = time_budget_s;
    spec.timing.max_repeats = 50;
    spec.timing.rotate_bytes = 2 * std::max(target.l2_bytes * target.compute_units, target.l3_bytes);
    auto start = Clock::now();
    JobOutcome out = fusor::worker::RunJobIsolated(spec, self, scratch);
    double wall = std::chrono::duration<double>(Clock::now() - start).count();
    if (out.status != fusor::worker::OutcomeStatus::kOk) {
      std::cerr << "  " << schedule << ": " << fusor::worker::OutcomeStatusName(out.status) << " " << out.error << "\n";
      return {0, wall};
    }
    return {out.median_s, wall};
  }
};

// `save`: where each measured schedule is appended as a JSON line (the
// chain, the schedule, its median and the W and P it was predicted with),
// the data the learned mode reads.
int Fidelity(const Bench& b, int samples, const std::string& save) {
  auto space = fusor::space::BuildSpace(b.chain, b.target);
  if (!space.ok()) return std::cerr << space.status() << "\n", 1;
  const size_t n = space->ranked.size();
  // The model's top 10, then the rest of the ranking at an even stride.
  std::vector<size_t> picks;
  for (size_t i = 0; i < std::min<size_t>(10, n); ++i) picks.push_back(i);
  const size_t rest = std::max<int>(samples - static_cast<int>(picks.size()), 0);
  for (size_t k = 0; k < rest && n > 10; ++k) picks.push_back(10 + k * (n - 10) / rest);
  std::sort(picks.begin(), picks.end());
  picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
  std::vector<double> predicted, measured;
  double best = 0, top1 = 0;
  for (size_t i : picks) {
    const std::string text = fusor::space::ScheduleToText(space->ranked[i].schedule, b.chain);
    auto [median, wall] = b.Measure(text);
    if (median <= 0) continue;
    predicted.push_back(space->ranked[i].prediction.t_estm_s);
    measured.push_back(median);
    if (i == 0) top1 = median;
    if (!save.empty()) {
      std::ofstream(save, std::ios::app) << nlohmann::json{{"chain", fusor::ir::ChainToJson(b.chain)},
                                                           {"schedule", text},
                                                           {"median_s", median},
                                                           {"bandwidth_bytes_per_s", b.target.bandwidth_bytes_per_s},
                                                           {"peak_flops", b.target.peak_flops}}
                                                .dump()
                                         << "\n";
    }
    if (best == 0 || median < best) best = median;
    std::cerr << absl::StrFormat("  #%-5zu %-44s predicted %9.3f ms  measured %9.3f ms\n", i + 1, text,
                                 space->ranked[i].prediction.t_estm_s * 1e3, median * 1e3);
  }
  std::cout << absl::StrFormat("| %s | %zu of %zu | %.2f | %.3f ms | %.3f ms | %.2fx |\n", b.chain.name,
                               measured.size(), n, fusor::model::Spearman(predicted, measured), top1 * 1e3, best * 1e3,
                               best > 0 ? top1 / best : 0);
  return 0;
}

// Runs a search measuring for real; returns (median, seconds since start) per candidate.
// `patience` 0: the search stops only at its budget (or the space's end).
std::vector<std::pair<double, double>> Search(const Bench& b, int budget, int patience,
                                              std::shared_ptr<const fusor::model::CostModel> model = nullptr) {
  fusor::search::McfuserSearchOptions options;
  options.patience = patience > 0 ? patience : budget;
  options.stop_at_bound = patience > 0;
  const std::string name = model ? model->name() : "analytical";
  options.cost_model = std::move(model);
  auto s = fusor::search::MakeMcfuserSearch(options);
  std::vector<std::pair<double, double>> trace;
  if (!s->Initialize({&b.chain, b.target, budget}).ok()) return trace;
  auto start = Clock::now();
  while (!s->Done()) {
    auto batch = s->NextBatch(4);
    if (batch.empty()) break;
    std::vector<fusor::search::MeasuredResult> results;
    for (const auto& c : batch) {
      double median = b.Measure(c.schedule_text).first;
      std::cerr << absl::StrFormat("  %s %-50s predicted %9.3f ms  measured %9.3f ms\n",
                                   name, c.schedule_text,
                                   c.prediction.t_estm_s * 1e3, median * 1e3);
      trace.push_back({median, std::chrono::duration<double>(Clock::now() - start).count()});
      results.push_back({c.schedule_text, median > 0, median});
    }
    s->NotifyResults(results);
  }
  return trace;
}

// The long search ranks with the analytical model; the default search
// with each of `models` (null: the analytical model), one row each.
int Convergence(const Bench& b, int budget, int long_budget,
                const std::vector<std::shared_ptr<const fusor::model::CostModel>>& models) {
  auto space = fusor::space::BuildSpace(b.chain, b.target);
  if (!space.ok()) return std::cerr << space.status() << "\n", 1;
  auto long_trace = Search(b, long_budget, 0);
  double best_long = 0, spent_long = long_trace.empty() ? 0 : long_trace.back().second;
  for (auto [m, t] : long_trace) {
    if (m > 0 && (best_long == 0 || m < best_long)) best_long = m;
  }
  const double per_candidate = long_trace.empty() ? 0 : spent_long / long_trace.size();
  for (const auto& model : models) {
    auto trace = Search(b, budget, fusor::search::McfuserSearchOptions().patience, model);
    double best = 0;
    int reached_n = -1;
    double reached_s = 0;
    for (size_t i = 0; i < trace.size(); ++i) {
      if (trace[i].first > 0 && (best == 0 || trace[i].first < best)) best = trace[i].first;
      if (reached_n < 0 && best > 0 && best <= 1.05 * best_long) {
        reached_n = static_cast<int>(i + 1);
        reached_s = trace[i].second;
      }
    }
    std::cout << absl::StrFormat(
        "| %s | %s | %.3f ms (%zu measured, %.0f s) | %.3f ms after %zu (%.0f s), %+.1f%% | %s | %.0f s |\n",
        b.chain.name, model ? model->name() : "analytical", best_long * 1e3, long_trace.size(), spent_long,
        best * 1e3, trace.size(), trace.empty() ? 0 : trace.back().second, best_long > 0 ? (best / best_long - 1) * 100 : 0,
        reached_n > 0 ? absl::StrFormat("%d candidates, %.0f s", reached_n, reached_s) : std::string("not reached"),
        per_candidate * space->ranked.size());
  }
  return 0;
}

// The samples of what `fidelity --save` wrote to `files`, with their
// features on `cpu` (at the W and P they were predicted with).
absl::StatusOr<std::vector<fusor::model::Sample>> LoadSamples(const fusor::hw::TargetDesc& cpu,
                                                              const std::vector<std::string>& files) {
  std::vector<fusor::model::Sample> samples;
  for (const std::string& file : files) {
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      auto chain = fusor::ir::ParseChainJson(j.at("chain").get<std::string>());
      if (!chain.ok()) return chain.status();
      fusor::hw::TargetDesc target = cpu;
      target.bandwidth_bytes_per_s = j.at("bandwidth_bytes_per_s").get<double>();
      target.peak_flops = j.at("peak_flops").get<double>();
      auto sample = fusor::model::MakeSample(*chain, j.at("schedule").get<std::string>(), target,
                                             j.at("median_s").get<double>(), chain->name);
      if (!sample.ok()) return sample.status();
      samples.push_back(*sample);
    }
  }
  return samples;
}

int Learned(const fusor::hw::TargetDesc& cpu, const std::vector<std::string>& files, double lambda,
            const std::string& features_csv) {
  auto loaded = LoadSamples(cpu, files);
  if (!loaded.ok()) return std::cerr << loaded.status() << "\n", 1;
  const std::vector<fusor::model::Sample>& samples = *loaded;
  if (!features_csv.empty()) {
    std::ofstream out(features_csv);
    out << "group,analytical_s,measured_s";
    for (const std::string& f : fusor::model::FeatureNames()) out << "," << f;
    out << "\n";
    for (const auto& s : samples) {
      out << s.group << "," << s.analytical_s << "," << s.measured_s;
      for (double f : s.features) out << "," << f;
      out << "\n";
    }
  }
  fusor::model::TrainOptions options;
  options.lambda = lambda;
  std::cout << "| chain held out | measured | Spearman analytical | Spearman learned | top-1 / best, analytical | "
               "top-1 / best, learned |\n|---|---|---|---|---|---|\n";
  for (const auto& h : fusor::model::LeaveOneGroupOut(samples, options)) {
    std::cout << absl::StrFormat("| %s | %d | %.2f | %.2f | %.2fx | %.2fx |\n", h.group, h.samples,
                                 h.spearman_analytical, h.spearman_learned, h.top1_analytical, h.top1_learned);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "__run-job") return fusor::worker::RunJobMain(argv[2]);
  CLI::App app{"fusor search benchmarks"};
  std::string mode, file;
  int samples = 60, budget = 16, long_budget = 64;
  std::string save, features_csv;
  std::vector<std::string> more;
  double lambda = fusor::model::TrainOptions().lambda;
  Bench b;
  b.blas_dir = FUSOR_OPENBLAS_DIR;
  app.add_option("mode", mode, "space | fidelity | convergence | learned")->required();
  app.add_option("chain", file, "chain file (learned: a file fidelity --save wrote)")->required();
  app.add_option("more", more, "learned: more such files");
  app.add_option("--save", save, "fidelity: append each measured schedule to this file (JSON lines)");
  app.add_option("--lambda", lambda, "learned: ridge penalty")->capture_default_str();
  app.add_option("--features-csv", features_csv, "learned: write every sample's features here");
  std::vector<std::string> learn_from;
  app.add_option("--learn-from", learn_from,
                 "convergence: rank the default search with a model learned from these files (fidelity --save), "
                 "leaving this chain out");
  app.add_option("--samples", samples, "fidelity: schedules to measure")->capture_default_str();
  app.add_option("--budget", budget, "convergence: the default search's budget")->capture_default_str();
  app.add_option("--long-budget", long_budget, "convergence: the long search's budget")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  auto dir = fusor::TempDir::Create("/tmp", "fusor-bench-");
  auto target = fusor::worker::DescribeCpu("c++", dir->path());
  if (!target.ok()) return std::cerr << target.status() << "\n", 1;
  if (mode == "learned") {
    more.insert(more.begin(), file);
    return Learned(*target, more, lambda, features_csv);
  }
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  auto chain = fusor::ir::ParseChain(text.str());
  if (!chain.ok()) return std::cerr << chain.status() << "\n", 1;
  b.chain = *chain;
  b.self = fusor::CurrentExecutable("fusor-bench-search");
  b.cache_dir = dir->path();
  b.target = *target;
  if (mode == "space") {
    auto space = fusor::space::BuildSpace(b.chain, b.target);
    if (!space.ok()) return std::cerr << space.status() << "\n", 1;
    std::cout << absl::StrFormat("| %s | %d | %d | %d | %.3f s | %.0f |\n", b.chain.name, space->stats.enumerated,
                                 space->stats.stages[0].remaining, space->ranked.size(), space->stats.seconds,
                                 space->stats.stages[0].remaining / space->stats.seconds);
    return 0;
  }
  // Calibrate W and P as a worker would.
  fusor::worker::JobSpec cal;
  cal.kind = fusor::worker::JobKind::kCalibrate;
  cal.target = b.target;
  cal.timing.time_budget_s = 0.4;
  JobOutcome out = fusor::worker::RunJobIsolated(cal, b.self, b.scratch);
  b.target.bandwidth_bytes_per_s = out.bandwidth_bytes_per_s;
  b.target.peak_flops = out.peak_flops;
  if (mode == "fidelity") return Fidelity(b, samples, save);
  if (mode == "convergence") {
    std::vector<std::shared_ptr<const fusor::model::CostModel>> models = {nullptr};
    if (!learn_from.empty()) {
      auto samples = LoadSamples(b.target, learn_from);
      if (!samples.ok()) return std::cerr << samples.status() << "\n", 1;
      std::erase_if(*samples, [&](const fusor::model::Sample& s) { return s.group == b.chain.name; });
      auto learned = fusor::model::LearnedModel::Train(*samples);
      if (!learned.ok()) return std::cerr << learned.status() << "\n", 1;
      models.push_back(*learned);
    }
    return Convergence(b, budget, long_budget, models);
  }
  std::cerr << "unknown mode " << mode << "\n";
  return 2;
}
