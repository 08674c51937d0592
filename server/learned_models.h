// The learned cost models of a scheduler's targets (common/model/
// learned_model.h), trained on the tuning database's trusted candidate
// measurements and kept in it (cost_models), so that they outlive the
// scheduler and every task ranks with the model it started with.
//
// When a model is used: a target's model is trained again once it has
// `retrain_after` trusted measurements more than at the last try, and only
// when there is enough data (TrainOptions: at least 48 measurements of at
// least 3 workloads). It is then scored by leaving each workload with at
// least 8 measurements out of training in turn and ranking that
// workload's measurements; it replaces the analytical model for new tasks
// only when its mean Spearman rank correlation over at least two such
// workloads is higher than the analytical model's on the same data.
// Otherwise new tasks keep the model they had.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "common/hw/target.h"
#include "common/model/learned_model.h"
#include "server/db/tuning_db.h"

namespace fusor::server {

struct LearnOptions {
  bool enabled = true;  // false: every task ranks with the analytical model
  int retrain_after = 16;
  int min_held_out_samples = 8;
  model::TrainOptions train;
};

class LearnedModels {
 public:
  LearnedModels(db::TuningDb& db, LearnOptions options) : db_(db), options_(std::move(options)) {}

  // The model new tasks on the target rank with, and its id: (0, null) for
  // the analytical model, also when the stored one cannot be read (then
  // logged, and trained again).
  absl::StatusOr<std::pair<int64_t, std::shared_ptr<const model::CostModel>>> Current(const std::string& target_fp);
  // The model stored under `id` (null for 0); NOT_FOUND or DATA_LOSS when
  // it is missing or unreadable.
  absl::StatusOr<std::shared_ptr<const model::CostModel>> ById(int64_t id);
  // Trains the target's model again when it has enough new measurements
  // and adopts it when it ranks held-out workloads better (see above).
  // Says what it did, for the log.
  absl::StatusOr<std::string> MaybeTrain(const std::string& target_fp, const hw::TargetDesc& target);

 private:
  db::TuningDb& db_;
  const LearnOptions options_;
  std::mutex train_mu_;  // one training at a time
  std::mutex mu_;
  std::map<int64_t, std::shared_ptr<const model::LearnedModel>> by_id_;
  std::map<std::string, int64_t> current_;   // target -> id (0: analytical)
  std::map<std::string, int64_t> tried_at_;  // target -> training rows at the last try
};

}  // namespace fusor::server
