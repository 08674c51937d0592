// Clients' requests (scheduler_task.h): the cache, schedules translated
// between equivalent chains, quotas, tasks started and waited on.
#include "server/scheduler_task.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/ir/parse.h"
#include "common/ir/ranges.h"
#include "common/mapping/mapping.h"
#include "common/space/loop_nest.h"
#include "common/space/schedule.h"
#include "common/space/split.h"
#include "common/util/log.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "common/util/timing.h"
#include "proto/wire/convert.h"
#include "proto/wire/grpc_status.h"
#include "worker/backend.h"

namespace fusor::server {

using db::TaskState;

namespace {

// The intrinsic of the first mapped op in a space::DescribeMappings text.
std::string FirstIntrinsic(const std::string& mappings) {
  const size_t eq = mappings.find('='), open = mappings.find('[');
  if (eq == std::string::npos || open == std::string::npos || open < eq) return "scalar";
  return mappings.substr(eq + 1, open - eq - 1);
}

}  // namespace

std::string TranslateFused(const std::string& text, const ir::Chain& from, const ir::Chain& to,
                           const std::vector<int>& dim_map, const std::vector<int>& tensor_map, bool fit) {
  auto schedule = space::ParseSchedule(text, from);
  if (!schedule.ok()) return text;
  std::vector<int> dims(from.dims.size(), -1);
  for (size_t u = 0; u < dim_map.size(); ++u) {
    if (dim_map[u] >= 0) dims[dim_map[u]] = static_cast<int>(u);
  }
  std::vector<int> ops(from.ops.size(), -1);
  for (size_t o = 0; o < to.ops.size(); ++o) {
    const int t = tensor_map[to.ops[o].output];
    if (t >= 0 && from.tensors[t].producer >= 0) ops[from.tensors[t].producer] = static_cast<int>(o);
  }
  std::vector<int> tensors(from.tensors.size(), -1);
  for (size_t u = 0; u < tensor_map.size(); ++u) {
    if (tensor_map[u] >= 0) tensors[tensor_map[u]] = static_cast<int>(u);
  }
  space::Schedule remapped = space::RemapSchedule(*schedule, dims, ops, to, tensors);
  if (fit) {
    for (size_t d = 0; d < to.dims.size(); ++d) remapped.tile[d] = std::min(remapped.tile[d], to.dims[d].extent);
  }
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

absl::StatusOr<PreparedRequest> Scheduler::Prepare(const ir::Chain& chain, const TargetSelector& selector,
                                                   const std::vector<std::string>& vary) {
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
  return PrepareFor(chain, chosen->fingerprint, vary);
}

absl::StatusOr<PreparedRequest> Scheduler::PrepareFor(const ir::Chain& asked, const std::string& target_fp,
                                                      const std::vector<std::string>& vary) {
  absl::StatusOr<ir::Chain> widened = vary.empty() ? asked : ir::Widen(asked, vary);
  if (!widened.ok()) return widened.status();
  const ir::Chain& chain = *widened;
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
  req.family = ir::CanonicalFamily(chain);
  req.target_fp = target_fp;
  ASSIGN_OR_RETURN(req.target, TargetOf(target_fp));
  if (req.target.backend != hw::Backend::kCpu && !chain.RangedDims().empty()) {
    return absl::UnimplementedError(absl::StrCat("chain '", chain.name, "' has ranged dims; kernels for a range of ",
                                                 "sizes are built for CPU targets only (a GPU takes exact sizes)"));
  }
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
  r.origin = task.origin;
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
  if (!task.transferred_from.empty()) {
    // Measured by a task that carried another record's schedule over.
    r.answer = AnswerKind::kTransferred;
    r.source_key = task.transferred_from;
    absl::StatusOr<db::WorkloadRow> source = db_->GetWorkload(task.transferred_from);
    if (source.ok()) r.source_chain = source->canonical_text;
  }
  return r;
}

absl::StatusOr<std::shared_ptr<Scheduler::Answer>> Scheduler::CachedAnswer(
    const std::string& w, const std::function<absl::StatusOr<ir::Chain>()>& parse, const TargetSelector& selector,
    const std::vector<std::string>& vary) {
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
  ASSIGN_OR_RETURN(PreparedRequest prepared, Prepare(chain, selector, vary));
  auto answer = std::make_shared<Answer>();
  answer->best_generation = best_generation;
  answer->targets_generation = targets_generation;
  answer->prepared = std::make_shared<const PreparedRequest>(std::move(prepared));
  answer->served = answer->prepared;
  answer->result = LookupOrTransfer(*answer->prepared, &answer->served);
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
  std::call_once(answer.compile_once, [&] { answer.compile = BuildCompileResult(*answer.served, *answer.result); });
  return answer.compile;
}

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
  r.served_dims = ir::RangedText(request.chain);
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
  std::optional<Transfer> transfer;
  if (!options.force) {
    auto cached = Lookup(request, &start.served);
    if (cached.ok()) {
      start.cached = *cached;
      return start;
    }
    if (!absl::IsNotFound(cached.status())) return cached.status();
    if (options.transfer) {
      absl::StatusOr<Transfer> found = FindTransfer(request);
      if (found.ok()) transfer = *std::move(found);
      if (!found.ok() && !absl::IsNotFound(found.status())) return found.status();
    }
  }
  // A transfer measures the carried-over schedule alone.
  const int budget = transfer ? 1 : EffectiveBudget(options.budget);
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
  if (transfer) {
    task->row.transferred_from = transfer->source.workload.key;
    task->row.seeds = nlohmann::json::array({transfer->schedule}).dump();
  }
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
                                       ir::ChainToJson(request.canonical.chain), request.family.key},
                                      task->row.created_ms));
  RETURN_IF_ERROR(db_->InsertTask(task->row));
  RETURN_IF_ERROR(QueueBaseline(*task, task->row.created_ms));
  task->started = StartedOf(task->row);
  task->progress.budget = budget;
  Log()->info("[task={}] started for {}: workload {} ({}), target {}, space {} -> {} after pruning ({:.2f} s), "
              "budget {}{}",
              task->row.id, caller.name, key, request.chain.name, fp, stats.enumerated,
              stats.stages.back().remaining, stats.seconds, budget,
              transfer ? absl::StrCat("; carries over the schedule of workload ", transfer->source.workload.key)
                       : std::string());
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

}  // namespace fusor::server
