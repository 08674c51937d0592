#include "server/learned_models.h"

#include <map>

#include "absl/strings/str_format.h"
#include "common/ir/parse.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"
#include "server/scheduler.h"

namespace fusor::server {

absl::StatusOr<std::pair<int64_t, std::shared_ptr<const model::CostModel>>> LearnedModels::Current(
    const std::string& target_fp) {
  if (!options_.enabled) return std::pair<int64_t, std::shared_ptr<const model::CostModel>>{0, nullptr};
  int64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = current_.find(target_fp);
    if (it != current_.end()) id = it->second;
  }
  if (id == 0) {
    ASSIGN_OR_RETURN(std::optional<db::CostModelRow> latest, db_.LatestCostModel(target_fp));
    std::lock_guard<std::mutex> lock(mu_);
    // A model trained meanwhile wins over what the database said before it.
    auto [it, inserted] = current_.emplace(target_fp, latest ? latest->id : 0);
    if (inserted && latest) tried_at_.emplace(target_fp, latest->samples);
    id = it->second;
  }
  absl::StatusOr<std::shared_ptr<const model::CostModel>> m = ById(id);
  if (!m.ok()) {
    // A model this build cannot read (trained on other features, say) is
    // not used, and a new one is trained when there is data for it.
    Logger("scheduler")->warn("[target={}] {}; new tasks rank with the analytical model", target_fp,
                              m.status().ToString());
    std::lock_guard<std::mutex> lock(mu_);
    current_[target_fp] = 0;
    tried_at_[target_fp] = 0;
    return std::pair<int64_t, std::shared_ptr<const model::CostModel>>{0, nullptr};
  }
  return std::pair{id, *std::move(m)};
}

absl::StatusOr<std::shared_ptr<const model::CostModel>> LearnedModels::ById(int64_t id) {
  if (id == 0) return nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_id_.find(id);
    if (it != by_id_.end()) return it->second;
  }
  ASSIGN_OR_RETURN(db::CostModelRow row, db_.GetCostModel(id));
  auto m = model::LearnedModel::FromJson(row.model_json);
  if (!m.ok()) return absl::DataLossError(absl::StrCat("learned cost model ", id, ": ", m.status().message()));
  std::lock_guard<std::mutex> lock(mu_);
  return by_id_.emplace(id, *m).first->second;
}

absl::StatusOr<std::string> LearnedModels::MaybeTrain(const std::string& target_fp, const hw::TargetDesc& target) {
  if (!options_.enabled) return std::string();
  std::lock_guard<std::mutex> train_lock(train_mu_);
  RETURN_IF_ERROR(Current(target_fp).status());  // loads the stored model and its count
  ASSIGN_OR_RETURN(int64_t count, db_.CountTrainingRows(target_fp));
  {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t& tried = tried_at_[target_fp];
    if (count < tried + options_.retrain_after) return std::string();
    tried = count;
  }
  ASSIGN_OR_RETURN(std::vector<db::TrainingRow> rows, db_.TrainingRows(target_fp));
  std::map<std::string, absl::StatusOr<ir::Chain>> chains;
  std::vector<model::Sample> samples;
  int skipped = 0;
  for (const db::TrainingRow& r : rows) {
    auto it = chains.find(r.workload_key);
    if (it == chains.end()) {
      absl::StatusOr<db::WorkloadRow> w = db_.GetWorkload(r.workload_key);
      it = chains.emplace(r.workload_key, w.ok() ? ir::ParseChainJson(w->chain_json)
                                                 : absl::StatusOr<ir::Chain>(w.status()))
               .first;
    }
    if (!it->second.ok()) {
      ++skipped;
      continue;
    }
    hw::TargetDesc t = target;
    if (r.bandwidth_bytes_per_s > 0 && r.peak_flops > 0) {
      t.bandwidth_bytes_per_s = r.bandwidth_bytes_per_s;
      t.peak_flops = r.peak_flops;
    }
    // A schedule this engine no longer builds teaches nothing about it.
    auto sample = model::MakeSample(*it->second, r.schedule, t, r.median_s, r.workload_key);
    if (sample.ok()) {
      samples.push_back(std::move(*sample));
    } else {
      ++skipped;
    }
  }
  auto trained = model::LearnedModel::Train(samples, options_.train);
  if (!trained.ok()) return std::string(trained.status().message());
  double analytical = 0, learned = 0;
  int scored = 0;
  for (const model::HeldOut& h : model::LeaveOneGroupOut(samples, options_.train, options_.min_held_out_samples)) {
    if (!h.trained) continue;
    analytical += h.spearman_analytical;
    learned += h.spearman_learned;
    ++scored;
  }
  if (scored > 0) {
    analytical /= scored;
    learned /= scored;
  }
  const std::string scores =
      absl::StrFormat("%d measurements of %d workloads (%d skipped); held out, %d workloads rank with Spearman "
                      "%.2f (analytical %.2f)",
                      (*trained)->samples(), (*trained)->groups(), skipped, scored, learned, analytical);
  if (scored < 2 || learned <= analytical) return absl::StrCat("kept the model in use: ", scores);
  db::CostModelRow row;
  row.target_fp = target_fp;
  row.model_json = (*trained)->ToJson();
  row.samples = static_cast<int>(count);
  row.workloads = (*trained)->groups();
  row.spearman_analytical = analytical;
  row.spearman_learned = learned;
  row.created_ms = NowMs();
  ASSIGN_OR_RETURN(int64_t id, db_.InsertCostModel(row));
  std::lock_guard<std::mutex> lock(mu_);
  by_id_[id] = *trained;
  current_[target_fp] = id;
  return absl::StrCat("adopted learned model ", id, ": ", scores);
}

}  // namespace fusor::server
