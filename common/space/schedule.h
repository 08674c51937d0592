// A fused schedule: which dims are tiled at block level (the parallel,
// fused loops) and the tile size of every dim.
//
// Text form (dims not named keep their full extent):
//   block[b=1,m=64] n=128 k=64 h=64
// Block dims are the fused outer loops, outermost first; they must be
// fusable dims of the chain (see loop_nest.h). The other entries size the
// per-op tile loops inside a block.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "common/ir/chain.h"

namespace fusor::space {

struct Schedule {
  std::vector<int> block_dims;  // outermost first
  std::vector<int64_t> tile;    // per chain dim, in [1, extent]

  bool operator==(const Schedule& other) const = default;
};

// A schedule with no block dims and every tile at full extent.
Schedule UntiledSchedule(const ir::Chain& chain);

std::string ScheduleToText(const Schedule& schedule, const ir::Chain& chain);
// INVALID_ARGUMENT naming the offending token on a malformed text.
absl::StatusOr<Schedule> ParseSchedule(absl::string_view text, const ir::Chain& chain);

// The same schedule for chain `to` whose dims are a renumbering of this
// schedule's: `dim_map` maps this schedule's dim ids to `to`'s (-1: none).
// Dims of `to` that nothing maps onto keep their full extent.
Schedule RemapSchedule(const Schedule& schedule, const std::vector<int>& dim_map,
                       const ir::Chain& to);

}  // namespace fusor::space
