#include "common/model/learned_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/hw/devices.h"
#include "common/space/loop_nest.h"

namespace fusor::model {
namespace {

using Json = nlohmann::json;

double SafeLog(double x) { return std::log(std::max(x, 1e-30)); }
double Positive(double x) { return std::max(x, 0.0); }

// Below this predicted time (seconds, all cores busy) a kernel is short:
// starting the cores is a real part of it.
constexpr double kShortKernelS = 20e-6;

// Solves (A + lambda I) x = b for a symmetric positive semi-definite A by
// Cholesky; lambda > 0 keeps it definite.
std::vector<double> SolveRidge(std::vector<std::vector<double>> a, std::vector<double> b, double lambda) {
  const size_t n = b.size();
  for (size_t i = 0; i < n; ++i) a[i][i] += lambda;
  for (size_t j = 0; j < n; ++j) {
    double d = a[j][j];
    for (size_t k = 0; k < j; ++k) d -= a[j][k] * a[j][k];
    a[j][j] = std::sqrt(std::max(d, 1e-12));
    for (size_t i = j + 1; i < n; ++i) {
      double s = a[i][j];
      for (size_t k = 0; k < j; ++k) s -= a[i][k] * a[j][k];
      a[i][j] = s / a[j][j];
    }
  }
  for (size_t i = 0; i < n; ++i) {  // L y = b
    for (size_t k = 0; k < i; ++k) b[i] -= a[i][k] * b[k];
    b[i] /= a[i][i];
  }
  for (size_t i = n; i-- > 0;) {  // L^T x = y
    for (size_t k = i + 1; k < n; ++k) b[i] -= a[k][i] * b[k];
    b[i] /= a[i][i];
  }
  return b;
}

std::vector<double> Ranks(const std::vector<double>& v) {
  std::vector<size_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
    for (size_t k = i; k <= j; ++k) r[idx[k]] = (i + j) / 2.0;
    i = j + 1;
  }
  return r;
}

// The measured time of the sample `score` ranks first, over the best measured.
double Top1OverBest(const std::vector<const Sample*>& group, const std::vector<double>& score) {
  size_t top = 0;
  double best = group[0]->measured_s;
  for (size_t i = 0; i < group.size(); ++i) {
    if (score[i] < score[top]) top = i;
    best = std::min(best, group[i]->measured_s);
  }
  return group[top]->measured_s / best;
}

}  // namespace

const std::vector<std::string>& FeatureNames() {
  static const std::vector<std::string> names = {
      "memory_share",       "short_log_alpha",  "log_padding",      "log_waves",        "short_fewer_blocks",
      "log_split",          "stream_loop",      "log_stream_steps", "scratch_over_l1",     "scratch_over_l2",
      "log_flops_per_call", "log_loads_reread", "log_stores_over_outputs", "scalar_share", "log_kernel_fill",
      "log_k_tile",         "log_tile_area",    "own_loops",        "registers",           "log_warps",
      "stages",             "partials_share",
  };
  return names;
}

std::vector<double> NestFeatures(const space::LoopNest& nest, const hw::TargetDesc& target, const ir::Chain& written,
                                 const Prediction& analytical) {
  const ir::Chain& chain = space::NestChain(written, nest);
  const double units = std::max(hw::RatesFor(target).compute_units, 1);
  const double blocks = static_cast<double>(std::max<int64_t>(nest.num_blocks, 1));
  const double dtype_bytes = ir::DTypeBytes(chain.dtype);
  double input_bytes = 0, output_bytes = 0;
  for (int t : chain.inputs) input_bytes += static_cast<double>(chain.tensors[t].NumElements()) * dtype_bytes;
  for (int t : chain.outputs) output_bytes += static_cast<double>(chain.tensors[t].NumElements()) * dtype_bytes;
  double loads = 0, stores = 0, partials = 0, calls = 0, gemm_flops = 0, scalar_time = 0, compute_time = 0;
  for (const space::Statement& s : nest.statements) {
    if (s.kind == space::StmtKind::kLoad && !s.partials) loads += s.bytes * s.executions;
    if (s.partials) partials += s.bytes * s.executions;
    if (s.kind == space::StmtKind::kStore) stores += s.bytes * s.executions;
    if (s.kind != space::StmtKind::kCompute) continue;
    const double t = s.flops * s.executions / std::max(s.rate, 1e-9);
    compute_time += t;
    if (s.op >= 0 && nest.ops[s.op].gemm.ok) {
      calls += s.executions;
      gemm_flops += s.flops * s.executions;
    } else {
      scalar_time += t;
    }
  }
  // Over the sum ops on an intrinsic, weighted by their accumulator's
  // size: how much of the micro-kernel's register block the tile fills,
  // its reduction depth and its area.
  double fill = 0, k_tile = 0, area = 0, weight = 0;
  int own_loops = 0;
  for (const space::OpNest& on : nest.ops) {
    own_loops += static_cast<int>(on.loops.size());
    if (!on.gemm.ok) continue;
    const double w = std::max(on.acc_floats, int64_t{1});
    const double mr = std::max(on.kernel.mr, 1), nr = std::max(on.kernel.nr, 1);
    const double rows = static_cast<double>(on.rows_tile), cols = static_cast<double>(on.cols_tile);
    fill += w * SafeLog(rows / (std::ceil(rows / mr) * mr) * cols / (std::ceil(cols / nr) * nr));
    k_tile += w * SafeLog(static_cast<double>(on.k_tile));
    area += w * SafeLog(rows * cols);
    weight += w;
  }
  if (weight > 0) {
    fill /= weight;
    k_tile /= weight;
    area /= weight;
  }
  const double scratch = static_cast<double>(std::max<int64_t>(nest.scratch_bytes, 1));
  const double l1 = static_cast<double>(std::max<int64_t>(target.l1d_bytes, 1));
  const double l2 = static_cast<double>(std::max<int64_t>(target.l2_bytes, target.l1d_bytes));
  const bool stream = nest.stream_dim >= 0;
  const double stream_steps =
      stream ? std::ceil(static_cast<double>(nest.trips[nest.stream_dim]) / std::max(nest.split, 1)) : 1;
  const double both = analytical.t_mem_s + analytical.t_comp_s;
  const bool cuda = target.backend == hw::Backend::kCuda;
  // A last wave that idles cores counts in full on a long kernel; on a
  // short one the cost of starting the other cores may outweigh it. The
  // correction sees the last wave only in proportion to how short the
  // kernel is, so that what short chains teach (one block is fastest)
  // cannot undo it on long ones.
  // (On a GPU, whose waves are another matter, the features are as they were.)
  const double shortness = cuda ? 1.0 : Positive(SafeLog(kShortKernelS / std::max(both, 1e-12)));
  return {
      both > 0 ? analytical.t_mem_s / both : 0,
      SafeLog(analytical.alpha) * shortness,
      SafeLog(nest.PaddingRatio()),
      Positive(SafeLog(blocks / units)),
      Positive(SafeLog(units / blocks)) * shortness,
      SafeLog(std::max(nest.split, 1)),
      stream ? 1.0 : 0.0,
      SafeLog(stream_steps),
      Positive(std::log2(scratch / l1)),
      Positive(std::log2(scratch / std::max(l2, 1.0))),
      calls > 0 ? SafeLog(gemm_flops / calls) : 0,
      input_bytes > 0 ? SafeLog(std::max(loads, input_bytes) / input_bytes) : 0,
      output_bytes > 0 ? SafeLog(std::max(stores, output_bytes) / output_bytes) : 0,
      compute_time > 0 ? scalar_time / compute_time : 0,
      fill,
      k_tile,
      area,
      static_cast<double>(own_loops),
      cuda && nest.schedule.registers ? 1.0 : 0.0,
      cuda ? std::log2(space::WarpsOf(nest.schedule)) : 0,
      cuda ? static_cast<double>(space::StagesOf(nest.schedule)) : 0,
      partials / std::max(loads + stores + partials, 1.0),
  };
}

absl::StatusOr<Sample> MakeSample(const ir::Chain& chain, const std::string& schedule_text,
                                  const hw::TargetDesc& target, double measured_s, const std::string& group) {
  auto schedule = space::ParseSchedule(schedule_text, chain);
  if (!schedule.ok()) return schedule.status();
  auto nest = space::BuildLoopNest(chain, *schedule, target);
  if (!nest.ok()) return nest.status();
  const Prediction p = model::Predict(*nest, target, chain);
  if (!(p.t_estm_s > 0) || !(measured_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("schedule '", schedule_text, "' has no positive prediction or time"));
  }
  return Sample{group, NestFeatures(*nest, target, chain, p), p.t_estm_s, measured_s};
}

absl::StatusOr<std::shared_ptr<const LearnedModel>> LearnedModel::Train(const std::vector<Sample>& samples,
                                                                       const TrainOptions& options) {
  const size_t d = FeatureNames().size();
  std::map<std::string, std::vector<const Sample*>> groups;
  for (const Sample& s : samples) {
    if (s.features.size() != d) return absl::InvalidArgumentError("a sample has the wrong number of features");
    groups[s.group].push_back(&s);
  }
  if (static_cast<int>(samples.size()) < options.min_samples || static_cast<int>(groups.size()) < options.min_groups) {
    return absl::FailedPreconditionError(absl::StrCat("not enough data to learn from: ", samples.size(),
                                                      " measurements of ", groups.size(), " workloads (needs ",
                                                      options.min_samples, " of ", options.min_groups, ")"));
  }
  auto model = std::make_shared<LearnedModel>();
  model->samples_ = static_cast<int>(samples.size());
  model->groups_ = static_cast<int>(groups.size());
  const double n = static_cast<double>(samples.size());
  model->mean_.assign(d, 0);
  model->scale_.assign(d, 1);
  model->low_ = samples[0].features;
  model->high_ = samples[0].features;
  for (const Sample& s : samples) {
    for (size_t j = 0; j < d; ++j) {
      model->mean_[j] += s.features[j] / n;
      model->low_[j] = std::min(model->low_[j], s.features[j]);
      model->high_[j] = std::max(model->high_[j], s.features[j]);
    }
  }
  for (size_t j = 0; j < d; ++j) {
    double var = 0;
    for (const Sample& s : samples) var += (s.features[j] - model->mean_[j]) * (s.features[j] - model->mean_[j]) / n;
    // A feature that never varies gets no weight (its centred values are 0).
    model->scale_[j] = var > 1e-18 ? std::sqrt(var) : 1;
  }
  // Normal equations over the samples centred within their workload.
  std::vector<std::vector<double>> a(d, std::vector<double>(d, 0));
  std::vector<double> b(d, 0);
  for (const auto& [name, members] : groups) {
    std::vector<double> zmean(d, 0);
    double ymean = 0;
    const double m = static_cast<double>(members.size());
    for (const Sample* s : members) {
      for (size_t j = 0; j < d; ++j) zmean[j] += (s->features[j] - model->mean_[j]) / model->scale_[j] / m;
      ymean += std::log(s->measured_s / s->analytical_s) / m;
    }
    std::vector<double> z(d);
    for (const Sample* s : members) {
      for (size_t j = 0; j < d; ++j) z[j] = (s->features[j] - model->mean_[j]) / model->scale_[j] - zmean[j];
      const double y = std::log(s->measured_s / s->analytical_s) - ymean;
      for (size_t j = 0; j < d; ++j) {
        b[j] += z[j] * y;
        for (size_t k = 0; k < d; ++k) a[j][k] += z[j] * z[k];
      }
    }
  }
  model->weights_ = SolveRidge(std::move(a), std::move(b), options.lambda);
  double residual = 0;
  for (const Sample& s : samples) residual += (std::log(s.measured_s / s.analytical_s) - model->Linear(s.features)) / n;
  model->bias_ = residual;
  if (!std::isfinite(model->bias_) ||
      !std::all_of(model->weights_.begin(), model->weights_.end(), [](double w) { return std::isfinite(w); })) {
    return absl::FailedPreconditionError("the measurements gave a model with non-finite weights");
  }
  return std::shared_ptr<const LearnedModel>(std::move(model));
}

double LearnedModel::Linear(const std::vector<double>& features) const {
  double y = 0;
  for (size_t j = 0; j < weights_.size() && j < features.size(); ++j) {
    y += weights_[j] * (std::clamp(features[j], low_[j], high_[j]) - mean_[j]) / scale_[j];
  }
  return y;
}

double LearnedModel::LogCorrection(const std::vector<double>& features) const {
  return std::clamp(bias_ + Linear(features), -3.0, 3.0);
}

Prediction LearnedModel::Predict(const space::LoopNest& nest, const hw::TargetDesc& target,
                                 const ir::Chain& chain) const {
  Prediction p = model::Predict(nest, target, chain);
  const double c = std::exp(LogCorrection(NestFeatures(nest, target, chain, p)));
  p.t_mem_s *= c;
  p.t_comp_s *= c;
  p.t_estm_s *= c;
  return p;
}

std::string LearnedModel::ToJson() const {
  Json j;
  j["kind"] = "ridge";
  j["features"] = FeatureNames();
  j["mean"] = mean_;
  j["scale"] = scale_;
  j["low"] = low_;
  j["high"] = high_;
  j["weights"] = weights_;
  j["bias"] = bias_;
  j["samples"] = samples_;
  j["groups"] = groups_;
  return j.dump();
}

absl::StatusOr<std::shared_ptr<const LearnedModel>> LearnedModel::FromJson(const std::string& text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("a learned model is not a JSON object");
  auto model = std::make_shared<LearnedModel>();
  try {
    if (j.at("kind").get<std::string>() != "ridge") return absl::InvalidArgumentError("not a ridge model");
    if (j.at("features").get<std::vector<std::string>>() != FeatureNames()) {
      return absl::InvalidArgumentError("the learned model was trained on other features");
    }
    model->mean_ = j.at("mean").get<std::vector<double>>();
    model->scale_ = j.at("scale").get<std::vector<double>>();
    model->low_ = j.at("low").get<std::vector<double>>();
    model->high_ = j.at("high").get<std::vector<double>>();
    model->weights_ = j.at("weights").get<std::vector<double>>();
    model->bias_ = j.at("bias").get<double>();
    model->samples_ = j.at("samples").get<int>();
    model->groups_ = j.at("groups").get<int>();
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("a learned model's JSON is malformed: ", e.what()));
  }
  const size_t d = FeatureNames().size();
  if (model->mean_.size() != d || model->scale_.size() != d || model->weights_.size() != d ||
      model->low_.size() != d || model->high_.size() != d ||
      std::any_of(model->scale_.begin(), model->scale_.end(), [](double s) { return !(s > 0); })) {
    return absl::InvalidArgumentError("a learned model's vectors do not match its features");
  }
  bool finite = std::isfinite(model->bias_);
  for (size_t j = 0; j < d; ++j) {
    finite = finite && std::isfinite(model->mean_[j]) && std::isfinite(model->scale_[j]) &&
             std::isfinite(model->weights_[j]) && std::isfinite(model->low_[j]) && std::isfinite(model->high_[j]) &&
             model->low_[j] <= model->high_[j];
  }
  if (!finite) return absl::InvalidArgumentError("a learned model has non-finite values or empty ranges");
  return std::shared_ptr<const LearnedModel>(std::move(model));
}

double Spearman(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.size() < 2) return 0;
  const std::vector<double> ra = Ranks(a), rb = Ranks(b);
  const double m = (static_cast<double>(a.size()) - 1) / 2;  // both ranks' mean
  double num = 0, da = 0, db = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    num += (ra[i] - m) * (rb[i] - m);
    da += (ra[i] - m) * (ra[i] - m);
    db += (rb[i] - m) * (rb[i] - m);
  }
  return da > 0 && db > 0 ? num / std::sqrt(da * db) : 0;
}

std::vector<HeldOut> LeaveOneGroupOut(const std::vector<Sample>& samples, const TrainOptions& options,
                                      int min_group_samples) {
  std::map<std::string, std::vector<const Sample*>> groups;
  for (const Sample& s : samples) groups[s.group].push_back(&s);
  std::vector<HeldOut> out;
  for (const auto& [name, members] : groups) {
    if (static_cast<int>(members.size()) < min_group_samples) continue;
    std::vector<Sample> rest;
    for (const Sample& s : samples) {
      if (s.group != name) rest.push_back(s);
    }
    auto model = LearnedModel::Train(rest, options);
    HeldOut h;
    h.group = name;
    h.samples = static_cast<int>(members.size());
    h.trained = model.ok();
    std::vector<double> measured, analytical, learned;
    for (const Sample* s : members) {
      measured.push_back(s->measured_s);
      analytical.push_back(s->analytical_s);
      learned.push_back(model.ok() ? s->analytical_s * std::exp((*model)->LogCorrection(s->features)) : s->analytical_s);
    }
    h.spearman_analytical = Spearman(analytical, measured);
    h.spearman_learned = Spearman(learned, measured);
    h.top1_analytical = Top1OverBest(members, analytical);
    h.top1_learned = Top1OverBest(members, learned);
    out.push_back(h);
  }
  return out;
}

}  // namespace fusor::model
