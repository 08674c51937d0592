#include "common/util/timing.h"

#include <algorithm>
#include <chrono>
#include <thread>

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

absl::StatusOr<TrustedTiming> MeasureTrusted(const std::function<absl::StatusOr<std::vector<double>>()>& take_set,
                                             int max_sets, double max_spread) {
  TrustedTiming best;
  for (int set = 0; set < std::max(1, max_sets); ++set) {
    // A pause before a retry lets a passing disturbance pass.
    if (set > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    absl::StatusOr<std::vector<double>> samples = take_set();
    if (!samples.ok()) return samples.status();
    const SampleStats stats = Summarize(*samples);
    ++best.sets;
    if (best.samples_s.empty() || stats.spread < best.spread) {
      best.samples_s = std::move(*samples);
      best.median_s = stats.median;
      best.spread = stats.spread;
    }
    if (best.spread <= max_spread) break;
  }
  best.noisy = best.spread > max_spread;
  return best;
}

}  // namespace fusor
