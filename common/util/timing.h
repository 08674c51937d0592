// The timing protocol every measurement follows, candidate or baseline,
// CPU or GPU: samples after warm-up until a time budget, their median and
// their spread; a sample set that spreads too far is taken again, and one
// that stays that way is noisy: stored with its samples, never a best
// record or a baseline.
//
// The spread is (p90 - p10) / median. On a quiet machine a kernel's middle
// 80% of samples lie within a few percent of each other (within 30% on a
// shared 2-core VM, measured); a busy core shows as a tail of samples
// several times the median, since a thread that loses its core waits a
// scheduler quantum (4 ms at 250 Hz) at the next barrier: spreads of 1 to
// 40 under a CPU hog, and medians off by up to 60x under a parallel build.
// Half the median separates the two with room on both sides.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fusor {

inline constexpr double kMaxSpread = 0.5;
inline constexpr int kMinSamples = 10;  // for the percentiles to mean something
inline constexpr int kSampleSets = 3;   // taken at most, per measurement

struct SampleStats {
  double median = 0, p10 = 0, p90 = 0;
  double spread = 0;  // (p90 - p10) / median; 0 for no samples
};
SampleStats Summarize(std::vector<double> samples);

struct TrustedTiming {
  std::vector<double> samples_s;  // the set kept: the least spread one (of kernels timed together, the round's)
  double median_s = 0;
  double spread = 0;
  bool noisy = false;  // the set kept spreads beyond kMaxSpread
  int sets = 0;        // sample sets taken
};

// Takes sample sets with `take_set` until one's spread is within
// `max_spread`, at most `max_sets`; returns the least spread set. A failed
// set fails the measurement.
absl::StatusOr<TrustedTiming> MeasureTrusted(const std::function<absl::StatusOr<std::vector<double>>()>& take_set,
                                             int max_sets = kSampleSets, double max_spread = kMaxSpread);

// The same for several kernels timed together (interleaved, so that a
// machine whose speed drifts slows them alike): `take_sets` returns one
// sample set per kernel. The kernels fall into `groups` (indices; empty:
// each kernel its own group), of which only the fastest kernel needs to be
// trusted: of a baseline's variants, the one that is the baseline. Rounds
// are taken until each group's fastest is within `max_spread`, and the
// round kept is the one whose worst such spread is least; each kernel is
// noisy by its own spread.
absl::StatusOr<std::vector<TrustedTiming>> MeasureTrustedTogether(
    const std::function<absl::StatusOr<std::vector<std::vector<double>>>()>& take_sets,
    const std::vector<std::vector<int>>& groups = {}, int max_sets = kSampleSets, double max_spread = kMaxSpread);

// How a worker times a kernel (the protocol above, with these bounds).
struct TimingOptions {
  int warmup = 2;
  int min_repeats = 5;
  int max_repeats = 200;
  double time_budget_s = 0.5;
  int num_threads = 1;
  uint64_t seed = 1;
  // Input sets are rotated until together they exceed this many bytes (the
  // last-level cache), so repeats do not read inputs the last one cached.
  int64_t rotate_bytes = 0;
  double max_spread = kMaxSpread;  // the timing protocol's bound
  // A serving process's requests (common/util/quiet.h): samples are taken
  // between them; empty: whenever.
  std::string quiet_file;
};

}  // namespace fusor
