// Exploration strategies over the space of fused schedules.
//
// Lifecycle: Initialize with a task; then repeatedly NextBatch (candidates
// to measure) and NotifyResults (what they measured) until Done. A strategy
// is deterministic: given the same task and the same results in the same
// order it proposes the same batches, so a restarted scheduler can replay
// a task from its database. Not thread-safe; the caller serializes calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/hw/target.h"
#include "common/ir/chain.h"
#include "common/model/cost_model.h"
#include "common/space/schedule.h"

namespace fusor::search {

struct SearchTask {
  const ir::Chain* chain = nullptr;  // must outlive the strategy
  hw::TargetDesc target;
  int budget = 16;  // most candidates to propose
};

struct CandidateSpec {
  space::Schedule schedule;
  std::string schedule_text;
  std::string mapping;  // how each op maps onto the micro-kernel
  model::Prediction prediction;
};

struct MeasuredResult {
  std::string schedule_text;
  bool ok = false;
  double median_s = 0;
};

struct SpaceStats {
  int64_t total = 0;          // schedules enumerated
  int64_t after_pruning = 0;  // left after every rule
  std::vector<std::pair<std::string, int64_t>> pruned_by_rule;
};

class SearchStrategy {
 public:
  virtual ~SearchStrategy() = default;
  // INVALID_ARGUMENT if the chain cannot be scheduled on the target.
  virtual absl::Status Initialize(const SearchTask& task) = 0;
  // At most `max_count` candidates not proposed before; empty when none are left.
  virtual std::vector<CandidateSpec> NextBatch(int max_count) = 0;
  virtual void NotifyResults(const std::vector<MeasuredResult>& results) = 0;
  virtual bool Done() const = 0;
  virtual SpaceStats Stats() const = 0;
};

// Enumerates tile sizes of the chain's loops (block dims = every fusable
// dim), prunes schedules whose per-thread scratch overflows the target's
// private caches or whose padded work exceeds the unavoidable padding (that
// of full-extent tiles) by more than `max_padding`, ranks the rest by the
// analytical model and proposes them best first.
struct TileSearchOptions {
  double max_padding = 0.25;
};
std::unique_ptr<SearchStrategy> MakeModelRankedTileSearch(const TileSearchOptions& options = {});

// The mapping of each op onto the micro-kernel, e.g.
// "fma.avx2.6x16 S[batch=b rows=m cols=n k=k] O[...]".
std::string DescribeMapping(const ir::Chain& chain, const hw::CpuMicroKernel& kernel);

}  // namespace fusor::search
