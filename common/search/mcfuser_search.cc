// MakeMcfuserSearch: model-ranked exhaustive or evolutionary exploration.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/search/search_strategy.h"
#include "common/ir/regroup.h"
#include "common/space/loop_nest.h"
#include "common/space/split.h"

namespace fusor::search {
namespace {

class McfuserSearch : public SearchStrategy {
 public:
  explicit McfuserSearch(const McfuserSearchOptions& options) : options_(options), rng_(options.seed) {
    options_.space.model = options_.cost_model.get();
  }

  absl::Status Initialize(const SearchTask& task) override {
    task_ = task;
    variants_.push_back({{}, *task.chain});
    for (const ir::Regroup& r : ir::Regroupings(*task.chain)) {
      absl::StatusOr<ir::Chain> regrouped = ir::ApplyRegroup(*task.chain, r);
      if (regrouped.ok()) variants_.push_back({r, std::move(*regrouped)});
    }
    auto space = space::BuildSpace(*task.chain, task.target, options_.space);
    if (!space.ok()) return space.status();
    space_ = std::move(*space);
    for (size_t i = 0; i < space_.ranked.size(); ++i) {
      const std::string text = space::ScheduleToText(space_.ranked[i].schedule, *task.chain);
      index_.emplace(text, static_cast<int>(i));
      texts_.push_back(text);
      // The budget spreads over tiling expressions and mappings by how each proved.
      const space::Schedule& schedule = space_.ranked[i].schedule;
      classes_.push_back((schedule.regroup.empty() ? "" : ir::RegroupToText(*task.chain, schedule.regroup) + " ") +
                         space::TilingExpression(schedule, *task.chain) + " " + space_.ranked[i].mappings);
    }
    proposed_.assign(space_.ranked.size(), false);
    if (options_.split_candidates > 0 && !space::SplitPoints(*task.chain).empty()) {
      split_room_ = std::min(options_.split_candidates, task.budget / 4);
    }
    return absl::OkStatus();
  }

  std::vector<CandidateSpec> NextBatch(int max_count) override {
    if (FusedDone()) {
      // Then the splits the model ranks best.
      if (!splits_made_) SplitCandidates();
      std::vector<CandidateSpec> batch;
      while (num_splits_proposed_ < static_cast<int>(splits_.size()) && static_cast<int>(batch.size()) < max_count) {
        batch.push_back(splits_[num_splits_proposed_++]);
      }
      return batch;
    }
    const int room = std::min(max_count, FusedBudget() - num_proposed_);
    if (room <= 0) return {};
    if (std::vector<CandidateSpec> seeds = Seeds(room); !seeds.empty()) return seeds;
    std::vector<int> pool;
    if (Exhaustive() || measured_.empty()) {
      pool = Unproposed(static_cast<size_t>(room) * 4 + options_.population);
    } else {
      pool = Evolve();
      std::vector<int> top = Unproposed(static_cast<size_t>(room) * 4 + options_.population);
      pool.insert(pool.end(), top.begin(), top.end());
    }
    std::sort(pool.begin(), pool.end(), [&](int a, int b) {
      double sa = Score(a), sb = Score(b);
      return sa != sb ? sa < sb : a < b;
    });
    pool.erase(std::unique(pool.begin(), pool.end()), pool.end());
    // A quarter of the batch (at least one) goes to other launches of the
    // best measured schedule, which the model cannot rank.
    std::vector<int> launches = LaunchVariants(std::max(1, room / 4));
    pool.insert(pool.begin(), launches.begin(), launches.end());
    // A batch spans tiling expressions: first the best of each class
    // scored within twice the best (the model ties schedules of one
    // expression that differ in ways it cannot rank, like tile sizes that
    // only move traffic between caches), then the rest by score.
    std::vector<CandidateSpec> batch;
    std::set<std::string> classes_taken;
    double best_score = 0;
    for (int i : pool) {
      if (!proposed_[i] && (best_score == 0 || Score(i) < best_score)) best_score = Score(i);
    }
    for (int pass = 0; pass < 2; ++pass) {
      for (int i : pool) {
        if (static_cast<int>(batch.size()) >= room) break;
        if (proposed_[i]) continue;
        if (pass == 0 && (Score(i) > 2 * best_score || !classes_taken.insert(classes_[i]).second)) continue;
        batch.push_back(Propose(i));
      }
    }
    return batch;
  }

  // Up to `room` of the seeds not proposed yet: from the ranked space, or
  // added to it when the space's pruning left them out but its rules
  // allow them.
  std::vector<CandidateSpec> Seeds(int room) {
    std::vector<CandidateSpec> batch;
    while (next_seed_ < options_.seeds.size() && static_cast<int>(batch.size()) < room) {
      const std::string& text = options_.seeds[next_seed_++];
      auto it = index_.find(text);
      if (it == index_.end()) {
        absl::StatusOr<space::Schedule> schedule = space::ParseSchedule(text, *task_.chain);
        if (!schedule.ok()) continue;
        absl::StatusOr<space::RankedSchedule> ranked =
            space::EvaluateSchedule(*task_.chain, task_.target, *schedule, options_.space);
        if (!ranked.ok()) continue;
        const std::string canonical = space::ScheduleToText(ranked->schedule, *task_.chain);
        it = index_.find(canonical);
        if (it == index_.end()) {
          it = index_.emplace(canonical, static_cast<int>(space_.ranked.size())).first;
          texts_.push_back(canonical);
          classes_.push_back(space::TilingExpression(ranked->schedule, *task_.chain) + " " + ranked->mappings);
          space_.ranked.push_back(*std::move(ranked));
          proposed_.push_back(false);
        }
      }
      const int i = it->second;
      if (!proposed_[i]) batch.push_back(Propose(i));
    }
    return batch;
  }

  // The ranked space's candidate `i`, marked proposed.
  CandidateSpec Propose(int i) {
    proposed_[i] = true;
    ++num_proposed_;
    CandidateSpec c;
    c.schedule = space_.ranked[i].schedule;
    c.schedule_text = texts_[i];
    c.mapping = space_.ranked[i].mappings;
    c.prediction = space_.ranked[i].prediction;
    return c;
  }

  void NotifyResults(const std::vector<MeasuredResult>& results) override {
    bool improved = false;
    for (const MeasuredResult& r : results) {
      auto it = index_.find(r.schedule_text);
      if (it == index_.end()) continue;
      const int i = it->second;
      const double predicted = space_.ranked[i].prediction.t_estm_s;
      // A failed candidate counts as ten times slower than predicted.
      const double ratio = r.ok && r.median_s > 0 && predicted > 0 ? r.median_s / predicted : 10.0;
      measured_.push_back({i, r.ok ? r.median_s : 0, ratio});
      auto& cls = class_ratios_[classes_[i]];
      cls.first += std::log(ratio);
      cls.second += 1;
      if (r.ok && (best_s_ == 0 || r.median_s < best_s_)) {
        best_s_ = r.median_s;
        improved = true;
      }
    }
    std::vector<double> logs;
    for (const Measured& m : measured_) logs.push_back(std::log(m.ratio));
    if (!logs.empty()) {
      std::nth_element(logs.begin(), logs.begin() + logs.size() / 2, logs.end());
      typical_log_ratio_ = logs[logs.size() / 2];
    }
    ++rounds_;
    stale_rounds_ = improved ? 0 : stale_rounds_ + 1;
    at_bound_ = AtTheConfidenceBound();
  }

  bool Done() const override {
    return FusedDone() && (split_room_ == 0 || (splits_made_ && num_splits_proposed_ >= static_cast<int>(splits_.size())));
  }

  space::SpaceStats Stats() const override { return space_.stats; }

 private:
  // What the search of fused schedules may propose: the budget less the
  // room kept for splits at the end.
  int FusedBudget() const { return task_.budget - split_room_; }

  bool FusedDone() const {
    return num_proposed_ >= FusedBudget() || num_proposed_ >= static_cast<int>(space_.ranked.size()) ||
           (rounds_ >= 2 && stale_rounds_ >= options_.patience) || at_bound_;
  }

  // The chain split in two at each split point, each part unfused or
  // fused, at least one fused. A fused part runs the best measured
  // schedule restricted to it (what was measured beats what the model
  // ranks), or else its own space's best-ranked one. The
  // combinations are ranked by the summed predictions, a fused part's
  // scaled by the model's typical error on this task (as Score scales
  // schedules not measured yet): the best split_room_ of them are proposed
  // after the fused search.
  void SplitCandidates() {
    splits_made_ = true;
    if (split_room_ <= 0) return;
    const std::string unfused = absl::StrCat(space::kUnfusedPrefix, options_.split_library);
    const Measured* best = BestMeasured();
    struct Way {
      std::string text;
      std::string mapping;  // DescribeMappings of a fused part, or the unfused text
      model::Prediction prediction;
      double score = 0;
    };
    std::vector<std::pair<std::pair<double, int>, CandidateSpec>> scored;  // ((score, kind), candidate)
    std::set<std::string> texts;
    for (int boundary : space::SplitPoints(*task_.chain)) {
      absl::StatusOr<space::ChainParts> parts = space::SplitChain(*task_.chain, boundary);
      if (!parts.ok()) continue;
      std::array<std::vector<Way>, 2> ways;
      for (int p = 0; p < 2; ++p) {
        const ir::Chain& part = parts->parts[p];
        absl::StatusOr<space::RankedSchedule> fused = absl::NotFoundError("");
        if (best != nullptr) {
          // A stream loop split among blocks must accumulate something; a
          // part where nothing does runs it as a loop, or over blocks.
          auto projected = space::ProjectSchedule(space_.ranked[best->index].schedule, *task_.chain, part);
          std::vector<space::Schedule> tries;
          if (projected.ok()) {
            tries.push_back(*projected);
            if (projected->split != 1) {
              tries.push_back(*projected);
              tries.back().split = 1;
            }
            if (!projected->stream.empty()) {
              tries.push_back(tries.back());
              space::Schedule& blocks = tries.back();
              blocks.split = 1;
              blocks.block.insert(blocks.block.end(), blocks.stream.begin(), blocks.stream.end());
              std::sort(blocks.block.begin(), blocks.block.end());
              blocks.stream.clear();
            }
          }
          for (size_t i = 0; i < tries.size() && !fused.ok(); ++i) {
            fused = space::EvaluateSchedule(part, task_.target, tries[i], options_.space);
          }
        }
        if (!fused.ok()) {
          auto space = space::BuildSpace(part, task_.target, options_.space);
          if (space.ok() && !space->ranked.empty()) fused = space->ranked[0];
        }
        if (fused.ok()) {
          ways[p].push_back({space::ScheduleToText(fused->schedule, part), fused->mappings, fused->prediction,
                             fused->prediction.t_estm_s * std::exp(typical_log_ratio_)});
        }
        const model::Prediction u = model::PredictUnfused(part, task_.target);
        ways[p].push_back({unfused, unfused, u, u.t_estm_s});
      }
      for (const Way& head : ways[0]) {
        for (const Way& tail : ways[1]) {
          if (head.text == unfused && tail.text == unfused) continue;  // the baseline, measured anyway
          CandidateSpec c;
          c.schedule_text = space::SplitToText(*task_.chain, boundary, {head.text, tail.text});
          if (!texts.insert(c.schedule_text).second) continue;
          c.mapping = absl::StrCat(head.mapping, " | ", tail.mapping);
          c.prediction.t_mem_s = head.prediction.t_mem_s + tail.prediction.t_mem_s;
          c.prediction.t_comp_s = head.prediction.t_comp_s + tail.prediction.t_comp_s;
          c.prediction.t_estm_s = head.prediction.t_estm_s + tail.prediction.t_estm_s;
          // Two predictions summed: the alpha that keeps t_estm = (t_mem + t_comp) x alpha.
          c.prediction.alpha = c.prediction.t_estm_s / (c.prediction.t_mem_s + c.prediction.t_comp_s);
          const int kind = (head.text != unfused ? 1 : 0) + (tail.text != unfused ? 2 : 0);
          scored.push_back({{head.score + tail.score, kind}, std::move(c)});
        }
      }
    }
    // The model's error differs between fused parts and library calls: as
    // a batch spans tiling expressions, the splits span which parts are
    // fused (head, tail, both), the best of each first, then by score.
    std::stable_sort(scored.begin(), scored.end(),
                     [](const auto& a, const auto& b) { return a.first.first < b.first.first; });
    std::set<int> kinds;
    std::vector<bool> taken(scored.size(), false);
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t i = 0; i < scored.size() && static_cast<int>(splits_.size()) < split_room_; ++i) {
        if (taken[i] || (pass == 0 && !kinds.insert(scored[i].first.second).second)) continue;
        taken[i] = true;
        splits_.push_back(scored[i].second);
      }
    }
  }

  bool Exhaustive() const { return static_cast<int>(space_.ranked.size()) <= options_.exhaustive_limit; }

  // The confidence bound (McfuserSearchOptions::stop_at_bound).
  bool AtTheConfidenceBound() const {
    // A GPU's launch variants of the best are made as the search goes and
    // the model cannot rank them: there the bound does not stop a search.
    if (!options_.stop_at_bound || task_.target.backend == hw::Backend::kCuda) return false;
    std::vector<double> logs;
    for (const Measured& m : measured_) {
      if (m.median_s > 0) logs.push_back(std::log(m.ratio));
    }
    if (rounds_ < 2 || logs.size() < 8 || best_s_ <= 0) return false;
    std::vector<double> sorted = logs;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    const double median = sorted[sorted.size() / 2];
    double square = 0;
    for (double l : logs) square += (l - median) * (l - median);
    const double spread = std::max(options_.min_error_spread, std::sqrt(square / static_cast<double>(logs.size())));
    const double bound = best_s_ * std::exp(2 * spread);
    for (size_t i = 0; i < proposed_.size(); ++i) {
      if (!proposed_[i] && Score(static_cast<int>(i)) < bound) return false;
    }
    return true;
  }

  // The model's prediction scaled by its tiling expression's measured
  // error (or the typical error, for expressions not measured yet).
  double Score(int i) const {
    auto it = class_ratios_.find(classes_[i]);
    const double log_ratio = it != class_ratios_.end() ? it->second.first / it->second.second : typical_log_ratio_;
    return space_.ranked[i].prediction.t_estm_s * std::exp(log_ratio);
  }

  // The first `count` unproposed schedules in model order, at most
  // `count` / 4 (and at least 4) of any one class, so that a class the
  // model ranks high with many tile variants does not crowd out the rest.
  std::vector<int> Unproposed(size_t count) const {
    std::vector<int> out;
    std::map<std::string, size_t> per_class;
    const size_t limit = std::max<size_t>(4, count / 4);
    for (size_t i = 0; i < proposed_.size() && out.size() < count; ++i) {
      if (!proposed_[i] && ++per_class[classes_[i]] <= limit) out.push_back(static_cast<int>(i));
    }
    return out;
  }

  // Up to `count` unproposed launches (intermediates in registers or not,
  // stages, warps, the stream loop's split) of the best measured schedule on a CUDA target, one
  // change at a time first, added to the space as they are made (those
  // BuildLoopNest refuses are skipped).
  std::vector<int> LaunchVariants(int count) {
    std::vector<int> out;
    if (task_.target.backend != hw::Backend::kCuda) return out;
    const Measured* best = BestMeasured();
    if (best == nullptr) return out;
    const space::Schedule parent = space_.ranked[best->index].schedule;
    const int warps = space::WarpsOf(parent), stages = space::StagesOf(parent);
    std::vector<space::Schedule> children;
    if (!parent.registers) {
      if (auto r = space::RegisterResidentVariant(*task_.chain, parent, task_.target)) children.push_back(*r);
    } else {
      children.push_back(parent);
      children.back().registers = false;
      children.back().stages = std::min(stages, 2);  // three stages need registers
      // In shared memory an online softmax does not split.
      if (!space::BuildLoopNest(*task_.chain, children.back(), task_.target).ok()) children.back().split = 1;
    }
    // 3 - stages flips 1 and 2 (from 3: 2); a third stage is tried after the warps.
    const int flipped = stages == 3 ? 2 : 3 - stages;
    for (const auto& [w, st] : {std::pair{warps, flipped}, std::pair{warps * 2, stages}, std::pair{warps / 2, stages},
                                std::pair{warps, 3}, std::pair{warps * 2, flipped}, std::pair{warps / 2, flipped}}) {
      if ((st == stages && w == warps) || w < 1 || w > 16) continue;
      children.push_back(parent);
      children.back().warps = w;
      children.back().stages = st;
    }
    // Its stream loop split in twice or half as many parts.
    for (const int split : {parent.split * 2, parent.split / 2}) {
      if (split < 1 || parent.stream.empty()) continue;
      children.push_back(parent);
      children.back().split = split;
    }
    for (const space::Schedule& child : children) {
      if (static_cast<int>(out.size()) >= count) break;
      const std::string text = space::ScheduleToText(child, *task_.chain);
      auto it = index_.find(text);
      int i = 0;
      if (it != index_.end()) {
        i = it->second;
      } else {
        auto ranked = space::EvaluateSchedule(*task_.chain, task_.target, child, options_.space);
        if (!ranked.ok()) continue;
        i = static_cast<int>(space_.ranked.size());
        space_.ranked.push_back(*ranked);
        index_.emplace(text, i);
        texts_.push_back(text);
        classes_.push_back(classes_[best->index]);
        proposed_.push_back(false);
      }
      if (!proposed_[i]) out.push_back(i);
    }
    return out;
  }

  // Children of the best measured schedules that are in the pruned space.
  std::vector<int> Evolve() {
    std::vector<Measured> parents = measured_;
    std::sort(parents.begin(), parents.end(), [](const Measured& a, const Measured& b) {
      double ta = a.median_s > 0 ? a.median_s : 1e30, tb = b.median_s > 0 ? b.median_s : 1e30;
      return ta != tb ? ta < tb : a.index < b.index;
    });
    parents.resize(std::min<size_t>(parents.size(), 4));
    std::vector<int> children;
    const int attempts = options_.population * 4;
    for (int a = 0; a < attempts && static_cast<int>(children.size()) < options_.population; ++a) {
      const space::Schedule& p = space_.ranked[parents[rng_() % parents.size()].index].schedule;
      space::Schedule child = (rng_() % 4 == 0 && parents.size() > 1)
                                  ? Crossover(p, space_.ranked[parents[rng_() % parents.size()].index].schedule)
                                  : Mutate(p);
      auto it = index_.find(space::ScheduleToText(child, *task_.chain));
      if (it != index_.end() && !proposed_[it->second]) children.push_back(it->second);
    }
    return children;
  }

  enum Place { kOwn, kBlock, kStream };

  Place PlaceOf(const space::Schedule& s, int d) const {
    if (std::find(s.block.begin(), s.block.end(), d) != s.block.end()) return kBlock;
    if (std::find(s.stream.begin(), s.stream.end(), d) != s.stream.end()) return kStream;
    return kOwn;
  }

  // The chain a schedule runs (the task's, or a regrouping of it).
  const ir::Chain& ChainOf(const ir::Regroup& regroup) const {
    for (const auto& [r, chain] : variants_) {
      if (r == regroup) return chain;
    }
    return *task_.chain;
  }

  // Rebuilds a schedule from per-dim tiles and places, own loops in chain
  // order (output dims, then reduced dims).
  space::Schedule Assemble(const std::vector<int64_t>& tile, const std::vector<Place>& place,
                           const ir::Regroup& regroup) const {
    const ir::Chain& chain = ChainOf(regroup);
    space::Schedule s = space::UntiledSchedule(chain);
    s.regroup = regroup;
    s.tile = tile;
    for (size_t d = 0; d < chain.dims.size(); ++d) {
      if (place[d] == kBlock) s.block.push_back(static_cast<int>(d));
      if (place[d] == kStream) s.stream.push_back(static_cast<int>(d));
    }
    for (size_t o = 0; o < chain.ops.size(); ++o) {
      const ir::Op& op = chain.ops[o];
      if (op.kind != ir::OpKind::kSum) continue;
      for (const std::vector<int>* dims : {&op.index, &op.reduce}) {
        std::vector<int> sorted = *dims;
        std::sort(sorted.begin(), sorted.end());
        for (int d : sorted) {
          if (place[d] == kOwn && tile[d] < chain.dims[d].extent) s.own[o].push_back(d);
        }
      }
    }
    return s;
  }

  space::Schedule Mutate(const space::Schedule& p) {
    const ir::Chain& chain = ChainOf(p.regroup);
    std::vector<int64_t> tile = p.tile;
    std::vector<Place> place(chain.dims.size());
    for (size_t d = 0; d < chain.dims.size(); ++d) place[d] = PlaceOf(p, static_cast<int>(d));
    const int d = static_cast<int>(rng_() % chain.dims.size());
    switch (rng_() % (variants_.size() > 1 ? 4 : 3)) {
      case 0: {  // a neighbouring tile size
        std::vector<int64_t> opts = space::TileOptions(chain, task_.target, d);
        auto at = std::find(opts.begin(), opts.end(), tile[d]);
        int64_t i = at - opts.begin() + (rng_() % 2 ? 1 : -1);
        if (i >= 0 && i < static_cast<int64_t>(opts.size())) tile[d] = opts[i];
        break;
      }
      case 1:  // another place for the loop
        place[d] = static_cast<Place>(rng_() % 3);
        break;
      case 2: {  // another order of an op's own output loops
        space::Schedule s = p;
        const size_t o = rng_() % chain.ops.size();
        if (s.own[o].size() >= 2) std::swap(s.own[o][0], s.own[o][1]);
        return s;
      }
      default:  // the same loops over another association order
        return Assemble(tile, place, variants_[rng_() % variants_.size()].first);
    }
    return Assemble(tile, place, p.regroup);
  }

  space::Schedule Crossover(const space::Schedule& a, const space::Schedule& b) {
    const ir::Chain& chain = ChainOf(a.regroup);
    std::vector<int64_t> tile(chain.dims.size());
    std::vector<Place> place(chain.dims.size());
    for (size_t d = 0; d < chain.dims.size(); ++d) {
      const space::Schedule& from = rng_() % 2 ? a : b;
      tile[d] = from.tile[d];
      place[d] = PlaceOf(from, static_cast<int>(d));
    }
    return Assemble(tile, place, a.regroup);
  }

  struct Measured {
    int index;
    double median_s;  // 0 when it failed
    double ratio;     // measured / predicted
  };

  // The fastest measurement so far, or null.
  const Measured* BestMeasured() const {
    const Measured* best = nullptr;
    for (const Measured& m : measured_) {
      if (m.median_s > 0 && (best == nullptr || m.median_s < best->median_s)) best = &m;
    }
    return best;
  }

  McfuserSearchOptions options_;
  SearchTask task_;
  std::vector<std::pair<ir::Regroup, ir::Chain>> variants_;  // the chain as written first
  space::Space space_;
  std::unordered_map<std::string, int> index_;
  std::vector<std::string> texts_;
  std::vector<std::string> classes_;
  std::vector<bool> proposed_;
  int num_proposed_ = 0;
  int split_room_ = 0;                 // candidates kept for splits at the end
  bool splits_made_ = false;           // SplitCandidates ran (once the fused search is done)
  std::vector<CandidateSpec> splits_;  // SplitCandidates, best first
  int num_splits_proposed_ = 0;
  size_t next_seed_ = 0;
  std::vector<Measured> measured_;
  std::map<std::string, std::pair<double, int>> class_ratios_;  // sum of log ratios, count
  double typical_log_ratio_ = 0;  // median over everything measured
  double best_s_ = 0;
  int rounds_ = 0;
  int stale_rounds_ = 0;
  bool at_bound_ = false;  // AtTheConfidenceBound after the last results
  std::mt19937_64 rng_;
};

}  // namespace

std::unique_ptr<SearchStrategy> MakeMcfuserSearch(const McfuserSearchOptions& options) {
  return std::make_unique<McfuserSearch>(options);
}

}  // namespace fusor::search
