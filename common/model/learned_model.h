// A cost model learned from measurements: the analytical t_estm
// (cost_model.h) corrected by a ridge regression on nest features,
//   t_learned = t_estm * exp(w . z(features) + b),
// where z standardizes each feature by the training set's mean and
// deviation. The regression fits log(measured / t_estm) after removing
// each workload's mean (of the target and of the features): a chain's
// overall level does not teach how its schedules rank, and a workload
// measured often must not pull the weights towards its own level; b is
// then the mean residual over every sample, so that times stay absolute.
//
// A feature is clipped to the range it had in training, and the
// correction to a factor of 20 either way: the search takes the minimum
// over a whole space, where a linear model's extrapolations would win.
//
// The features (NestFeatures) are what the analytical model leaves out or
// folds into one number: the shares of memory and compute, the last wave
// (on a CPU scaled by how short the kernel is: on a long one it stays as
// predicted),
// padding, blocks against cores, the stream loop (its steps and split),
// scratch against the caches, the FLOPs a micro-kernel call does, inputs
// re-read and outputs re-written, a split loop's partial sums, the scalar
// code's share, the tiles against the micro-kernel's register block, own
// loops, and on a GPU registers, warps and stages.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/cost_model.h"

namespace fusor::model {

// The features of a nest on a target (FeatureNames() says which), given
// the analytical model's prediction for it. Chain-agnostic: ratios and
// logarithms, never sizes in the chain's own units.
std::vector<double> NestFeatures(const space::LoopNest& nest, const hw::TargetDesc& target, const ir::Chain& chain,
                                 const Prediction& analytical);
const std::vector<std::string>& FeatureNames();

// One measured schedule: its workload (the group left out together in
// validation), features, and the analytical and measured times.
struct Sample {
  std::string group;
  std::vector<double> features;
  double analytical_s = 0;
  double measured_s = 0;
};
// The nest is rebuilt from `schedule_text`; INVALID_ARGUMENT when it no
// longer parses or builds (a schedule from another engine version).
absl::StatusOr<Sample> MakeSample(const ir::Chain& chain, const std::string& schedule_text,
                                  const hw::TargetDesc& target, double measured_s, const std::string& group);

struct TrainOptions {
  double lambda = 4.0;  // ridge penalty, in units of standardized samples
  // Enough data: at least this many samples from at least this many
  // workloads (below, Train answers FAILED_PRECONDITION).
  int min_samples = 48;
  int min_groups = 3;
};

class LearnedModel final : public CostModel {
 public:
  // FAILED_PRECONDITION when the samples are not enough data.
  static absl::StatusOr<std::shared_ptr<const LearnedModel>> Train(const std::vector<Sample>& samples,
                                                                   const TrainOptions& options = {});
  // The model ToJson wrote; INVALID_ARGUMENT when it is not one (or was
  // written for other features).
  static absl::StatusOr<std::shared_ptr<const LearnedModel>> FromJson(const std::string& text);
  std::string ToJson() const;

  const char* name() const override { return "learned"; }
  Prediction Predict(const space::LoopNest& nest, const hw::TargetDesc& target,
                     const ir::Chain& chain) const override;
  // log(t_learned / t_estm) for a sample's features.
  double LogCorrection(const std::vector<double>& features) const;
  int samples() const { return samples_; }
  int groups() const { return groups_; }

 private:
  // w . z of the features, clipped to their training range (no bias, not bounded).
  double Linear(const std::vector<double>& features) const;
  std::vector<double> mean_, scale_, weights_;
  std::vector<double> low_, high_;  // each feature's range in training: beyond it, clipped
  double bias_ = 0;
  int samples_ = 0, groups_ = 0;
};

// Spearman's rank correlation (ties share their mean rank); 0 when either
// side is constant or there are fewer than two values.
double Spearman(const std::vector<double>& a, const std::vector<double>& b);

// Leave one workload out: for each group with at least `min_group_samples`
// samples, a model trained on the other groups ranks its samples.
struct HeldOut {
  std::string group;
  int samples = 0;
  double spearman_analytical = 0, spearman_learned = 0;
  // The measured time of each model's top-1 over the best measured.
  double top1_analytical = 0, top1_learned = 0;
  bool trained = false;  // false: the other groups were not enough data (learned = analytical)
};
std::vector<HeldOut> LeaveOneGroupOut(const std::vector<Sample>& samples, const TrainOptions& options = {},
                                      int min_group_samples = 8);

}  // namespace fusor::model
