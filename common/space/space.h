// The space of fused schedules of a chain on a target: every tiling
// expression (where each tiled dim's loop goes: block, stream or the ops'
// own loops, and the order of own loops) times every tile size, with each
// sum op's default mapping; then the other valid mappings of each op (AMOS)
// on the most promising of those tilings. Reduced by MCFuser's four
// pruning rules and ranked by the analytical model.
//
// Stages, each counted (and each rule switchable):
//   enumerated      tile sizes x placements of every dim x own-loop orders
//   1 dedupe        equivalent nests merged (a loop of one trip vanishes,
//                   so where an untiled dim was placed does not matter)
//   legal           nests the dependencies allow (see loop_nest.h)
//   2 intermediates block-local intermediates within a fraction of the
//                   scratch budget (shared memory / private caches)
//   3 padding       padded / useful compute within a margin of the
//                   unavoidable (recomputation is not padding: the model
//                   charges it)
//   4 scratch       everything a block holds, with a margin, within the
//                   scratch budget
// A dim alone on an axis of its op's default mapping takes tiles in steps
// of that axis' extent (at least 16: 16, 32, 64, ... for an 8x32 CPU block's
// rows, 32, 64, ... for its columns, 64, 128, ... for wgmma's rows) or its
// full extent; other dims that can carry a loop take powers of two or the
// full extent; dims no loop can go over, or under 8, keep their extent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/hw/target.h"
#include "common/ir/chain.h"
#include "common/model/cost_model.h"
#include "common/space/loop_nest.h"
#include "common/space/schedule.h"

namespace fusor::space {

struct SpaceOptions {
  // Mappings: every valid mapping of each sum op (at most this many per op,
  // strict ones and the least padded first) is tried, one op at a time, on
  // the best `mapping_tilings` schedules of the default mappings.
  int max_mappings_per_op = 32;
  int mapping_tilings = 64;
  bool dedupe = true;               // rule 1
  bool limit_intermediates = true;  // rule 2
  bool limit_padding = true;        // rule 3
  bool limit_scratch = true;        // rule 4
  double intermediate_fraction = 0.5;
  double max_padding = 0.25;
  double scratch_margin = 1.1;
  // What ranks the space; null: model::AnalyticalModel(). Must outlive
  // the calls it is passed to.
  const model::CostModel* model = nullptr;
};

struct SpaceStage {
  std::string name;
  int64_t remaining = 0;
};

struct SpaceStats {
  int64_t enumerated = 0;
  std::vector<SpaceStage> stages;  // in order: dedupe, legal, intermediates, padding, scratch
  int64_t mappings = 0;            // alternative mappings tried (over all sum ops)
  int64_t mapped_schedules = 0;    // schedules with an alternative mapping that survived the rules
  // CUDA: register-resident kernels (intermediates in registers) with
  // their own tiles, ranked ahead of the rest (space.cc)
  int64_t register_resident = 0;
  double seconds = 0;              // to enumerate, prune and rank
};

struct RankedSchedule {
  Schedule schedule;  // canonical
  model::Prediction prediction;
  std::string mappings;  // DescribeMappings of its nest
};

struct Space {
  std::vector<RankedSchedule> ranked;  // best predicted first
  SpaceStats stats;
};

// The splits of the stream loop among blocks considered for `schedule`: 1,
// and with a stream loop 2, 4, ... up to the cores (at most 8) on a CPU;
// on a GPU 2, 4, ... 32 while the blocks of the split before it are fewer
// than the multiprocessors and, in shared memory, each part keeps four
// steps or more (its first tiles, partial sums and combine are paid per
// part; the split nests the model picked for conv_chain and gemm_chain
// with one or two steps a part had 6-36 times the SASS instructions per
// mma of their unsplit picks).
std::vector<int> SplitOptions(const Schedule& schedule, const ir::Chain& chain, const hw::TargetDesc& target);

// The tile sizes considered for `dim` on `target`.
std::vector<int64_t> TileOptions(const ir::Chain& chain, const hw::TargetDesc& target, int dim);

absl::StatusOr<Space> BuildSpace(const ir::Chain& chain, const hw::TargetDesc& target,
                                 const SpaceOptions& options = SpaceOptions());

// Checks one schedule against the same legality and pruning rules and
// predicts its time; FAILED_PRECONDITION naming the rule that prunes it.
absl::StatusOr<RankedSchedule> EvaluateSchedule(const ir::Chain& chain, const hw::TargetDesc& target,
                                                const Schedule& schedule, const SpaceOptions& options = SpaceOptions());

// Padded over useful compute of the schedule with every dim at full
// extent: the padding no tiling avoids.
double MinimalPaddingRatio(const ir::Chain& chain, const hw::TargetDesc& target);

}  // namespace fusor::space
