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
#include <vector>

#include "absl/status/status.h"
#include "common/hw/target.h"
#include "common/ir/chain.h"
#include "common/model/cost_model.h"
#include "common/space/schedule.h"
#include "common/space/space.h"

namespace fusor::search {

struct SearchTask {
  const ir::Chain* chain = nullptr;  // must outlive the strategy
  hw::TargetDesc target;
  int budget = 16;  // most candidates to propose
};

struct CandidateSpec {
  space::Schedule schedule;
  std::string schedule_text;
  std::string mapping;  // how each sum op maps onto an intrinsic (space::DescribeMappings)
  model::Prediction prediction;
};

struct MeasuredResult {
  std::string schedule_text;
  bool ok = false;
  double median_s = 0;
};

class SearchStrategy {
 public:
  virtual ~SearchStrategy() = default;
  // INVALID_ARGUMENT if no schedule of the chain survives on the target.
  virtual absl::Status Initialize(const SearchTask& task) = 0;
  // At most `max_count` candidates not proposed before; empty when none are left.
  virtual std::vector<CandidateSpec> NextBatch(int max_count) = 0;
  virtual void NotifyResults(const std::vector<MeasuredResult>& results) = 0;
  virtual bool Done() const = 0;
  virtual space::SpaceStats Stats() const = 0;
};

// MCFuser's exploration: the pruned space is ranked by the cost model
// (the analytical one unless another is given). A space of at most
// `exhaustive_limit` schedules is proposed in model order; a larger one
// by an evolutionary search around what was
// measured best (mutating tile sizes, loop placements and own-loop order,
// crossing good parents), selecting by the model's prediction corrected by
// measurements: each tiling expression's predictions are scaled by how far
// its measured candidates were from their predictions, so schedules the
// model over-rated sink. Stops at the budget, when the space is exhausted,
// after `patience` rounds without a better measurement, or at the
// confidence bound (not on a GPU, whose launch variants the model cannot
// rank): the model's error on the task is taken as the spread (root mean
// square) of the measured candidates' log(measured / predicted) around
// their median (failures left out), but at least `min_error_spread`; when every
// unproposed schedule's score divided by e^(2 x that spread) is still no
// faster than the best measured (after two rounds and 8 measured), nothing
// left is expected to beat it. The floor on the spread is there because
// the candidates a search measures are alike: on the CPU their spread
// around the model was 0.02-0.12 while across each chain's space it was
// 0.18-0.38 (bench/RESULTS.md, "A cost model learned from the database").
struct McfuserSearchOptions {
  // What ranks the space and selects children; null: the analytical model.
  std::shared_ptr<const model::CostModel> cost_model;
  space::SpaceOptions space;  // its `model` is set from cost_model
  int exhaustive_limit = 64;
  int patience = 4;
  bool stop_at_bound = true;
  double min_error_spread = 0.25;
  int population = 64;
  uint64_t seed = 1;
  // Partial fusions (space/split.h): after the fused search, this many of
  // the chain's splits (at most a quarter of the budget), ranked by the
  // model, each part fused or run unfused through `split_library`. For a
  // CPU, whose answers may call a library; 0: none.
  int split_candidates = 0;
  std::string split_library = "onednn";
  // Schedules proposed first, in this order (a record's schedule carried
  // over to other sizes); one that does not parse, or that the space's
  // rules refuse, is left out.
  std::vector<std::string> seeds;
};
std::unique_ptr<SearchStrategy> MakeMcfuserSearch(const McfuserSearchOptions& options = {});

}  // namespace fusor::search
