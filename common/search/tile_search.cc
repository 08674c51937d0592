// MakeModelRankedTileSearch: the simplest real search (tile enumeration,
// two pruning rules, model ranking).
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/search/search_strategy.h"
#include "common/space/loop_nest.h"

namespace fusor::search {
namespace {

std::vector<int64_t> TileOptions(int64_t extent, int64_t min_tile, int64_t max_tile) {
  std::set<int64_t> opts;
  for (int64_t t = 1; t <= std::min(extent, max_tile); t *= 2) {
    if (t >= std::min(min_tile, extent)) opts.insert(t);
  }
  opts.insert(extent);
  return {opts.begin(), opts.end()};
}

class ModelRankedTileSearch : public SearchStrategy {
 public:
  explicit ModelRankedTileSearch(const TileSearchOptions& options) : options_(options) {}

  absl::Status Initialize(const SearchTask& task) override {
    task_ = task;
    const ir::Chain& chain = *task.chain;
    kernel_ = hw::SelectCpuMicroKernel(task.target);
    mapping_ = DescribeMapping(chain, kernel_);
    const int64_t budget = hw::CpuScratchBudget(task.target);

    std::vector<int> block = space::FusableDims(chain);
    // Per dim, the tile sizes worth trying: small tiles for block dims
    // (they set the parallelism), at least a micro-kernel's worth otherwise.
    std::vector<std::vector<int64_t>> options(chain.dims.size());
    for (size_t d = 0; d < chain.dims.size(); ++d) {
      bool is_block = std::find(block.begin(), block.end(), static_cast<int>(d)) != block.end();
      options[d] = TileOptions(chain.dims[d].extent, is_block ? 1 : 16, is_block ? 256 : 1 << 30);
    }

    // Padding at the edges of full-extent tiles cannot be avoided; the
    // rule prunes schedules that pad much more than that.
    space::Schedule untiled = space::UntiledSchedule(chain);
    untiled.block_dims = block;
    auto floor_nest = space::BuildLoopNest(chain, untiled, kernel_);
    if (!floor_nest.ok()) return floor_nest.status();
    const double min_work = SumWork(chain, *floor_nest);

    int64_t pruned_scratch = 0, pruned_padding = 0;
    std::vector<int64_t> tile(chain.dims.size());
    std::vector<size_t> pick(chain.dims.size(), 0);
    while (true) {
      for (size_t d = 0; d < chain.dims.size(); ++d) tile[d] = options[d][pick[d]];
      ++stats_.total;
      space::Schedule schedule;
      schedule.block_dims = block;
      schedule.tile = tile;
      auto nest = space::BuildLoopNest(chain, schedule, kernel_);
      if (!nest.ok()) return nest.status();
      if (nest->scratch_bytes > budget) {
        ++pruned_scratch;
      } else if (SumWork(chain, *nest) > (1 + options_.max_padding) * min_work) {
        ++pruned_padding;
      } else {
        CandidateSpec c;
        c.schedule = schedule;
        c.schedule_text = space::ScheduleToText(schedule, chain);
        c.mapping = mapping_;
        c.prediction = model::Predict(*nest, task.target);
        ranked_.push_back(std::move(c));
      }
      size_t d = 0;
      while (d < pick.size() && ++pick[d] == options[d].size()) pick[d++] = 0;
      if (d == pick.size()) break;
    }
    stats_.pruned_by_rule = {{"scratch exceeds private cache", pruned_scratch},
                             {"excessive padding", pruned_padding}};
    stats_.after_pruning = static_cast<int64_t>(ranked_.size());
    if (ranked_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no schedule survives pruning: of ", stats_.total, " tilings ", pruned_scratch,
          " need more scratch than the target's private caches (", budget, " bytes) and ", pruned_padding,
          " pad more than ", options_.max_padding * 100, "% beyond the unavoidable"));
    }
    std::stable_sort(ranked_.begin(), ranked_.end(), [](const CandidateSpec& a, const CandidateSpec& b) {
      if (a.prediction.t_estm_s != b.prediction.t_estm_s) {
        return a.prediction.t_estm_s < b.prediction.t_estm_s;
      }
      return a.schedule_text < b.schedule_text;
    });
    return absl::OkStatus();
  }

  std::vector<CandidateSpec> NextBatch(int max_count) override {
    std::vector<CandidateSpec> batch;
    while (static_cast<int>(batch.size()) < max_count && next_ < ranked_.size() &&
           static_cast<int>(next_) < task_.budget) {
      batch.push_back(ranked_[next_++]);
    }
    return batch;
  }

  void NotifyResults(const std::vector<MeasuredResult>&) override {}

  bool Done() const override {
    return next_ >= ranked_.size() || static_cast<int>(next_) >= task_.budget;
  }

  SpaceStats Stats() const override { return stats_; }

 private:
  // FLOPs the sum ops compute, padding included.
  static double SumWork(const ir::Chain& chain, const space::LoopNest& nest) {
    double work = 0;
    for (const space::Statement& s : nest.statements) {
      if (s.kind == space::StmtKind::kCompute && chain.ops[s.op].kind == ir::OpKind::kSum) {
        work += s.flops * s.executions;
      }
    }
    return work;
  }

  TileSearchOptions options_;
  SearchTask task_;
  hw::CpuMicroKernel kernel_;
  std::string mapping_;
  std::vector<CandidateSpec> ranked_;
  size_t next_ = 0;
  SpaceStats stats_;
};

}  // namespace

std::unique_ptr<SearchStrategy> MakeModelRankedTileSearch(const TileSearchOptions& options) {
  return std::make_unique<ModelRankedTileSearch>(options);
}

std::string DescribeMapping(const ir::Chain& chain, const hw::CpuMicroKernel& kernel) {
  auto names = [&](const std::vector<int>& dims) {
    std::vector<std::string> n;
    for (int d : dims) n.push_back(chain.dims[d].name);
    return n.empty() ? std::string("-") : absl::StrJoin(n, ",");
  };
  std::string out = kernel.name;
  for (const ir::Op& op : chain.ops) {
    if (op.kind != ir::OpKind::kSum) continue;
    space::GemmForm g = space::AnalyzeGemmForm(op, chain);
    absl::StrAppend(&out, " ", chain.tensors[op.output].name);
    if (!g.ok) {
      out += "[scalar]";
      continue;
    }
    absl::StrAppend(&out, "[batch=", names(g.batch), " rows=", names(g.rows),
                    " cols=", names(g.cols), " k=", names(op.reduce), "]");
  }
  return out;
}

}  // namespace fusor::search
