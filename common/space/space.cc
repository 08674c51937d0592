#include "common/space/space.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/hw/devices.h"
#include "common/util/status_macros.h"

namespace fusor::space {
namespace {

const model::CostModel& RankingModel(const SpaceOptions& options) {
  return options.model != nullptr ? *options.model : model::AnalyticalModel();
}

bool Contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

const char* Pruned(const LoopNest& nest, const SpaceOptions& options, int64_t budget, double min_padding);

// Each sum op's valid mappings on the target's usable intrinsics other than
// its default one, strict and least padded first, at most `limit`.
std::vector<mapping::Mapping> Alternatives(const ir::Chain& chain, const hw::TargetDesc& target, int op, int limit) {
  auto sw = mapping::ViewOp(chain, op);
  if (!sw.ok()) return {};
  const std::optional<mapping::Mapping> fallback = DefaultMappingFor(chain, op, target);
  std::vector<std::pair<mapping::Verdict, mapping::Mapping>> found;
  for (const hw::Intrinsic* x : UsableIntrinsics(chain, target)) {
    for (const mapping::Mapping& m : mapping::GenerateMappings(chain, *sw, *x).mappings) {
      mapping::Verdict v = mapping::Validate(chain, *sw, m);
      if (v.valid && !(fallback && m == *fallback)) found.push_back({v, m});
    }
  }
  std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    if (a.first.strict != b.first.strict) return a.first.strict;
    return a.first.padding < b.first.padding;
  });
  std::vector<mapping::Mapping> out;
  for (size_t i = 0; i < found.size() && static_cast<int>(i) < limit; ++i) out.push_back(found[i].second);
  return out;
}

// Tries every op's alternative mappings on the best schedules so far and
// merges the survivors into the ranking.
// The chain as written or regrouped, with what enumerating its schedules
// needs.
struct Variant {
  ir::Regroup regroup;
  ir::Chain chain;
  NestContext context;
  double min_padding = 1;
};

void AddMappingAlternatives(const std::vector<Variant>& variants, const hw::TargetDesc& target,
                            const SpaceOptions& options, int64_t budget, Space& space) {
  const size_t top = std::min<size_t>(space.ranked.size(), options.mapping_tilings);
  std::vector<RankedSchedule> added;
  for (const Variant& v : variants) {
    const ir::Chain& chain = v.chain;
    for (size_t o = 0; o < chain.ops.size(); ++o) {
      for (const mapping::Mapping& m : Alternatives(chain, target, static_cast<int>(o), options.max_mappings_per_op)) {
        ++space.stats.mappings;
        for (size_t i = 0; i < top; ++i) {
          if (space.ranked[i].schedule.regroup != v.regroup) continue;
          Schedule s = space.ranked[i].schedule;
          s.regroup = {};
          s.maps[o] = m;
          auto nest = BuildLoopNest(chain, s, target, &v.context);
          if (!nest.ok() || *Pruned(*nest, options, budget, v.min_padding)) continue;
          nest->schedule.regroup = v.regroup;
          added.push_back(
              {nest->schedule, RankingModel(options).Predict(*nest, target, chain), DescribeMappings(chain, *nest)});
        }
      }
    }
  }
  space.stats.mapped_schedules = static_cast<int64_t>(added.size());
  const size_t middle = space.ranked.size();
  space.ranked.insert(space.ranked.end(), added.begin(), added.end());
  std::sort(space.ranked.begin() + static_cast<long>(middle), space.ranked.end(),
            [](const RankedSchedule& a, const RankedSchedule& b) {
              return a.prediction.t_estm_s < b.prediction.t_estm_s;
            });
  std::inplace_merge(space.ranked.begin(), space.ranked.begin() + static_cast<long>(middle), space.ranked.end(),
                     [](const RankedSchedule& a, const RankedSchedule& b) {
                       return a.prediction.t_estm_s < b.prediction.t_estm_s;
                     });
}

enum Placement : uint8_t { kOwn = 0, kBlock = 1, kStream = 2 };

// Dims that may be a stream loop: used by two ops or more (otherwise the
// loop is just that op's own loop). On a CPU that includes dims that could
// be block loops: a block then runs through its rows in strips, each strip
// through the whole chain while its intermediates stay in L1, and what
// does not depend on the dim (a packed K or V) is packed once per block.
// A GPU block is one pass; its row dims are block dims.
std::vector<bool> StreamCandidates(const ir::Chain& chain, const std::vector<int>& block_eligible,
                                   const hw::TargetDesc& target) {
  std::vector<bool> out(chain.dims.size(), false);
  for (size_t d = 0; d < chain.dims.size(); ++d) {
    if (Contains(block_eligible, static_cast<int>(d)) && target.backend == hw::Backend::kCuda) continue;
    int users = 0;
    for (const ir::Op& op : chain.ops) users += Contains(op.index, static_cast<int>(d)) || Contains(op.reduce, static_cast<int>(d));
    out[d] = users >= 2;
  }
  return out;
}

// Why a legal nest is pruned, or "" if it is kept. A nest whose
// intermediates live in registers stages only the GEMMs' operands in
// shared memory: its registers and shared memory are checked when it is
// compiled (a kernel that spills or does not fit is rejected), not by the
// intermediates and scratch rules.
const char* Pruned(const LoopNest& nest, const SpaceOptions& options, int64_t budget, double min_padding) {
  if (options.limit_intermediates && !nest.schedule.registers &&
      static_cast<double>(nest.intermediate_bytes) > options.intermediate_fraction * static_cast<double>(budget)) {
    return "intermediates";
  }
  if (options.limit_padding && nest.PaddingRatio() > (1 + options.max_padding) * min_padding) return "padding";
  if (options.limit_scratch && !nest.schedule.registers &&
      static_cast<double>(nest.scratch_bytes) * options.scratch_margin > budget) {
    return "scratch";
  }
  return "";
}

}  // namespace

std::vector<int> SplitOptions(const Schedule& schedule, const ir::Chain& chain, const hw::TargetDesc& target) {
  std::vector<int> out = {1};
  bool looped = false;  // a stream loop of more than one step
  for (int d : schedule.stream) looped = looped || schedule.tile[d] < chain.dims[d].extent;
  if (!looped) return out;
  if (target.backend == hw::Backend::kCpu) {
    for (int parts = 2; parts <= std::min(target.compute_units, 8); parts *= 2) out.push_back(parts);
    return out;
  }
  int64_t blocks = 1;
  for (int d : schedule.block) blocks *= (chain.dims[d].extent + schedule.tile[d] - 1) / schedule.tile[d];
  const int sd = schedule.stream.back();
  const int64_t steps = (chain.dims[sd].extent + schedule.tile[sd] - 1) / schedule.tile[sd];
  const int64_t units = std::max(hw::RatesFor(target).compute_units, 1);
  const int64_t min_steps = schedule.registers ? 1 : 4;
  for (int parts = 2; parts <= 32 && blocks * parts / 2 < units && min_steps * parts <= steps; parts *= 2) {
    out.push_back(parts);
  }
  return out;
}

std::vector<int64_t> TileOptions(const ir::Chain& chain, const hw::TargetDesc& target, int dim) {
  const int64_t extent = chain.dims[dim].extent;
  // Only a dim that can carry a loop is tiled: one a sum op loops over, a
  // block dim or a stream dim (a tile nothing loops over is the full
  // extent). Dims under 8 are not worth a loop (but see the CPU's block
  // dims below).
  const NestContext context = MakeNestContext(chain, target);
  bool loopable = Contains(context.block_eligible, dim) || StreamCandidates(chain, context.block_eligible, target)[dim];
  // A dim alone on an axis of an op's default mapping steps by that axis'
  // extent (at least 16).
  int64_t step = 0;
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    const ir::Op& op = chain.ops[o];
    if (op.kind != ir::OpKind::kSum) continue;
    loopable = loopable || Contains(op.index, dim) || Contains(op.reduce, dim);
    const std::optional<mapping::Mapping>& m = context.defaults[o];
    if (!m) continue;
    for (int a = 0; a < 3; ++a) {
      if (m->axes[a].size() == 1 && m->axes[a][0] == dim) {
        step = std::max<int64_t>({step, 16, m->intrinsic->Extent(a)});
      }
    }
  }
  std::set<int64_t> opts = {extent};
  if (loopable && extent >= 8) {
    for (int64_t t = step > 0 ? step : 1; t < extent; t *= 2) opts.insert(t);
  }
  // On a CPU, a block dim also splits evenly over the cores, once or twice
  // over (28 rows on 2 cores: 14 and 7, where 16 leaves one core 12; 4
  // heads: 2 and 1, too few for a loop of their own otherwise).
  if (target.backend == hw::Backend::kCpu && step == 0 && extent >= 2 && Contains(context.block_eligible, dim)) {
    const int64_t cores = std::max(target.compute_units, 1);
    for (int64_t parts = cores; parts <= 2 * cores; parts *= 2) {
      const int64_t t = (extent + parts - 1) / parts;
      if (parts > 1 && t < extent) opts.insert(t);
    }
  }
  return {opts.begin(), opts.end()};
}

double MinimalPaddingRatio(const ir::Chain& chain, const hw::TargetDesc& target) {
  auto nest = BuildLoopNest(chain, UntiledSchedule(chain), target);
  return nest.ok() ? nest->PaddingRatio() : 1;
}

absl::StatusOr<RankedSchedule> EvaluateSchedule(const ir::Chain& chain, const hw::TargetDesc& target,
                                                const Schedule& schedule, const SpaceOptions& options) {
  ASSIGN_OR_RETURN(LoopNest nest, BuildLoopNest(chain, schedule, target));
  const char* why =
      Pruned(nest, options, hw::ScratchBudget(target), MinimalPaddingRatio(NestChain(chain, nest), target));
  if (*why) return absl::FailedPreconditionError(absl::StrCat("pruned by the ", why, " rule"));
  return RankedSchedule{nest.schedule, RankingModel(options).Predict(nest, target, chain),
                        DescribeMappings(chain, nest)};
}

namespace {

// Stage counts, summed over the variants.
struct StageCounts {
  int64_t deduped = 0, legal = 0, after_intermediates = 0, after_padding = 0, after_scratch = 0;
};

// Enumerates, prunes and ranks one variant's schedules into `space`.
void EnumerateVariant(const Variant& variant, const hw::TargetDesc& target, const SpaceOptions& options,
                      int64_t budget, Space& space, StageCounts& counts) {
  const ir::Chain& chain = variant.chain;
  const int num_dims = static_cast<int>(chain.dims.size());
  const NestContext& context = variant.context;
  const std::vector<int>& block_eligible = context.block_eligible;
  const std::vector<bool> stream_ok = StreamCandidates(chain, block_eligible, target);

  std::vector<std::vector<int64_t>> tiles(num_dims);
  std::vector<std::vector<Placement>> places(num_dims);
  for (int d = 0; d < num_dims; ++d) {
    tiles[d] = TileOptions(chain, target, d);
    places[d] = {kOwn};
    if (Contains(block_eligible, d)) places[d].push_back(kBlock);
    if (stream_ok[d]) places[d].push_back(kStream);
  }

  std::vector<size_t> tile_pick(num_dims, 0);
  while (true) {
    std::vector<int64_t> tile(num_dims);
    std::vector<int> tiled;
    int64_t duplicates = 1;  // placements of untiled dims: all the same nest
    for (int d = 0; d < num_dims; ++d) {
      tile[d] = tiles[d][tile_pick[d]];
      if (tile[d] < chain.dims[d].extent) {
        tiled.push_back(d);
      } else {
        duplicates *= static_cast<int64_t>(places[d].size());
      }
    }
    std::vector<size_t> place_pick(tiled.size(), 0);
    while (true) {
      Schedule base = UntiledSchedule(chain);
      base.tile = tile;
      for (size_t i = 0; i < tiled.size(); ++i) {
        int d = tiled[i];
        Placement p = places[d][place_pick[i]];
        if (p == kBlock) base.block.push_back(d);
        if (p == kStream) base.stream.push_back(d);
      }
      // Own loops: each sum op loops over its tiled dims placed nowhere
      // else, output dims (in every order) before reduced dims.
      std::vector<std::vector<int>> outs(chain.ops.size()), reds(chain.ops.size());
      for (size_t o = 0; o < chain.ops.size(); ++o) {
        const ir::Op& op = chain.ops[o];
        if (op.kind != ir::OpKind::kSum) continue;
        for (size_t i = 0; i < tiled.size(); ++i) {
          if (places[tiled[i]][place_pick[i]] != kOwn) continue;
          if (Contains(op.index, tiled[i])) outs[o].push_back(tiled[i]);
          if (Contains(op.reduce, tiled[i])) reds[o].push_back(tiled[i]);
        }
        std::sort(outs[o].begin(), outs[o].end());
      }
      while (true) {
        Schedule s = base;
        for (size_t o = 0; o < chain.ops.size(); ++o) {
          s.own[o] = outs[o];
          s.own[o].insert(s.own[o].end(), reds[o].begin(), reds[o].end());
        }
        for (int split : SplitOptions(s, chain, target)) {
          s.split = split;
          space.stats.enumerated += duplicates;
          // Without rule 1 every equivalent copy goes on through the stages.
          const int64_t copies = options.dedupe ? 1 : duplicates;
          counts.deduped += copies;
          auto nest = BuildLoopNest(chain, s, target, &context);
          if (!nest.ok()) continue;
          counts.legal += copies;
          const std::string_view why = Pruned(*nest, options, budget, variant.min_padding);
          counts.after_intermediates += why != "intermediates" ? copies : 0;
          counts.after_padding += why.empty() || why == "scratch" ? copies : 0;
          if (why.empty()) {
            counts.after_scratch += copies;
            nest->schedule.regroup = variant.regroup;
            RankedSchedule r{nest->schedule, RankingModel(options).Predict(*nest, target, chain),
                             DescribeMappings(chain, *nest)};
            for (int64_t c = 0; c < copies; ++c) space.ranked.push_back(r);
          }
        }
        // Next order of own output loops (odometer over permutations).
        size_t o = 0;
        for (; o < outs.size(); ++o) {
          if (std::next_permutation(outs[o].begin(), outs[o].end())) break;
        }
        if (o == outs.size()) break;
      }
      size_t i = 0;
      while (i < place_pick.size() && ++place_pick[i] == places[tiled[i]].size()) place_pick[i++] = 0;
      if (i == place_pick.size()) break;
    }
    int d = 0;
    while (d < num_dims && ++tile_pick[d] == tiles[d].size()) tile_pick[d++] = 0;
    if (d == num_dims) break;
  }
}

}  // namespace

namespace {

// CUDA: the register-resident kernels (schedule "registers", loop_nest.h)
// of attention and GEMM chains, with their own tiles: 16 to 128 rows per
// block (small tiles fill the SMs on short sequences), a stream
// (key/value) tile of 32, 64 or 128, a warp for every 16 or 32 rows (at
// most 8), derived from the best-ranked schedules. They are
// ranked first, by the model among themselves: a shared-memory kernel of
// the same tiles moves the same global bytes but stages every
// intermediate through shared memory and synchronizes around each op
// (bench/RESULTS.md, "CUDA kernels by static measure": 48-144 SASS
// instructions and 720-1216 shared bytes per mma against 9.3 and 128).
// The pairs of mappings of the first and last GEMMs (alternatives and
// defaults) with one row dim and one column dim each, the same row dim:
// the register-resident kernel's form.
std::vector<std::pair<mapping::Mapping, mapping::Mapping>> SingleRowMappingPairs(const ir::Chain& chain,
                                                                               const hw::TargetDesc& target) {
  const int last = static_cast<int>(chain.ops.size()) - 1;
  if (last < 1) return {};
  auto single = [](const mapping::Mapping& m) { return m.axes[0].size() == 1 && m.axes[1].size() == 1; };
  std::vector<mapping::Mapping> firsts = Alternatives(chain, target, 0, 8), lasts = Alternatives(chain, target, last, 8);
  if (std::optional<mapping::Mapping> d = DefaultMappingFor(chain, 0, target)) firsts.push_back(*d);
  if (std::optional<mapping::Mapping> d = DefaultMappingFor(chain, last, target)) lasts.push_back(*d);
  std::vector<std::pair<mapping::Mapping, mapping::Mapping>> pairs;
  for (const mapping::Mapping& a : firsts) {
    for (const mapping::Mapping& b : lasts) {
      if (single(a) && single(b) && a.axes[0] == b.axes[0]) pairs.push_back({a, b});
    }
  }
  return pairs;
}

// `schedule` with each of `pairs` on its first and last GEMMs, every other
// dim of their points a block dim of tile 1: grouped-query attention's
// query heads then each take a block rather than a row dim. Empty for a
// regrouped schedule.
std::vector<Schedule> WithSingleRowMappings(const ir::Chain& chain, const Schedule& schedule,
                                            const std::vector<std::pair<mapping::Mapping, mapping::Mapping>>& pairs) {
  const int last = static_cast<int>(chain.ops.size()) - 1;
  if (!schedule.regroup.empty()) return {};
  std::vector<Schedule> out;
  for (const auto& [a, b] : pairs) {
    Schedule s = schedule;
    s.maps.assign(chain.ops.size(), {});
    s.maps[0] = a;
    s.maps[last] = b;
    for (int op : {0, last}) {
      const mapping::Mapping& m = op == 0 ? a : b;
      for (int d : chain.ops[op].index) {
        if (Contains(m.axes[0], d) || Contains(m.axes[1], d)) continue;
        s.tile[d] = 1;
        if (!Contains(s.block, d)) s.block.push_back(d);
      }
    }
    std::sort(s.block.begin(), s.block.end());
    out.push_back(Canonical(s, chain));
  }
  return out;
}

// The tile of the schedule's innermost stream loop (1 without one).
int64_t StreamTile(const Schedule& s) { return s.stream.empty() ? 1 : s.tile[s.stream.back()]; }

void RankRegisterResidentFirst(const ir::Chain& chain, const hw::TargetDesc& target, const SpaceOptions& options,
                               Space& space) {
  if (target.backend != hw::Backend::kCuda) return;
  struct Found {
    RankedSchedule ranked;
    int64_t rows_per_warp;
    int64_t bucket = 0;  // predictions in one bucket are within 1% of each other
  };
  std::vector<Found> found;
  std::set<std::string> seen;
  std::vector<Schedule> bases;
  std::optional<std::vector<std::pair<mapping::Mapping, mapping::Mapping>>> pairs;  // made when first needed
  for (size_t i = 0; i < std::min<size_t>(space.ranked.size(), 16); ++i) {
    if (std::optional<Schedule> base = RegisterResidentVariant(chain, space.ranked[i].schedule, target)) {
      bases.push_back(*base);
    } else if (i < 4) {
      if (!pairs) pairs = SingleRowMappingPairs(chain, target);
      for (const Schedule& s : WithSingleRowMappings(chain, space.ranked[i].schedule, *pairs)) {
        if (std::optional<Schedule> b = RegisterResidentVariant(chain, s, target)) bases.push_back(*b);
      }
    }
  }
  // When the best are all of another form (gemm_chain's regrouped nests
  // have no stream loop), the first further down that has one.
  for (size_t i = 16; bases.empty() && i < std::min<size_t>(space.ranked.size(), 4096); ++i) {
    if (!space.ranked[i].schedule.regroup.empty() || space.ranked[i].schedule.stream.empty()) continue;
    if (std::optional<Schedule> base = RegisterResidentVariant(chain, space.ranked[i].schedule, target)) {
      bases.push_back(*base);
    }
  }
  std::set<std::string> seen_bases;
  for (const Schedule& base : bases) {
    if (!seen_bases.insert(ScheduleToText(base, chain)).second) continue;
    absl::StatusOr<LoopNest> nest = BuildLoopNest(chain, base, target);
    if (!nest.ok()) continue;
    const int rows = nest->ops[0].gemm.rows[0], sd = nest->stream_dim;
    const ir::Chain& nested = NestChain(chain, *nest);
    const int64_t row_extent = nested.dims[rows].extent, stream_extent = nested.dims[sd].extent;
    for (int64_t row_tile : {16, 32, 64, 128}) {
      for (int64_t stream_tile : {32, 64, 128}) {
        if (stream_tile >= stream_extent) continue;  // no stream loop left
        Schedule s = base;
        s.tile[rows] = std::min(row_tile, row_extent);
        s.tile[sd] = stream_tile;
        if (s.tile[rows] < row_extent && std::find(s.block.begin(), s.block.end(), rows) == s.block.end()) {
          s.block.push_back(rows);
          std::sort(s.block.begin(), s.block.end());
        }
        const int64_t rows_pad = (s.tile[rows] + 15) / 16 * 16;
        // A grid short of one block per multiprocessor also tries its
        // stream loop split.
        const std::vector<int> splits = SplitOptions(s, nested, target);
        for (int64_t per_warp : {32, 16}) {
          s.warps = static_cast<int>(std::max<int64_t>(1, (rows_pad + per_warp - 1) / per_warp));
          if (s.warps > 8) continue;
          for (int parts : splits) {
            s.split = parts;
            absl::StatusOr<RankedSchedule> r = EvaluateSchedule(chain, target, s, options);
            if (r.ok() && seen.insert(ScheduleToText(r->schedule, chain)).second) {
              found.push_back({*std::move(r), rows_pad / s.warps});
            }
          }
        }
      }
    }
  }
  if (found.empty()) return;
  // The model cannot tell these launches apart (they move the same bytes
  // and do the same work): between predictions in one 1% bucket, more rows a warp
  // (each B fragment read from shared memory feeds two mma), then fewer
  // stream steps (each costs a pair of barriers and a softmax rescale).
  for (Found& f : found) {
    f.bucket = std::llround(std::log(std::max(f.ranked.prediction.t_estm_s, 1e-30)) / std::log(1.01));
  }
  std::stable_sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    if (a.bucket != b.bucket) return a.bucket < b.bucket;
    if (a.rows_per_warp != b.rows_per_warp) return a.rows_per_warp > b.rows_per_warp;
    return StreamTile(a.ranked.schedule) > StreamTile(b.ranked.schedule);
  });
  space.stats.register_resident = static_cast<int64_t>(found.size());
  std::vector<RankedSchedule> ranked;
  for (Found& f : found) ranked.push_back(std::move(f.ranked));
  for (RankedSchedule& r : space.ranked) {
    if (seen.insert(ScheduleToText(r.schedule, chain)).second) ranked.push_back(std::move(r));
  }
  space.ranked = std::move(ranked);
}

}  // namespace

absl::StatusOr<Space> BuildSpace(const ir::Chain& chain, const hw::TargetDesc& target, const SpaceOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  Space space;
  const int64_t budget = hw::ScratchBudget(target);
  // The chain as written and every regrouping of it, each enumerated alike.
  std::vector<Variant> variants;
  variants.push_back({{}, chain, MakeNestContext(chain, target), MinimalPaddingRatio(chain, target)});
  for (const ir::Regroup& r : ir::Regroupings(chain)) {
    absl::StatusOr<ir::Chain> regrouped = ir::ApplyRegroup(chain, r);
    if (!regrouped.ok()) continue;
    variants.push_back({r, *regrouped, MakeNestContext(*regrouped, target), MinimalPaddingRatio(*regrouped, target)});
  }
  StageCounts counts;
  for (const Variant& variant : variants) EnumerateVariant(variant, target, options, budget, space, counts);
  space.stats.stages = {{"1 dedupe (equivalent nests merged)", counts.deduped},
                        {"legal nests", counts.legal},
                        {"2 intermediates fit", counts.after_intermediates},
                        {"3 padding bounded", counts.after_padding},
                        {"4 scratch fits", counts.after_scratch}};
  std::stable_sort(space.ranked.begin(), space.ranked.end(), [](const RankedSchedule& a, const RankedSchedule& b) {
    return a.prediction.t_estm_s < b.prediction.t_estm_s;
  });
  AddMappingAlternatives(variants, target, options, budget, space);
  RankRegisterResidentFirst(chain, target, options, space);
  if (space.ranked.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no schedule survives pruning: ", space.stats.enumerated, " enumerated, ", counts.legal, " legal, ",
        counts.after_intermediates, " with intermediates within ", options.intermediate_fraction, " of ", budget,
        " bytes, ", counts.after_padding, " with bounded padding, ", counts.after_scratch,
        " fitting the scratch budget"));
  }
  space.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return space;
}

}  // namespace fusor::space
