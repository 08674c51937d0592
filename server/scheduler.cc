#include "server/scheduler.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/ir/parse.h"
#include "common/hw/devices.h"
#include "common/mapping/mapping.h"
#include "common/model/cost_model.h"
#include "common/space/loop_nest.h"
#include "common/space/schedule.h"
#include "common/space/split.h"
#include "common/util/log.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "common/util/text.h"
#include "common/util/timing.h"
#include "proto/wire/convert.h"
#include "proto/wire/grpc_status.h"
#include "worker/backend.h"

namespace fusor::server {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Scheduler::Task {
  db::TaskRow row;
  ir::Chain chain;  // canonical
  hw::TargetDesc target;
  std::unique_ptr<search::SearchStrategy> strategy;
  std::vector<db::CandidateRow> batch;  // the round being measured
  int issued = 0;
  int64_t version = 1;
  TaskStarted started;
  TuneProgress progress;
  std::optional<TuneResult> result;
  // This task's baseline jobs: one queued with the first candidates, so
  // that the baseline is measured among them; on a GPU also one with each
  // confirmation.
  std::vector<std::string> baseline_jobs;
  // The best candidate measured again at the end: the fastest of many
  // noisy medians is biased low, and a speedup quoted from it too high;
  // and one worker's number alone is never the best (see Advance).
  std::vector<std::string> confirm_jobs;
};

namespace {

std::shared_ptr<spdlog::logger> Log() { return Logger("scheduler"); }

using db::JobKind;
using db::JobState;
using db::MeasurementStatus;
using db::TaskState;

bool Finished(JobState state) { return state == JobState::kDone || state == JobState::kFailed; }

// Runs of a task's best candidate again before anything is cached.
constexpr size_t kConfirmAttempts = 3;

// What a task's measurements say of its best: the fastest trusted candidate
// measurement whose candidate no trusted confirmation contradicted, and the
// confirmation that agrees with it (medians within `max_spread` of the
// larger), if there is one yet.
struct BestOfTask {
  const db::MeasurementRow* candidate = nullptr;
  const db::MeasurementRow* confirmation = nullptr;
};

BestOfTask FindBest(const std::vector<db::MeasurementRow>& rows, double max_spread) {
  std::map<int64_t, const db::MeasurementRow*> fastest;  // candidate id -> its fastest trusted measurement
  for (const db::MeasurementRow& m : rows) {
    if (m.kind != JobKind::kCandidate || m.status != MeasurementStatus::kOk || !m.candidate_id) continue;
    const db::MeasurementRow*& f = fastest[*m.candidate_id];
    if (f == nullptr || m.median_s < f->median_s) f = &m;
  }
  std::map<int64_t, const db::MeasurementRow*> agreeing;
  std::set<int64_t> refuted;
  for (const db::MeasurementRow& m : rows) {
    if (m.kind != JobKind::kConfirm || m.status != MeasurementStatus::kOk || !m.candidate_id) continue;
    auto it = fastest.find(*m.candidate_id);
    if (it == fastest.end()) continue;
    const double a = it->second->median_s, b = m.median_s;
    if (std::abs(a - b) <= max_spread * std::max(a, b)) {
      agreeing[*m.candidate_id] = &m;
    } else {
      refuted.insert(*m.candidate_id);
    }
  }
  BestOfTask best;
  for (const auto& [id, m] : fastest) {
    if (refuted.count(id) == 0 && (best.candidate == nullptr || m->median_s < best.candidate->median_s)) {
      best.candidate = m;
    }
  }
  if (best.candidate != nullptr) {
    auto it = agreeing.find(*best.candidate->candidate_id);
    if (it != agreeing.end()) best.confirmation = it->second;
  }
  return best;
}

// What a baseline measurement ran, from its resources ({"baseline": ...}).
std::string BaselineKind(const std::string& resources_json) {
  const nlohmann::json j = nlohmann::json::parse(resources_json, nullptr, false);
  return j.is_object() && j.contains("baseline") && j["baseline"].is_string() ? j["baseline"].get<std::string>() : "";
}

// The baseline a CPU worker timed together with a confirmation (see
// worker/job.h), when its samples are there and within `max_spread`.
std::optional<std::pair<std::string, std::vector<double>>> BaselineBeside(const std::string& resources_json,
                                                                          double max_spread) {
  const nlohmann::json j = nlohmann::json::parse(resources_json, nullptr, false);
  if (!j.is_object() || !j.contains("beside") || !j["beside"].is_object()) return std::nullopt;
  const nlohmann::json& b = j["beside"];
  if (!b.contains("baseline") || !b["baseline"].is_string() || !b.contains("samples_s") || !b["samples_s"].is_array()) {
    return std::nullopt;
  }
  std::vector<double> samples;
  for (const nlohmann::json& x : b["samples_s"]) {
    if (!x.is_number() || !(x.get<double>() > 0)) return std::nullopt;
    samples.push_back(x.get<double>());
  }
  if (static_cast<int>(samples.size()) < kMinSamples || Summarize(samples).spread > max_spread) return std::nullopt;
  return std::make_pair(b["baseline"].get<std::string>(), std::move(samples));
}

// Of `rows`, the trusted measurement taken nearest `ms` (the later one of
// two as near); nullptr when none is trusted.
const db::MeasurementRow* NearestTrusted(const std::vector<db::MeasurementRow>& rows, int64_t ms) {
  const db::MeasurementRow* nearest = nullptr;
  for (const db::MeasurementRow& m : rows) {
    if (m.status != MeasurementStatus::kOk) continue;
    if (nearest == nullptr || std::abs(m.measured_ms - ms) <= std::abs(nearest->measured_ms - ms)) nearest = &m;
  }
  return nearest;
}

TaskStarted StartedOf(const db::TaskRow& row) {
  return {row.id, row.workload_key, row.target_fp, row.space_size, row.space_after_pruning, row.budget};
}

// The intrinsic of the first mapped op in a space::DescribeMappings text.
std::string FirstIntrinsic(const std::string& mappings) {
  const size_t eq = mappings.find('='), open = mappings.find('[');
  if (eq == std::string::npos || open == std::string::npos || open < eq) return "scalar";
  return mappings.substr(eq + 1, open - eq - 1);
}

MeasureOptions WithDefaults(MeasureOptions m) {
  if (m.warmup <= 0) m.warmup = 2;
  if (m.min_repeats <= 0) m.min_repeats = 5;
  if (m.max_repeats <= 0) m.max_repeats = 100;
  if (m.time_budget_s <= 0) m.time_budget_s = 0.3;
  if (m.timeout_s <= 0) m.timeout_s = 300;
  if (m.max_spread <= 0) m.max_spread = kMaxSpread;
  return m;
}

}  // namespace

Scheduler::Scheduler(SchedulerOptions options, std::optional<FileLock> lock, std::unique_ptr<db::TuningDb> db)
    : options_(std::move(options)), lock_(std::move(lock)), db_(std::move(db)), models_(*db_, options_.learn) {
  std::random_device rd;
  id_state_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(NowMs());
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerOptions& options) {
  // Two schedulers on one file would both resume its tasks and sweeps.
  std::optional<FileLock> lock;
  if (options.db_path != ":memory:" && !options.db_path.empty()) {
    auto held = FileLock::Acquire(options.db_path + ".lock");
    if (!held.ok() && !absl::IsFailedPrecondition(held.status())) {
      return absl::Status(held.status().code(),
                          absl::StrCat("the tuning database ", options.db_path, " cannot be created or locked (",
                                       held.status().message(),
                                       "); give --db a path in a directory this user can write"));
    }
    if (!held.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the tuning database ", options.db_path, " is in use by another fusor scheduler (", held.status().message(),
          "); run one scheduler per database and share it with --server, or use another --db"));
    }
    lock.emplace(std::move(*held));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<db::TuningDb> db, db::TuningDb::Open(options.db_path));
  if (options.db_max_mb > 0) RETURN_IF_ERROR(db->SetMaxBytes(options.db_max_mb << 20));
  SchedulerOptions opts = options;
  opts.measure = WithDefaults(opts.measure);
  std::unique_ptr<Scheduler> s(new Scheduler(std::move(opts), std::move(lock), std::move(db)));
  // Workers of a previous run count as lost until they heartbeat again.
  RETURN_IF_ERROR(s->db_->MarkLostWorkers(NowMs() + 1).status());
  RETURN_IF_ERROR(s->ResumeTasks());
  // Tasks start with what the database has taught: a database from before
  // learned models, or measured since the last training, trains now.
  ASSIGN_OR_RETURN(std::vector<db::TargetRow> targets, s->db_->ListTargets());
  for (const db::TargetRow& t : targets) s->train_wanted_.insert(t.fingerprint);
  s->TrainCostModels();
  s->reaper_ = std::thread([p = s.get()] { p->ReaperLoop(); });
  return s;
}

Scheduler::~Scheduler() {
  stop_ = true;
  {
    std::lock_guard<std::mutex> lock(reaper_mu_);
    reaper_cv_.notify_all();
  }
  if (reaper_.joinable()) reaper_.join();
  std::lock_guard<std::mutex> lock(mu_);
  task_cv_.notify_all();
  lease_cv_.notify_all();
}

std::string Scheduler::Salt() const {
  return options_.salt.empty() ? kEngineVersion : absl::StrCat(kEngineVersion, "+", options_.salt);
}

std::string Scheduler::NewId(const char* prefix) {
  std::lock_guard<std::mutex> lock(id_mu_);
  // splitmix64: unique within the process and unpredictable enough for ids.
  uint64_t z = (id_state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(z));
  return absl::StrCat(prefix, buf);
}

absl::StatusOr<hw::TargetDesc> Scheduler::TargetOf(const std::string& fp) {
  ASSIGN_OR_RETURN(db::TargetRow t, db_->GetTarget(fp));
  absl::StatusOr<hw::TargetDesc> desc = wire::TargetFromJson(t.description_json);
  if (!desc.ok()) return absl::DataLossError(absl::StrCat("target ", fp, ": ", desc.status().message()));
  return desc;
}

// ------------------------------------------------------------- clients ---

absl::StatusOr<PreparedRequest> Scheduler::Prepare(const ir::Chain& chain, const TargetSelector& selector) {
  // A fingerprint names one target, whatever its backend; without one the
  // backend defaults to the CPU.
  const bool any_backend = !selector.backend && !selector.fingerprint.empty();
  const std::string backend = worker::BackendFor(selector.backend.value_or(hw::Backend::kCpu)).name();
  ASSIGN_OR_RETURN(std::vector<db::TargetRow> targets, db_->ListTargets());
  ASSIGN_OR_RETURN(std::vector<std::string> alive_fps, db_->AliveTargets());
  std::set<std::string> alive(alive_fps.begin(), alive_fps.end());
  const db::TargetRow* chosen = nullptr;
  for (bool want_alive : {true, false}) {
    for (const db::TargetRow& t : targets) {
      if (!any_backend && t.backend != backend) continue;
      if (!selector.fingerprint.empty() && t.fingerprint != selector.fingerprint) continue;
      if (want_alive && !alive.count(t.fingerprint)) continue;
      if (!selector.arch.empty()) {
        absl::StatusOr<hw::TargetDesc> desc = wire::TargetFromJson(t.description_json);
        if (!desc.ok() || desc->arch != selector.arch) continue;
      }
      chosen = &t;
      break;
    }
    if (chosen) break;
  }
  if (chosen == nullptr) {
    std::string what = selector.fingerprint.empty() ? absl::StrCat("a ", backend, " target")
                                                    : absl::StrCat("target ", selector.fingerprint);
    if (!selector.fingerprint.empty() && !any_backend) absl::StrAppend(&what, " for backend ", backend);
    if (!selector.arch.empty()) absl::StrAppend(&what, " with arch ", selector.arch);
    return absl::FailedPreconditionError(
        absl::StrCat("no worker has registered ", what, "; start fusor-worker pointed at this scheduler"));
  }
  return PrepareFor(chain, chosen->fingerprint);
}

absl::StatusOr<PreparedRequest> Scheduler::PrepareFor(const ir::Chain& chain, const std::string& target_fp) {
  if (options_.max_ops > 0 && static_cast<int>(chain.ops.size()) > options_.max_ops) {
    return absl::InvalidArgumentError(absl::StrCat("chain '", chain.name, "' has ", chain.ops.size(),
                                                   " ops; this scheduler takes at most ", options_.max_ops,
                                                   " (--max-ops)"));
  }
  for (const ir::Tensor& t : chain.tensors) {
    double elements = 1;  // in double: the extents' product may not fit an int64
    for (int64_t e : t.shape) elements *= static_cast<double>(e);
    if (options_.max_tensor_elements > 0 && elements > static_cast<double>(options_.max_tensor_elements)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " of chain '", chain.name, "' has ",
                                                     absl::StrFormat("%.4g", elements),
                                                     " elements; this scheduler takes at most ",
                                                     options_.max_tensor_elements, " (--max-tensor-elements)"));
    }
  }
  PreparedRequest req;
  req.chain = chain;
  req.canonical = ir::Canonicalize(chain);
  req.target_fp = target_fp;
  ASSIGN_OR_RETURN(req.target, TargetOf(target_fp));
  return req;
}

int Scheduler::EffectiveBudget(int requested) const {
  return requested > 0 ? std::min(requested, options_.max_budget) : options_.default_budget;
}

absl::StatusOr<TuneResult> Scheduler::ResultFromBest(const std::string& key, const std::string& fp,
                                                     bool from_cache) {
  ASSIGN_OR_RETURN(std::optional<db::BestRow> best, db_->GetBest(key, fp, Salt()));
  if (!best) return absl::NotFoundError(absl::StrCat("no tuned kernel for workload ", key, " on target ", fp));
  ASSIGN_OR_RETURN(db::CandidateRow cand, db_->GetCandidate(best->candidate_id));
  ASSIGN_OR_RETURN(db::MeasurementRow meas, db_->GetMeasurement(best->measurement_id));
  ASSIGN_OR_RETURN(db::TaskRow task, db_->GetTask(best->task_id));
  ASSIGN_OR_RETURN(auto counts, db_->CountCandidateMeasurements(best->task_id));
  TuneResult r;
  r.task_id = best->task_id;
  r.from_cache = from_cache;
  r.workload_key = key;
  r.target_fp = fp;
  ASSIGN_OR_RETURN(r.target, TargetOf(fp));
  r.intrinsic = FirstIntrinsic(cand.mapping);
  const std::string vendor = space::UnfusedVendor(cand.schedule);
  r.best = std::move(cand);
  r.measured = std::move(meas);
  if (vendor.empty()) {
    RETURN_IF_ERROR(SetBaselineOfTask(best->task_id, r.measured, r));
  } else {
    RETURN_IF_ERROR(SetUnfusedResult(r.measured, vendor, r));
  }
  r.candidates_measured = static_cast<int>(counts.first);
  r.candidates_failed = static_cast<int>(counts.second);
  if (task.finished_ms) r.tuning_s = static_cast<double>(*task.finished_ms - task.created_ms) / 1000;
  return r;
}

absl::StatusOr<TuneResult> Scheduler::Lookup(const PreparedRequest& request) {
  ASSIGN_OR_RETURN(TuneResult r, ResultFromBest(request.canonical.key, request.target_fp, true));
  return Translate(r, request);
}

absl::StatusOr<std::shared_ptr<Scheduler::Answer>> Scheduler::CachedAnswer(
    const std::string& w, const std::function<absl::StatusOr<ir::Chain>()>& parse, const TargetSelector& selector) {
  const int backend = selector.backend ? static_cast<int>(*selector.backend) : -1;
  const std::string digest = Sha256Hex(absl::StrCat(w.size(), ":", w, backend, ":", selector.fingerprint.size(), ":",
                                                    selector.fingerprint, selector.arch));
  // Read before the database: a best record written meanwhile makes the
  // entry stale at once.
  const int64_t best_generation = db_->best_generation(), targets_generation = targets_generation_;
  {
    std::lock_guard<std::mutex> lock(answers_mu_);
    auto it = answers_.find(digest);
    if (it != answers_.end() && it->second->best_generation == best_generation &&
        it->second->targets_generation == targets_generation) {
      return it->second;
    }
  }
  ASSIGN_OR_RETURN(ir::Chain chain, parse());
  ASSIGN_OR_RETURN(PreparedRequest prepared, Prepare(chain, selector));
  auto answer = std::make_shared<Answer>();
  answer->best_generation = best_generation;
  answer->targets_generation = targets_generation;
  answer->prepared = std::make_shared<const PreparedRequest>(std::move(prepared));
  answer->result = Lookup(*answer->prepared);
  if (!answer->result.ok() && !absl::IsNotFound(answer->result.status())) return answer->result.status();
  std::lock_guard<std::mutex> lock(answers_mu_);
  if (answers_.size() >= kMaxCachedAnswers) {
    std::erase_if(answers_, [&](const auto& entry) {
      return entry.second->best_generation != best_generation ||
             entry.second->targets_generation != targets_generation;
    });
    if (answers_.size() >= kMaxCachedAnswers) answers_.clear();
  }
  answers_[digest] = answer;
  return answer;
}

const absl::StatusOr<CompileResult>& Scheduler::CompileAnswer(Answer& answer) const {
  std::call_once(answer.compile_once, [&] { answer.compile = BuildCompileResult(*answer.prepared, *answer.result); });
  return answer.compile;
}

namespace {

// `text`, a fused schedule of chain `from`, in the names of chain `to`:
// dim_map[u] is the dim of `from` that dim u of `to` is (-1: none), and
// tensor_map the same for tensors. `text` itself when it does not parse.
std::string TranslateFused(const std::string& text, const ir::Chain& from, const ir::Chain& to,
                           const std::vector<int>& dim_map, const std::vector<int>& tensor_map) {
  auto schedule = space::ParseSchedule(text, from);
  if (!schedule.ok()) return text;
  std::vector<int> dims(from.dims.size(), -1);
  for (size_t u = 0; u < dim_map.size(); ++u) {
    if (dim_map[u] >= 0) dims[dim_map[u]] = static_cast<int>(u);
  }
  std::vector<int> ops(from.ops.size(), -1);
  for (size_t o = 0; o < to.ops.size(); ++o) {
    const int t = tensor_map[to.ops[o].output];
    if (t >= 0) ops[from.tensors[t].producer] = static_cast<int>(o);
  }
  std::vector<int> tensors(from.tensors.size(), -1);
  for (size_t u = 0; u < tensor_map.size(); ++u) {
    if (tensor_map[u] >= 0) tensors[tensor_map[u]] = static_cast<int>(u);
  }
  space::Schedule remapped = space::RemapSchedule(*schedule, dims, ops, to, tensors);
  // A mapping's A side is its op's first factor, and the canonical form may
  // have put the factors the other way round: then the mapping swaps.
  auto from_run = space::ScheduledChain(from, *schedule);
  auto to_run = space::ScheduledChain(to, remapped);
  if (from_run.ok() && to_run.ok()) {
    for (size_t o = 0; o < from.ops.size(); ++o) {
      if (schedule->maps[o].intrinsic == nullptr || ops[o] < 0) continue;
      auto a = mapping::ViewOp(*from_run, static_cast<int>(o));
      auto b = mapping::ViewOp(*to_run, ops[o]);
      if (!a.ok() || !b.ok()) continue;
      const int first = a->a_side[0].tensor;
      const int first_to = first < static_cast<int>(tensors.size()) ? tensors[first] : -1;
      if (first_to != b->a_side[0].tensor) remapped.maps[ops[o]].swapped = !remapped.maps[ops[o]].swapped;
    }
  }
  return space::ScheduleToText(remapped, to);
}

}  // namespace

std::string Scheduler::TranslateSchedule(const std::string& canonical_schedule,
                                         const PreparedRequest& request) const {
  const ir::Chain& canonical = request.canonical.chain;
  const ir::Chain& user = request.chain;
  const std::vector<int>& dim_map = request.canonical.dim_map;
  const std::vector<int>& tensor_map = request.canonical.tensor_map;
  if (!space::IsSplitText(canonical_schedule)) {
    return TranslateFused(canonical_schedule, canonical, user, dim_map, tensor_map);
  }
  auto split = space::ParseSplit(canonical_schedule, canonical);
  if (!split.ok()) return canonical_schedule;
  int boundary = -1;
  for (size_t u = 0; u < tensor_map.size(); ++u) {
    if (tensor_map[u] == split->boundary) boundary = static_cast<int>(u);
  }
  auto parts = space::SplitChain(user, boundary);
  if (!parts.ok()) return canonical_schedule;
  std::array<std::string, 2> texts = split->texts;
  for (int p = 0; p < 2; ++p) {
    if (!space::UnfusedVendor(texts[p]).empty()) continue;
    const ir::Chain& from = split->chains.parts[p];
    const ir::Chain& to = parts->parts[p];
    std::vector<int> dims, tensors;
    for (const ir::Dim& d : to.dims) {
      const int u = user.FindDim(d.name);
      dims.push_back(u >= 0 && dim_map[u] >= 0 ? from.FindDim(canonical.dims[dim_map[u]].name) : -1);
    }
    for (const ir::Tensor& t : to.tensors) {
      const int u = user.FindTensor(t.name);
      tensors.push_back(u >= 0 && tensor_map[u] >= 0 ? from.FindTensor(canonical.tensors[tensor_map[u]].name) : -1);
    }
    texts[p] = TranslateFused(texts[p], from, to, dims, tensors);
  }
  return space::SplitToText(user, boundary, texts);
}

TuneResult Scheduler::Translate(const TuneResult& result, const PreparedRequest& request) const {
  TuneResult r = result;
  r.best.schedule = TranslateSchedule(result.best.schedule, request);
  if (!r.fused_schedule.empty()) r.fused_schedule = TranslateSchedule(result.fused_schedule, request);
  if (space::IsSplitText(r.best.schedule)) {
    auto split = space::ParseSplit(r.best.schedule, request.chain);
    if (split.ok()) r.best.mapping = space::SplitMappings(*split, request.target);
    return r;
  }
  auto parsed = space::ParseSchedule(r.best.schedule, request.chain);
  if (parsed.ok()) {
    auto nest = space::BuildLoopNest(request.chain, *parsed, request.target);
    if (nest.ok()) r.best.mapping = space::DescribeMappings(request.chain, *nest);
  }
  return r;
}

absl::StatusOr<CompileResult> Scheduler::BuildCompileResult(const PreparedRequest& request,
                                                            const TuneResult& result) const {
  const std::string& text = result.best.schedule;
  const worker::Backend& backend = worker::BackendFor(request.target.backend);
  if (!space::UnfusedVendor(text).empty() || space::IsSplitText(text)) {
    ASSIGN_OR_RETURN(worker::KernelAnswer kernel, backend.AnswerComposite(request.chain, text, request.target));
    return CompileResult{result, std::move(kernel)};
  }
  ASSIGN_OR_RETURN(space::Schedule schedule, space::ParseSchedule(text, request.chain));
  ASSIGN_OR_RETURN(space::LoopNest nest, space::BuildLoopNest(request.chain, schedule, request.target));
  ASSIGN_OR_RETURN(worker::KernelAnswer kernel,
                   backend.Answer(request.chain, nest, text, result.best.mapping, request.target));
  return CompileResult{result, std::move(kernel)};
}

absl::Status Scheduler::CheckQuota(const Caller& caller, int budget) {
  int tasks = 0, pending = 0;
  double soonest_s = 0;  // estimated seconds until the caller's first task ends
  const int64_t now = NowMs();
  for (const auto& [id, t] : tasks_) {
    if (t->row.state != TaskState::kRunning || t->row.client != caller.id) continue;
    ++tasks;
    const int measured = t->progress.measured + t->progress.failed;
    const int left = std::max(0, t->row.budget - measured);
    pending += left;
    // The task's own pace so far; half a minute before its first result.
    const double eta = measured > 0 ? (now - t->row.created_ms) / 1e3 / measured * left : 30;
    soonest_s = tasks == 1 ? eta : std::min(soonest_s, eta);
  }
  std::string over;
  if (options_.max_tasks_per_client > 0 && tasks >= options_.max_tasks_per_client) {
    over = absl::StrCat(tasks, tasks == 1 ? " task" : " tasks", " running (at most ", options_.max_tasks_per_client,
                        ")");
    NoteQuotaRefusal(Quota::kTasks);
  } else if (options_.max_candidates_per_client > 0 && pending + budget > options_.max_candidates_per_client) {
    over = absl::StrCat(pending, " candidates still to measure, and this task would add ", budget, " (at most ",
                        options_.max_candidates_per_client, ")");
    NoteQuotaRefusal(Quota::kCandidates);
  }
  if (over.empty()) return absl::OkStatus();
  const absl::Duration after = absl::Seconds(std::clamp(std::ceil(soonest_s), 1.0, 600.0));
  return wire::WithRetryAfter(
      absl::ResourceExhaustedError(absl::StrCat("client '", caller.name, "' has ", over,
                                                "; retry in about ", absl::FormatDuration(after),
                                                ", when one of its tasks should have finished")),
      after);
}

absl::StatusOr<Scheduler::TuneStart> Scheduler::StartTune(const PreparedRequest& request,
                                                         const TuneOptions& options, const Caller& caller,
                                                         bool counted) {
  const std::string& key = request.canonical.key;
  const std::string& fp = request.target_fp;
  TuneStart start;
  if (!options.force) {
    auto cached = Lookup(request);
    if (cached.ok()) {
      start.cached = *cached;
      return start;
    }
    if (!absl::IsNotFound(cached.status())) return cached.status();
  }
  const int budget = EffectiveBudget(options.budget);
  // Joins the running task for the key, if any; else checks the quota.
  auto join_or_check = [&]() -> absl::StatusOr<bool> {
    for (auto& [id, t] : tasks_) {
      if (t->row.state == TaskState::kRunning && t->row.workload_key == key && t->row.target_fp == fp &&
          t->row.salt == Salt()) {
        start.started = t->started;
        return true;
      }
    }
    if (counted) RETURN_IF_ERROR(CheckQuota(caller, budget));
    return false;
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(bool joined, join_or_check());
    if (joined) return start;
  }
  // The space is built without the lock: leases, reports and lookups go on.
  auto task = std::make_unique<Task>();
  task->row.id = NewId("t-");
  task->row.client = caller.id;
  task->row.workload_key = key;
  task->row.target_fp = fp;
  task->row.salt = Salt();
  task->row.state = TaskState::kRunning;
  task->row.budget = budget;
  task->row.batch_size = options_.batch_size;
  task->row.created_ms = NowMs();
  task->row.bandwidth_bytes_per_s = request.target.bandwidth_bytes_per_s;
  task->row.peak_flops = request.target.peak_flops;
  task->chain = request.canonical.chain;
  task->target = request.target;
  ASSIGN_OR_RETURN(auto model, models_.Current(fp));
  task->row.cost_model_id = model.first;
  task->strategy = search::MakeMcfuserSearch(SearchOptions(*task, std::move(model.second)));
  RETURN_IF_ERROR(task->strategy->Initialize({&task->chain, task->target, budget}));
  const space::SpaceStats stats = task->strategy->Stats();
  task->row.space_size = stats.enumerated;
  task->row.space_after_pruning = stats.stages.back().remaining;

  std::unique_lock<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(bool joined, join_or_check());  // another request may have started it meanwhile
  if (joined) return start;
  RETURN_IF_ERROR(db_->UpsertWorkload({key, request.chain.name, request.canonical.text,
                                       ir::ChainToJson(request.canonical.chain)},
                                      task->row.created_ms));
  RETURN_IF_ERROR(db_->InsertTask(task->row));
  RETURN_IF_ERROR(QueueBaseline(*task, task->row.created_ms));
  task->started = StartedOf(task->row);
  task->progress.budget = budget;
  Log()->info("[task={}] started for {}: workload {} ({}), target {}, space {} -> {} after pruning ({:.2f} s), "
              "budget {}",
              task->row.id, caller.name, key, request.chain.name, fp, stats.enumerated,
              stats.stages.back().remaining, stats.seconds, budget);
  Task& t = *task;
  tasks_[task->row.id] = std::move(task);
  RETURN_IF_ERROR(Advance(t));
  lease_cv_.notify_all();
  start.started = t.started;
  return start;
}

absl::StatusOr<TaskSnapshot> Scheduler::WaitForTask(const std::string& task_id, int64_t after_version,
                                                    absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = tasks_.find(task_id);
  if (it == tasks_.end()) {
    lock.unlock();
    ASSIGN_OR_RETURN(db::TaskRow row, db_->GetTask(task_id));
    TaskSnapshot snap;
    snap.version = 1;
    snap.state = row.state;
    snap.error = row.error;
    snap.started = StartedOf(row);
    if (row.state == TaskState::kDone) {
      ASSIGN_OR_RETURN(snap.result, ResultFromBest(row.workload_key, row.target_fp, false));
    }
    return snap;
  }
  Task* task = it->second.get();
  auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(timeout);
  task_cv_.wait_until(lock, deadline, [&] { return task->version > after_version || stop_; });
  TaskSnapshot snap;
  snap.version = task->version;
  snap.state = task->row.state;
  snap.started = task->started;
  snap.progress = task->progress;
  snap.result = task->result;
  snap.error = task->row.error;
  return snap;
}

// ------------------------------------------------------------- workers ---

absl::StatusOr<Registration> Scheduler::Register(const std::string& name, const hw::TargetDesc& desc) {
  if (desc.compute_units <= 0) return absl::InvalidArgumentError("register: target.compute_units must be positive");
  if (absl::Status st = name.empty() ? absl::OkStatus() : CheckName(name, "worker"); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("register: ", st.message()));
  }
  // What the target says of itself is listed and logged: bounded, and
  // printable (no line breaks or terminal escapes).
  if (desc.isa_features.size() > 64) return absl::InvalidArgumentError("register: more than 64 target.isa_features");
  std::vector<std::string> texts = {desc.arch, desc.device_name, desc.compiler};
  texts.insert(texts.end(), desc.isa_features.begin(), desc.isa_features.end());
  for (const std::string& text : texts) {
    if (absl::Status st = CheckLabel(text, "target field"); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("register: ", st.message()));
    }
  }
  const std::string fingerprint = hw::TargetFingerprint(desc);
  ASSIGN_OR_RETURN(std::string json, wire::TargetToJson(desc));
  const int64_t now = NowMs();
  RETURN_IF_ERROR(db_->UpsertTarget({fingerprint, worker::BackendFor(desc.backend).name(), json, now}, now));
  std::random_device random;
  std::string secret;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&secret, absl::Hex(random(), absl::kZeroPad8));
  db::WorkerRow w;
  w.id = NewId("w-");
  w.secret_hash = Sha256Hex(secret);
  w.name = name.empty() ? w.id : name;
  w.target_fp = fingerprint;
  w.state = db::WorkerState::kAlive;
  w.registered_ms = now;
  w.last_seen_ms = now;
  RETURN_IF_ERROR(db_->InsertWorker(w));
  targets_generation_++;
  Log()->info("[worker={}] registered '{}' with target {} ({}, {} units, W={:.1f} GB/s, P={:.1f} GFLOP/s)", w.id,
              w.name, w.target_fp, desc.arch, desc.compute_units, desc.bandwidth_bytes_per_s / 1e9,
              desc.peak_flops / 1e9);
  return Registration{{w.id, secret}, w.target_fp};
}

absl::StatusOr<db::WorkerRow> Scheduler::Authenticate(const std::string& worker_id, const std::string& secret,
                                                     absl::string_view call) {
  ASSIGN_OR_RETURN(db::WorkerRow worker, db_->GetWorker(worker_id));
  // Compares hashes: the time taken tells nothing about the secret.
  const std::string hash = Sha256Hex(secret);
  unsigned char diff = hash.size() != worker.secret_hash.size();
  for (size_t i = 0; i < hash.size() && i < worker.secret_hash.size(); ++i) diff |= hash[i] ^ worker.secret_hash[i];
  if (diff != 0 || secret.empty()) {
    Log()->warn("[worker={}] {} refused: the worker secret does not match its registration", Echo(worker_id),
                std::string(call));
    return absl::PermissionDeniedError(absl::StrCat(
        call, ": the worker secret does not match the registration of worker ", Echo(worker_id),
        "; a worker acts only under the id and secret its own Register returned (register again)"));
  }
  {
    // Heard from, even where the database cannot record it (a full disk):
    // the reaper marks no worker lost that called since its cutoff.
    std::lock_guard<std::mutex> lock(contact_mu_);
    contact_ms_[worker_id] = NowMs();
  }
  return worker;
}

absl::StatusOr<bool> Scheduler::Heartbeat(const WorkerCredentials& who, const std::vector<std::string>& lease_ids) {
  const int64_t now = NowMs();
  auto worker = Authenticate(who.worker_id, who.secret, "heartbeat");
  if (absl::IsNotFound(worker.status())) return false;
  RETURN_IF_ERROR(worker.status());
  RETURN_IF_ERROR(db_->TouchWorker(who.worker_id, now));
  if (worker->state != db::WorkerState::kAlive) targets_generation_++;  // back from lost
  RETURN_IF_ERROR(db_->ExtendLeases(who.worker_id, lease_ids, now + absl::ToInt64Milliseconds(options_.lease)));
  return true;
}

absl::StatusOr<std::vector<LeasedJob>> Scheduler::Lease(const WorkerCredentials& who, int max_jobs,
                                                        absl::Duration wait, const std::function<bool()>& cancelled) {
  ASSIGN_OR_RETURN(db::WorkerRow worker, Authenticate(who.worker_id, who.secret, "lease"));
  RETURN_IF_ERROR(db_->TouchWorker(worker.id, NowMs()));
  if (worker.state != db::WorkerState::kAlive) targets_generation_++;  // back from lost
  max_jobs = std::clamp(max_jobs, 1, 16);
  const auto deadline = std::chrono::steady_clock::now() +
                        absl::ToChronoMilliseconds(std::clamp(wait, absl::ZeroDuration(), absl::Seconds(10)));
  std::vector<LeasedJob> leased;
  while (true) {
    const int64_t now = NowMs();
    ASSIGN_OR_RETURN(std::vector<db::JobRow> jobs,
                     db_->LeaseJobs(worker.id, worker.target_fp, max_jobs, now,
                                    now + absl::ToInt64Milliseconds(options_.lease), [this] { return NewId("l-"); }));
    if (!jobs.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const db::JobRow& j : jobs) {
        auto it = tasks_.find(j.task_id);
        if (it == tasks_.end() || it->second->row.state != TaskState::kRunning) {
          // Not expected (finishing a task fails its open jobs): drop it.
          Log()->error("[task={} job={}] leased a job of a task that is not running; failing it", j.task_id, j.id);
          RETURN_IF_ERROR(db_->FailOpenJobs(j.task_id, NowMs()));
          continue;
        }
        LeasedJob& job = leased.emplace_back(LeasedJob{j, it->second->chain, std::nullopt});
        if (j.candidate_id) {
          ASSIGN_OR_RETURN(job.candidate, db_->GetCandidate(*j.candidate_id));
        }
        Log()->debug("[task={} job={} worker={}] leased ({}, attempt {})", j.task_id, j.id, worker.id,
                     std::string(db::Name(j.kind)), j.attempts);
      }
      if (!leased.empty()) return leased;
    }
    if (std::chrono::steady_clock::now() >= deadline || (cancelled && cancelled()) || stop_) return leased;
    std::unique_lock<std::mutex> lock(mu_);
    lease_cv_.wait_for(lock, std::min<std::chrono::steady_clock::duration>(
                                 deadline - std::chrono::steady_clock::now(), std::chrono::milliseconds(200)));
  }
}

absl::StatusOr<ReportReceipt> Scheduler::Report(const JobReport& report) {
  const std::string& worker_id = report.worker.worker_id;
  RETURN_IF_ERROR(Authenticate(worker_id, report.worker.secret, "report").status());
  ASSIGN_OR_RETURN(db::JobRow job, db_->GetJob(report.job_id));
  ASSIGN_OR_RETURN(db::TaskRow task_row, db_->GetTask(job.task_id));
  db::MeasurementRow m = report.measurement;
  m.job_id = job.id;
  m.workload_key = task_row.workload_key;
  m.worker_id = worker_id;
  // The spread from the samples themselves, whatever the worker says: an
  // ok measurement beyond the bound is noisy (an older worker's, say).
  const SampleStats stats = Summarize(m.samples_s);
  m.spread = stats.spread;
  m.measured_ms = NowMs();
  if (m.status == MeasurementStatus::kOk && (m.samples_s.empty() || m.median_s <= 0)) {
    return absl::InvalidArgumentError("report: an ok measurement needs samples and a positive median");
  }
  const bool timed = m.status == MeasurementStatus::kOk || m.status == MeasurementStatus::kNoisy;
  if (timed && !m.samples_s.empty() && !(std::abs(m.median_s - stats.median) <= 1e-9 * stats.median)) {
    return absl::InvalidArgumentError(absl::StrCat("report: the median ", m.median_s, " s is not the median of the ",
                                                   m.samples_s.size(), " samples reported (", stats.median,
                                                   " s); nothing was recorded"));
  }
  // A time below what the chain needs on any such device is no measurement
  // (a broken or forged report): recorded as an invalid result, so that it
  // is never the best, and counted against the worker.
  std::string implausible;
  if (timed) {
    const double floor_s = ImplausibleBelowS(job.task_id);
    if (m.median_s < floor_s) {
      implausible = absl::StrCat("implausible: a median of ", m.median_s, " s is under ", floor_s,
                                 " s, the least the chain can take on this target (its FLOPs at the most any such "
                                 "device computes, or its bytes beyond the caches at the most any moves)");
      m.status = MeasurementStatus::kInvalidResult;
      m.error = implausible;
    }
  }
  if (m.status == MeasurementStatus::kOk && m.spread > options_.measure.max_spread) {
    m.status = MeasurementStatus::kNoisy;
    m.error = absl::StrCat("the samples' spread (p90 - p10) / median is ", m.spread, " (at most ",
                           options_.measure.max_spread, " is trusted)");
  }
  ASSIGN_OR_RETURN(db::RecordResult rec, db_->RecordMeasurement(report.lease_id, m));
  if (rec.outcome == db::ReportOutcome::kDuplicate) {
    Log()->info("[task={} job={}] duplicate report from {} ignored", job.task_id, job.id, worker_id);
    return ReportReceipt::kDuplicate;
  }
  if (rec.outcome == db::ReportOutcome::kNotYourLease) {
    Log()->warn("[task={} job={}] report from worker {} refused: the lease is worker {}'s", job.task_id, job.id,
                worker_id, rec.job.worker_id);
    return absl::PermissionDeniedError(absl::StrCat("report: lease ", report.lease_id, " of job ", job.id,
                                                    " is held by worker ", rec.job.worker_id, ", not by worker ",
                                                    worker_id, "; nothing was recorded"));
  }
  if (rec.outcome == db::ReportOutcome::kStaleLease) {
    return absl::FailedPreconditionError(absl::StrCat(
        "report: lease ", report.lease_id, " of job ", job.id, " is no longer valid: ",
        rec.job.state == JobState::kQueued ? "it expired and the job was requeued"
        : Finished(rec.job.state)          ? "the job was finished under another lease"
                                           : absl::StrCat("the job is under another lease now (worker ",
                                                          rec.job.worker_id, "'s)"),
        "; nothing was recorded"));
  }
  if (!implausible.empty()) {
    {
      std::lock_guard<std::mutex> lock(implausible_mu_);
      ++implausible_[worker_id];
    }
    Log()->warn("[task={} job={} worker={}] {} report refused: {}", job.task_id, job.id, worker_id,
                std::string(db::Name(job.kind)), implausible);
  }
  const bool ok = m.status == MeasurementStatus::kOk;
  Log()->info("[task={} job={} worker={}] {} {}: {}{}", job.task_id, job.id, worker_id,
              std::string(db::Name(job.kind)), std::string(db::Name(m.status)),
              ok ? absl::StrCat(m.median_s * 1e3, " ms") : m.error.substr(0, 200),
              ok ? absl::StrCat(" (", m.samples_s.size(), " samples)") : "");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tasks_.find(job.task_id);
  if (it != tasks_.end()) {
    RETURN_IF_ERROR(RefreshProgress(*it->second));
    RETURN_IF_ERROR(Advance(*it->second));
  }
  if (!implausible.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("report: ", implausible, "; recorded as an invalid result"));
  }
  return ReportReceipt::kRecorded;
}

double Scheduler::ImplausibleBelowS(const std::string& task_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tasks_.find(task_id);
  if (it == tasks_.end()) return 0;
  return model::PhysicalFloorS(it->second->chain, it->second->target);
}

std::map<std::string, int64_t> Scheduler::ImplausibleReports() {
  std::lock_guard<std::mutex> lock(implausible_mu_);
  return implausible_;
}

// --------------------------------------------------------------- tasks ---

absl::Status Scheduler::RefreshProgress(Task& task) {
  ASSIGN_OR_RETURN(std::vector<db::MeasurementRow> rows, db_->MeasurementsOfTask(task.row.id));
  int measured = 0, failed = 0;
  const db::MeasurementRow* best = nullptr;
  int noisy = 0;
  for (const db::MeasurementRow& m : rows) {
    if (m.kind != JobKind::kCandidate) continue;
    ++measured;
    noisy += m.status == MeasurementStatus::kNoisy;
    if (m.status != MeasurementStatus::kOk) {
      ++failed;
    } else if (best == nullptr || m.median_s < best->median_s) {
      best = &m;
    }
  }
  TuneProgress p{measured, failed, noisy, task.row.budget};
  if (best) {
    p.best_s = best->median_s;
    ASSIGN_OR_RETURN(db::CandidateRow c, db_->GetCandidate(*best->candidate_id));
    p.best_schedule = c.schedule;
  }
  if (!(p == task.progress)) {
    task.progress = p;
    ++task.version;
    task_cv_.notify_all();
  }
  return absl::OkStatus();
}

absl::Status Scheduler::Advance(Task& task) {
  if (task.row.state != TaskState::kRunning) return absl::OkStatus();
  while (true) {
    if (!task.batch.empty()) {
      ASSIGN_OR_RETURN(std::vector<db::JobRow> jobs, db_->JobsOfTask(task.row.id));
      std::map<int64_t, const db::JobRow*> by_candidate;
      for (const db::JobRow& j : jobs) {
        if (j.candidate_id && j.kind == JobKind::kCandidate) by_candidate[*j.candidate_id] = &j;
      }
      for (const db::CandidateRow& c : task.batch) {
        auto it = by_candidate.find(c.id);
        if (it == by_candidate.end() || !Finished(it->second->state)) return absl::OkStatus();
      }
      ASSIGN_OR_RETURN(std::vector<db::MeasurementRow> rows, db_->MeasurementsOfTask(task.row.id));
      std::vector<search::MeasuredResult> results;
      for (const db::CandidateRow& c : task.batch) {
        search::MeasuredResult r;
        r.schedule_text = c.schedule;
        for (const db::MeasurementRow& m : rows) {
          if (m.candidate_id == c.id && m.kind == JobKind::kCandidate) {
            r.ok = m.status == MeasurementStatus::kOk;
            r.median_s = m.median_s;
          }
        }
        results.push_back(r);
      }
      task.strategy->NotifyResults(results);
      task.batch.clear();
    }
    if (task.strategy->Done() || task.issued >= task.row.budget) break;
    std::vector<search::CandidateSpec> specs =
        task.strategy->NextBatch(std::min(task.row.batch_size, task.row.budget - task.issued));
    if (specs.empty()) break;
    const int64_t now = NowMs();
    for (const search::CandidateSpec& spec : specs) {
      db::CandidateRow c;
      c.task_id = task.row.id;
      c.schedule = spec.schedule_text;
      c.mapping = spec.mapping;
      c.t_mem_s = spec.prediction.t_mem_s;
      c.t_comp_s = spec.prediction.t_comp_s;
      c.alpha = spec.prediction.alpha;
      c.t_estm_s = spec.prediction.t_estm_s;
      c.rank = task.issued++;
      ASSIGN_OR_RETURN(auto inserted, db_->FindOrInsertCandidate(c, NewId("j-"), now));
      task.batch.push_back(inserted.first);
    }
    lease_cv_.notify_all();
  }
  // Nothing more to propose: the best measured again (by another worker of
  // the target where there is one), with a baseline beside it; again while
  // no trusted run agrees with it (a contradicted one gives way to the next
  // fastest), up to kConfirmAttempts runs; then finish.
  std::vector<std::string> waiting = task.baseline_jobs;
  waiting.insert(waiting.end(), task.confirm_jobs.begin(), task.confirm_jobs.end());
  for (const std::string& id : waiting) {
    ASSIGN_OR_RETURN(db::JobRow job, db_->GetJob(id));
    if (!Finished(job.state)) return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::vector<db::MeasurementRow> rows, db_->MeasurementsOfTask(task.row.id));
  const BestOfTask best = FindBest(rows, options_.measure.max_spread);
  if (best.candidate != nullptr && best.confirmation == nullptr && task.confirm_jobs.size() < kConfirmAttempts) {
    const int64_t now = NowMs();
    db::JobRow job;
    job.id = NewId("j-");
    job.task_id = task.row.id;
    job.kind = JobKind::kConfirm;
    job.candidate_id = best.candidate->candidate_id;
    job.target_fp = task.row.target_fp;
    job.state = JobState::kQueued;
    // Measured again elsewhere, where another worker of the target is
    // there: one worker's numbers alone never make the best.
    job.not_worker = best.candidate->worker_id;
    RETURN_IF_ERROR(db_->InsertJob(job, now));
    task.confirm_jobs.push_back(job.id);
    // A CPU worker times the baseline together with the confirmation; a
    // GPU's is a job of its own, beside it.
    if (task.target.backend != hw::Backend::kCpu && task.baseline_jobs.size() <= task.confirm_jobs.size()) {
      RETURN_IF_ERROR(QueueBaseline(task, now));
    }
    lease_cv_.notify_all();
    return absl::OkStatus();
  }
  return Finalize(task, rows);
}

search::McfuserSearchOptions Scheduler::SearchOptions(const Task& task,
                                                     std::shared_ptr<const model::CostModel> model) const {
  search::McfuserSearchOptions o;
  o.cost_model = std::move(model);
  // A CPU answer may call a library: there the chain split in two parts is
  // a candidate too. An f16 or bf16 part would round the tensors handed on.
  constexpr int kSplitCandidates = 3;
  if (options_.unfused_answers && task.target.backend == hw::Backend::kCpu && task.chain.dtype == ir::DType::kF32) {
    o.split_candidates = kSplitCandidates;
  }
  return o;
}

absl::Status Scheduler::QueueBaseline(Task& task, int64_t now_ms) {
  db::JobRow job;
  job.id = NewId("j-");
  job.task_id = task.row.id;
  job.kind = JobKind::kBaseline;
  job.target_fp = task.row.target_fp;
  job.state = JobState::kQueued;
  RETURN_IF_ERROR(db_->InsertJob(job, now_ms));
  task.baseline_jobs.push_back(job.id);
  return absl::OkStatus();
}

absl::Status Scheduler::SetBaselineOfTask(const std::string& task_id, const db::MeasurementRow& best,
                                          TuneResult& r) {
  ASSIGN_OR_RETURN(std::vector<db::MeasurementRow> rows, db_->MeasurementsOfTask(task_id, JobKind::kBaseline));
  BaselineResult& baseline = r.baseline;
  std::vector<const db::MeasurementRow*> trusted;
  int noisy = 0;
  for (const db::MeasurementRow& m : rows) {
    if (m.status == MeasurementStatus::kNoisy) ++noisy;
    if (m.status == MeasurementStatus::kOk) trusted.push_back(&m);
  }
  // A confirmation is compared with the baseline timed together with it,
  // else with the one measured nearest it (the machine's speed drifts over
  // a task); anything else with all of them.
  auto beside = best.kind == JobKind::kConfirm ? BaselineBeside(best.resources_json, options_.measure.max_spread)
                                               : std::nullopt;
  if (beside) {
    baseline.samples_s = beside->second;
    baseline.kind = beside->first;
  } else {
    if (best.kind == JobKind::kConfirm && !trusted.empty()) trusted = {NearestTrusted(rows, best.measured_ms)};
    for (const db::MeasurementRow* m : trusted) {
      baseline.samples_s.insert(baseline.samples_s.end(), m->samples_s.begin(), m->samples_s.end());
      if (baseline.kind.empty()) baseline.kind = BaselineKind(m->resources_json);
    }
  }
  if (baseline.samples_s.empty()) {
    if (noisy > 0) baseline.status = MeasurementStatus::kNoisy;
    return absl::OkStatus();
  }
  const SampleStats stats = Summarize(baseline.samples_s);
  baseline.status = MeasurementStatus::kOk;
  baseline.median_s = stats.median;
  baseline.spread = stats.spread;
  if (best.status == MeasurementStatus::kOk && best.median_s > 0) r.speedup = stats.median / best.median_s;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<db::BestRow>> Scheduler::UnfusedBest(const Task& task, const db::MeasurementRow& best) {
  if (!options_.unfused_answers || task.target.backend != hw::Backend::kCpu) return std::nullopt;
  std::string vendor;
  double median_s = 0;
  int64_t measurement_id = 0;
  auto beside = best.kind == JobKind::kConfirm ? BaselineBeside(best.resources_json, options_.measure.max_spread)
                                               : std::nullopt;
  if (beside) {
    vendor = beside->first;
    median_s = Summarize(beside->second).median;
    measurement_id = best.id;
  } else {
    ASSIGN_OR_RETURN(std::vector<db::MeasurementRow> rows, db_->MeasurementsOfTask(task.row.id, JobKind::kBaseline));
    const db::MeasurementRow* nearest = NearestTrusted(rows, best.measured_ms);
    if (nearest == nullptr) return std::nullopt;
    vendor = BaselineKind(nearest->resources_json);
    median_s = nearest->median_s;
    measurement_id = nearest->id;
  }
  if (vendor.empty() || !(median_s > 0 && median_s < best.median_s)) return std::nullopt;
  db::CandidateRow c;
  c.task_id = task.row.id;
  c.schedule = absl::StrCat(space::kUnfusedPrefix, vendor);
  c.rank = -1;  // no model ranked it: it is always measured
  ASSIGN_OR_RETURN(db::CandidateRow row, db_->FindOrInsertUnqueuedCandidate(c));
  return db::BestRow{task.row.id, row.id, measurement_id, median_s};
}

absl::Status Scheduler::SetUnfusedResult(const db::MeasurementRow& meas, const std::string& vendor, TuneResult& r) {
  if (meas.kind == JobKind::kConfirm) {
    // Timed beside the fused kernel's confirmation: that measurement's
    // samples are the fused kernel's, the baseline's are in its resources
    // (trusted when it became the best, whatever --max-spread is now).
    auto beside = BaselineBeside(meas.resources_json, std::numeric_limits<double>::infinity());
    if (!beside) return absl::InternalError(absl::StrCat("measurement ", meas.id, " has no trusted baseline beside it"));
    r.fused_s = meas.median_s;
    ASSIGN_OR_RETURN(db::CandidateRow cand, db_->GetCandidate(meas.candidate_id.value_or(0)));
    r.fused_schedule = cand.schedule;
    const SampleStats stats = Summarize(beside->second);
    r.measured.samples_s = beside->second;
    r.measured.median_s = stats.median;
    r.measured.spread = stats.spread;
    r.measured.max_abs_error = r.measured.max_rel_error = 0;  // validated, its errors not kept
  } else {
    // Its own baseline measurement: the fused kernel it beat is the task's
    // trusted confirmation, else its fastest trusted candidate.
    ASSIGN_OR_RETURN(std::vector<db::MeasurementRow> rows, db_->MeasurementsOfTask(meas.task_id));
    const db::MeasurementRow *fused = nullptr, *fastest = nullptr;
    for (const db::MeasurementRow& m : rows) {
      if (m.status != MeasurementStatus::kOk || !m.candidate_id) continue;
      if (m.kind == JobKind::kConfirm) fused = &m;
      if (m.kind == JobKind::kCandidate && (fastest == nullptr || m.median_s < fastest->median_s)) fastest = &m;
    }
    if (fused == nullptr) fused = fastest;
    if (fused != nullptr) {
      r.fused_s = fused->median_s;
      ASSIGN_OR_RETURN(db::CandidateRow cand, db_->GetCandidate(*fused->candidate_id));
      r.fused_schedule = cand.schedule;
    }
  }
  r.baseline.status = MeasurementStatus::kOk;
  r.baseline.samples_s = r.measured.samples_s;
  r.baseline.median_s = r.measured.median_s;
  r.baseline.spread = r.measured.spread;
  r.baseline.kind = vendor;
  r.speedup = 1;
  return absl::OkStatus();
}

absl::Status Scheduler::Finalize(Task& task, const std::vector<db::MeasurementRow>& rows) {
  const db::MeasurementRow* first_failure = nullptr;
  int candidates = 0, trusted = 0;
  for (const db::MeasurementRow& m : rows) {
    if (m.kind != JobKind::kCandidate) continue;
    ++candidates;
    trusted += m.status == MeasurementStatus::kOk;
    if (m.status != MeasurementStatus::kOk && first_failure == nullptr) first_failure = &m;
  }
  // What the task reports and caches is the best's confirmation: its
  // candidate measured again, trusted and agreeing.
  const BestOfTask found = FindBest(rows, options_.measure.max_spread);
  const db::MeasurementRow* best = found.confirmation;
  const int64_t now = NowMs();
  std::optional<db::BestRow> unfused;  // the unfused chain, where it beat every fused kernel
  if (trusted == 0) {
    task.row.state = TaskState::kFailed;
    task.row.error = candidates == 0
                         ? "the search proposed no candidates"
                         : absl::StrCat("all ", candidates, " candidates failed; the first: ",
                                        db::Name(first_failure->status), ": ", first_failure->error.substr(0, 2000));
  } else if (best == nullptr) {
    // Nothing is cached: a later request for the chain tunes it again.
    task.row.state = TaskState::kFailed;
    task.row.error = absl::StrCat("unconfirmed: ", task.confirm_jobs.size(), " runs again of the fastest candidates ",
                                  "gave no trusted time within ", options_.measure.max_spread * 100,
                                  "% of theirs; nothing was cached (tune again, on a quieter machine)");
  } else {
    ASSIGN_OR_RETURN(unfused, UnfusedBest(task, *best));
    RETURN_IF_ERROR(db_->OfferBest(task.row.workload_key, task.row.target_fp, task.row.salt,
                                   unfused ? *unfused
                                           : db::BestRow{task.row.id, *best->candidate_id, best->id, best->median_s},
                                   now));
    task.row.state = TaskState::kDone;
  }
  RETURN_IF_ERROR(db_->FinishTask(task.row.id, task.row.state, task.row.error, now));
  task.row.finished_ms = now;
  {
    std::lock_guard<std::mutex> lock(train_mu_);
    train_wanted_.insert(task.row.target_fp);
  }
  if (task.row.state == TaskState::kDone) {
    ASSIGN_OR_RETURN(TuneResult r, ResultFromBest(task.row.workload_key, task.row.target_fp, false));
    // Report this task's work, whichever task found the best kernel.
    r.candidates_measured = task.progress.measured;
    r.candidates_failed = task.progress.failed;
    r.tuning_s = static_cast<double>(now - task.row.created_ms) / 1000;
    task.result = std::move(r);
  }
  task.strategy.reset();
  ++task.version;
  task_cv_.notify_all();
  Log()->info("[task={}] {} after {:.1f} s: {}", task.row.id, std::string(db::Name(task.row.state)),
              static_cast<double>(now - task.row.created_ms) / 1000,
              task.row.state != TaskState::kDone ? task.row.error
              : unfused ? absl::StrCat("best: the unfused chain, ", unfused->median_s * 1e3, " ms (the best fused kernel ",
                                       best->median_s * 1e3, " ms)")
                        : absl::StrCat("best ", best->median_s * 1e3, " ms"));
  return absl::OkStatus();
}

absl::StatusOr<Scheduler::Task*> Scheduler::LoadTask(const db::TaskRow& row) {
  auto task = std::make_unique<Task>();
  task->row = row;
  ASSIGN_OR_RETURN(db::WorkloadRow w, db_->GetWorkload(row.workload_key));
  ASSIGN_OR_RETURN(task->chain, ir::ParseChainJson(w.chain_json));
  ASSIGN_OR_RETURN(task->target, TargetOf(row.target_fp));
  // The W and P the task started with, not the target's latest calibration.
  if (row.bandwidth_bytes_per_s > 0 && row.peak_flops > 0) {
    task->target.bandwidth_bytes_per_s = row.bandwidth_bytes_per_s;
    task->target.peak_flops = row.peak_flops;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const model::CostModel> model, models_.ById(row.cost_model_id));
  task->strategy = search::MakeMcfuserSearch(SearchOptions(*task, std::move(model)));
  RETURN_IF_ERROR(task->strategy->Initialize({&task->chain, task->target, row.budget}));
  ASSIGN_OR_RETURN(std::vector<db::JobRow> jobs, db_->JobsOfTask(row.id));
  for (const db::JobRow& j : jobs) {
    if (j.kind == JobKind::kBaseline) task->baseline_jobs.push_back(j.id);
    if (j.kind == JobKind::kConfirm) task->confirm_jobs.push_back(j.id);
  }
  task->started = StartedOf(row);
  task->progress.budget = row.budget;
  Task* raw = task.get();
  tasks_[row.id] = std::move(task);
  return raw;
}

void Scheduler::TrainCostModels() {
  std::set<std::string> wanted;
  {
    std::lock_guard<std::mutex> lock(train_mu_);
    wanted.swap(train_wanted_);
  }
  for (const std::string& fp : wanted) {
    absl::StatusOr<hw::TargetDesc> target = TargetOf(fp);
    absl::StatusOr<std::string> did = target.ok() ? models_.MaybeTrain(fp, *target) : target.status();
    if (!did.ok()) {
      Log()->error("[target={}] training the learned cost model failed: {}", fp, did.status().ToString());
    } else if (!did->empty()) {
      Log()->info("[target={}] learned cost model: {}", fp, *did);
    }
  }
}

absl::Status Scheduler::ResumeTasks() {
  ASSIGN_OR_RETURN(std::vector<db::TaskRow> running, db_->ListTasksInState(TaskState::kRunning));
  std::lock_guard<std::mutex> lock(mu_);
  for (const db::TaskRow& row : running) {
    auto task = LoadTask(row);
    if (!task.ok()) {
      Log()->error("[task={}] cannot resume: {}", row.id, task.status().ToString());
      RETURN_IF_ERROR(db_->FinishTask(row.id, TaskState::kFailed,
                                      absl::StrCat("could not resume: ", task.status().message()), NowMs()));
      continue;
    }
    // Replays the strategy against what the database already holds.
    RETURN_IF_ERROR(RefreshProgress(**task));
    RETURN_IF_ERROR(Advance(**task));
    Log()->info("[task={}] resumed: {} of {} candidates measured", row.id, (*task)->progress.measured, row.budget);
  }
  return absl::OkStatus();
}

void Scheduler::ReaperLoop() {
  while (!stop_) {
    {
      std::unique_lock<std::mutex> lock(reaper_mu_);
      reaper_cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.reaper_interval), [this] { return stop_.load(); });
    }
    if (stop_) break;
    TrainCostModels();
    const int64_t now = NowMs();
    auto touched = db_->ExpireLeases(now, options_.max_attempts);
    if (!touched.ok()) {
      Log()->error("expiring leases failed: {}", touched.status().ToString());
      continue;
    }
    if (!touched->empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      std::set<std::string> ids(touched->begin(), touched->end());
      for (const std::string& id : ids) {
        Log()->warn("[task={}] a lease expired; its job went back to the queue (or failed after {} attempts)", id,
                    options_.max_attempts);
        auto it = tasks_.find(id);
        if (it == tasks_.end()) continue;
        absl::Status st = RefreshProgress(*it->second);
        if (st.ok()) st = Advance(*it->second);
        if (!st.ok()) Log()->error("[task={}] {}", id, st.ToString());
      }
      lease_cv_.notify_all();
    }
    // Workers heard from since the cutoff, whether or not the database could
    // record it (a full disk), are not lost.
    const int64_t cutoff = now - absl::ToInt64Milliseconds(options_.worker_timeout);
    std::set<std::string> heard;
    {
      std::lock_guard<std::mutex> lock(contact_mu_);
      for (auto it = contact_ms_.begin(); it != contact_ms_.end();) {
        if (it->second < cutoff) {
          it = contact_ms_.erase(it);
        } else {
          heard.insert((it++)->first);
        }
      }
    }
    auto lost = db_->MarkLostWorkers(cutoff, heard);
    if (lost.ok() && *lost > 0) {
      targets_generation_++;
      Log()->warn("{} worker(s) went silent and are marked lost", *lost);
    }
  }
}

}  // namespace fusor::server
