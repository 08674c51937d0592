#include "common/util/timing.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/util/status_macros.h"

namespace fusor {

SampleStats Summarize(std::vector<double> samples) {
  SampleStats s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  s.median = n % 2 == 1 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  // Nearest rank: the p10 of 10 samples is the smallest but one.
  s.p10 = samples[(n - 1) / 10];
  s.p90 = samples[n - 1 - (n - 1) / 10];
  s.spread = s.median > 0 ? (s.p90 - s.p10) / s.median : 0;
  return s;
}

absl::StatusOr<std::vector<TrustedTiming>> MeasureTrustedTogether(
    const std::function<absl::StatusOr<std::vector<std::vector<double>>>()>& take_sets,
    const std::vector<std::vector<int>>& groups, int max_sets, double max_spread) {
  std::vector<TrustedTiming> best;
  double best_worst = 0;
  int sets = 0;
  for (int set = 0; set < std::max(1, max_sets); ++set) {
    // A pause before a retry lets a passing disturbance pass.
    if (set > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    absl::StatusOr<std::vector<std::vector<double>>> samples = take_sets();
    if (!samples.ok()) return samples.status();
    ++sets;
    std::vector<TrustedTiming> round;
    for (std::vector<double>& s : *samples) {
      const SampleStats stats = Summarize(s);
      TrustedTiming t;
      t.samples_s = std::move(s);
      t.median_s = stats.median;
      t.spread = stats.spread;
      round.push_back(std::move(t));
    }
    // The worst spread of a group's fastest kernel.
    double worst = 0;
    auto group_spread = [&](const std::vector<int>& group) {
      const TrustedTiming* fastest = nullptr;
      for (int k : group) {
        if (k >= 0 && k < static_cast<int>(round.size()) &&
            (fastest == nullptr || round[k].median_s < fastest->median_s)) {
          fastest = &round[k];
        }
      }
      return fastest == nullptr ? 0.0 : fastest->spread;
    };
    if (groups.empty()) {
      for (const TrustedTiming& t : round) worst = std::max(worst, t.spread);
    } else {
      for (const std::vector<int>& g : groups) worst = std::max(worst, group_spread(g));
    }
    if (best.empty() || worst < best_worst) {
      best = std::move(round);
      best_worst = worst;
    }
    if (best_worst <= max_spread) break;
  }
  for (TrustedTiming& t : best) {
    t.noisy = t.spread > max_spread;
    t.sets = sets;
  }
  return best;
}

absl::StatusOr<TrustedTiming> MeasureTrusted(const std::function<absl::StatusOr<std::vector<double>>()>& take_set,
                                             int max_sets, double max_spread) {
  ASSIGN_OR_RETURN(std::vector<TrustedTiming> timed,
                   MeasureTrustedTogether(
                       [&]() -> absl::StatusOr<std::vector<std::vector<double>>> {
                         ASSIGN_OR_RETURN(std::vector<double> samples, take_set());
                         return std::vector<std::vector<double>>{std::move(samples)};
                       },
                       {}, max_sets, max_spread));
  return std::move(timed.front());
}

}  // namespace fusor
