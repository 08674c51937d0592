#include "server/sweeps.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/ir/parse.h"
#include "common/util/log.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "common/util/text.h"
#include "proto/wire/grpc_status.h"

namespace fusor::server {
namespace {

std::shared_ptr<spdlog::logger> Log() { return Logger("sweeps"); }

using db::SweepChainState;
using db::SweepState;

bool Finished(SweepChainState state) { return state == SweepChainState::kDone || state == SweepChainState::kFailed; }

// What identifies "the same sweep": everything that was asked for.
std::string Digest(const SweepRequest& request, const std::vector<PreparedRequest>& prepared,
                   const std::string& target_fp, const std::string& salt, int budget) {
  std::string text = absl::StrCat("sweep\n", request.name, "\n", target_fp, "\n", salt, "\n", budget, "\n");
  for (size_t i = 0; i < request.entries.size(); ++i) {
    const SweepRequest::Entry& e = request.entries[i];
    absl::StrAppend(&text, e.model, "\t", e.role, "\t", e.source, "\t", e.instances, "\t", prepared[i].chain.name,
                    "\t", prepared[i].canonical.key, "\n");
  }
  return Sha256Hex(text).substr(0, 32);
}

// The request as a whole: INVALID_ARGUMENT when it has no entries or too
// many, asks for force, or has a bad name.
absl::Status CheckRequest(const SweepRequest& request, int max_entries) {
  const int num_entries = static_cast<int>(request.entries.size());
  if (num_entries == 0) return absl::InvalidArgumentError("sweep: no entries (models' chains) to tune");
  if (num_entries > max_entries) {
    return absl::InvalidArgumentError(
        absl::StrCat("sweep: ", num_entries, " entries; at most ", max_entries, " per sweep"));
  }
  if (request.options.force) {
    return absl::InvalidArgumentError("sweep: force is not supported; a sweep asks the cache first");
  }
  if (!request.name.empty()) RETURN_IF_ERROR(CheckName(request.name, "sweep"));
  return absl::OkStatus();
}

// The request's entries, checked and prepared for one target.
struct PreparedEntries {
  std::vector<PreparedRequest> prepared;  // per entry
  std::string target_fp;
  std::set<std::string> models;
};

// INVALID_ARGUMENT naming the first bad entry; Prepare's other errors as
// they are (e.g. FAILED_PRECONDITION when no worker has the target).
absl::StatusOr<PreparedEntries> PrepareEntries(Scheduler& core, const SweepRequest& request) {
  PreparedEntries out;
  for (size_t i = 0; i < request.entries.size(); ++i) {
    const SweepRequest::Entry& e = request.entries[i];
    const std::string what =
        absl::StrCat("sweep entry ", i + 1, " (model '", Echo(e.model), "', chain '", Echo(e.chain_name), "')");
    if (e.model.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": model is required"));
    for (const auto& [label, field, most] : {std::tuple{&e.model, "model", 256}, {&e.role, "role", 256},
                                             {&e.source, "source", 4096}}) {
      if (absl::Status st = CheckLabel(*label, field, most); !st.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", st.message()));
      }
    }
    if (e.instances < 1) return absl::InvalidArgumentError(absl::StrCat(what, ": instances must be at least 1"));
    // The first entry picks the target; the rest go to the same one.
    absl::StatusOr<PreparedRequest> p = !e.chain.ok()           ? absl::StatusOr<PreparedRequest>(e.chain.status())
                                        : out.target_fp.empty() ? core.Prepare(*e.chain, request.target)
                                                                : core.PrepareFor(*e.chain, out.target_fp);
    if (!p.ok()) {
      if (absl::IsInvalidArgument(p.status())) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", p.status().message()));
      }
      return p.status();
    }
    out.target_fp = p->target_fp;
    out.models.insert(e.model);
    out.prepared.push_back(std::move(*p));
  }
  return out;
}

// RESOURCE_EXHAUSTED (with a retry hint) when `caller` already runs as
// many sweeps as a client may.
absl::Status CheckSweepQuota(Scheduler& core, const Caller& caller) {
  ASSIGN_OR_RETURN(std::vector<db::SweepRow> all, core.db().ListSweepsInState(SweepState::kRunning));
  const int mine = static_cast<int>(
      std::count_if(all.begin(), all.end(), [&](const db::SweepRow& w) { return w.client == caller.id; }));
  const int limit = core.options().max_sweeps_per_client;
  if (limit > 0 && mine >= limit) {
    core.NoteQuotaRefusal(Scheduler::Quota::kSweeps);
    return wire::WithRetryAfter(
        absl::ResourceExhaustedError(absl::StrCat("client '", caller.name, "' has ", mine,
                                                  mine == 1 ? " sweep" : " sweeps", " running (at most ", limit,
                                                  "); retry when one has finished (`fusor sweep` on its "
                                                  "manifest follows it)")),
        absl::Minutes(1));
  }
  return absl::OkStatus();
}

// Records a new running sweep of `entries` with its workloads; its id.
absl::StatusOr<std::string> CreateSweep(Scheduler& core, const SweepRequest& request, const PreparedEntries& entries,
                                        const std::string& digest, int budget, const Caller& caller) {
  db::TuningDb& db = core.db();
  const int64_t now = NowMs();
  std::vector<db::SweepEntryRow> rows;
  for (size_t i = 0; i < entries.prepared.size(); ++i) {
    const PreparedRequest& p = entries.prepared[i];
    RETURN_IF_ERROR(db.UpsertWorkload(
        {p.canonical.key, p.chain.name, p.canonical.text, ir::ChainToJson(p.canonical.chain), p.family.key}, now));
    const SweepRequest::Entry& e = request.entries[i];
    rows.push_back(
        {static_cast<int>(i), e.model, e.role, e.source, e.instances, p.canonical.key, ir::ChainToJson(p.chain)});
  }
  db::SweepRow row;
  row.id = absl::StrCat("s-", digest.substr(0, 8), "-", std::to_string(now));
  row.name = request.name;
  row.digest = digest;
  row.target_fp = entries.target_fp;
  row.salt = core.Salt();
  row.budget = budget;
  row.state = SweepState::kRunning;
  row.created_ms = now;
  row.client = caller.id;
  RETURN_IF_ERROR(db.CreateSweep(row, rows, now));
  return row.id;
}

}  // namespace

SweepRunner::SweepRunner(Scheduler* core, SweepOptions options) : core_(core), options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

SweepRunner::~SweepRunner() {
  stop_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<SweepStarted> SweepRunner::Start(const SweepRequest& request, const Caller& caller) {
  RETURN_IF_ERROR(CheckRequest(request, options_.max_entries));
  const int num_entries = static_cast<int>(request.entries.size());
  ASSIGN_OR_RETURN(const PreparedEntries entries, PrepareEntries(*core_, request));
  const int budget = core_->EffectiveBudget(request.options.budget);
  const std::string digest = Digest(request, entries.prepared, entries.target_fp, core_->Salt(), budget);

  std::lock_guard<std::mutex> start_lock(start_mu_);
  db::TuningDb& db = core_->db();
  ASSIGN_OR_RETURN(std::optional<db::SweepRow> running, db.FindRunningSweep(digest));
  SweepStarted started;
  std::string id;
  if (running) {
    id = running->id;
    started.resumed = true;
  } else {
    RETURN_IF_ERROR(CheckSweepQuota(*core_, caller));
    ASSIGN_OR_RETURN(id, CreateSweep(*core_, request, entries, digest, budget, caller));
  }
  ASSIGN_OR_RETURN(std::vector<db::SweepChainRow> chains, db.SweepChains(id));
  started.sweep_id = id;
  started.models = static_cast<int>(entries.models.size());
  started.entries = num_entries;
  started.chains = static_cast<int>(chains.size());
  started.target_fp = entries.target_fp;
  started.budget = budget;
  Log()->info("[sweep={}] {} '{}': {} models, {} entries, {} distinct chains, budget {}", id,
              running ? "resumed" : "started", request.name, entries.models.size(), num_entries, chains.size(),
              budget);
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
    cv_.notify_all();
  }
  return started;
}

void SweepRunner::Loop() {
  while (!stop_) {
    auto sweeps = core_->db().ListSweepsInState(SweepState::kRunning);
    if (!sweeps.ok()) {
      Log()->error("listing sweeps failed: {}", sweeps.status().ToString());
    } else {
      for (const db::SweepRow& sweep : *sweeps) {
        if (stop_) break;
        absl::Status st = Advance(sweep);
        if (!st.ok()) Log()->error("[sweep={}] {}", sweep.id, st.ToString());
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.poll), [this] { return wake_ || stop_.load(); });
    wake_ = false;
  }
}

absl::Status SweepRunner::Advance(const db::SweepRow& sweep) {
  db::TuningDb& db = core_->db();
  ASSIGN_OR_RETURN(std::vector<db::SweepChainRow> chains, db.SweepChains(sweep.id));
  int tuning = 0;
  for (db::SweepChainRow& c : chains) {
    if (c.state != SweepChainState::kTuning) continue;
    ASSIGN_OR_RETURN(db::TaskRow task, db.GetTask(c.task_id));
    if (task.state == db::TaskState::kRunning) {
      ++tuning;
      continue;
    }
    c.state = task.state == db::TaskState::kDone ? SweepChainState::kDone : SweepChainState::kFailed;
    c.error = task.error;
    RETURN_IF_ERROR(db.UpdateSweepChain(sweep.id, c, NowMs()));
    Log()->info("[sweep={} task={}] chain {} {}", sweep.id, task.id, c.workload_key, std::string(db::Name(c.state)));
  }
  for (db::SweepChainRow& c : chains) {
    if (stop_ || tuning >= options_.parallel) break;
    if (c.state != SweepChainState::kPending) continue;
    ASSIGN_OR_RETURN(db::WorkloadRow workload, db.GetWorkload(c.workload_key));
    absl::StatusOr<Scheduler::TuneStart> start = [&]() -> absl::StatusOr<Scheduler::TuneStart> {
      ASSIGN_OR_RETURN(ir::Chain chain, ir::ParseChainJson(workload.chain_json));
      ASSIGN_OR_RETURN(PreparedRequest request, core_->PrepareFor(chain, sweep.target_fp));
      // The sweep was admitted as a whole: its tasks count for its client
      // but are not refused one by one.
      return core_->StartTune(request, TuneOptions{sweep.budget}, Caller{sweep.client, sweep.client},
                              /*counted=*/false);
    }();
    if (start.ok()) core_->NoteCacheLookup(start->cached.has_value());
    if (!start.ok()) {
      c.state = SweepChainState::kFailed;
      c.error = std::string(start.status().message());
    } else if (start->cached) {
      c.state = SweepChainState::kDone;
      c.from_cache = true;
      c.task_id = start->cached->task_id;
    } else {
      c.state = SweepChainState::kTuning;
      c.task_id = start->started.task_id;
      ++tuning;
    }
    RETURN_IF_ERROR(db.UpdateSweepChain(sweep.id, c, NowMs()));
    Log()->info("[sweep={}] chain {} ({}): {}", sweep.id, c.workload_key, workload.name,
                c.state == SweepChainState::kTuning ? absl::StrCat("tuning in task ", c.task_id)
                : c.from_cache                      ? std::string("answered from the cache")
                                                    : absl::StrCat("failed: ", c.error));
  }
  if (std::all_of(chains.begin(), chains.end(), [](const db::SweepChainRow& c) { return Finished(c.state); })) {
    RETURN_IF_ERROR(db.FinishSweep(sweep.id, NowMs()));
    Log()->info("[sweep={}] done after {:.1f} s", sweep.id, static_cast<double>(NowMs() - sweep.created_ms) / 1000);
  }
  return absl::OkStatus();
}

absl::StatusOr<SweepRunner::Status> SweepRunner::Progress(const std::string& sweep_id) {
  // Called every half second per follower: reads the chains' states, and
  // entries and tasks only of the few chains being tuned.
  db::TuningDb& db = core_->db();
  ASSIGN_OR_RETURN(db::SweepRow sweep, db.GetSweep(sweep_id));
  ASSIGN_OR_RETURN(std::vector<db::SweepChainRow> chains, db.SweepChains(sweep_id));
  ASSIGN_OR_RETURN(const auto tuned, db.SweepTunedSeconds(sweep_id));  // (chains, seconds) finished by this sweep
  const int64_t now = NowMs();
  Status status;
  status.finished = sweep.state == SweepState::kDone;
  SweepProgress& p = status.progress;
  p.chains = static_cast<int>(chains.size());
  double left = 0, rate_samples = 0, rate_sum_s = 0;  // work left, in chains; the running ones' pace
  for (const db::SweepChainRow& c : chains) {
    if (c.state == SweepChainState::kPending) left += 1;
    if (c.state == SweepChainState::kFailed) ++p.failed;
    if (c.state == SweepChainState::kDone) ++(c.from_cache ? p.cache_hits : p.tuned);
    if (c.state != SweepChainState::kTuning) continue;
    ASSIGN_OR_RETURN(db::TaskRow task, db.GetTask(c.task_id));
    auto snapshot = core_->WaitForTask(c.task_id, INT64_MAX, absl::ZeroDuration());
    const int measured = snapshot.ok() ? snapshot->progress.measured : 0;
    const int budget = std::max(1, task.budget);
    SweepChainProgress& t = p.tuning.emplace_back();
    t.workload_key = c.workload_key;
    auto entry = db.FirstSweepEntry(sweep_id, c.workload_key);
    if (entry.ok()) {
      t.model = entry->model;
      auto chain = ir::ParseChainJson(entry->chain_json);
      if (chain.ok()) t.chain = chain->name;
    }
    t.measured = measured;
    t.budget = budget;
    const double fraction = std::min(1.0, static_cast<double>(measured) / budget);
    left += 1 - fraction;
    if (fraction > 0) {
      rate_sum_s += static_cast<double>(now - task.created_ms) / 1000 / fraction;
      ++rate_samples;
    }
  }
  p.done = p.cache_hits + p.tuned + p.failed;
  p.elapsed_s = static_cast<double>((sweep.finished_ms ? *sweep.finished_ms : now) - sweep.created_ms) / 1000;
  // Seconds per chain: from the chains tuned so far, else from the running
  // ones' pace; divided among the chains tuned at once.
  const double per_chain = tuned.first > 0    ? tuned.second / tuned.first
                           : rate_samples > 0 ? rate_sum_s / rate_samples
                                              : -1;
  const double lanes = std::max(1.0, std::min<double>(options_.parallel, std::ceil(left)));
  p.eta_s = status.finished ? 0 : per_chain < 0 ? -1 : per_chain * left / lanes;
  return status;
}

absl::StatusOr<SweepReport> SweepRunner::Report(const std::string& sweep_id) {
  db::TuningDb& db = core_->db();
  SweepReport report;
  ASSIGN_OR_RETURN(report.sweep, db.GetSweep(sweep_id));
  const db::SweepRow& sweep = report.sweep;
  ASSIGN_OR_RETURN(std::vector<db::SweepChainRow> chains, db.SweepChains(sweep_id));
  ASSIGN_OR_RETURN(std::vector<db::SweepEntryRow> entries, db.SweepEntries(sweep_id));
  std::map<std::string, const db::SweepChainRow*> by_key;
  for (const db::SweepChainRow& c : chains) by_key[c.workload_key] = &c;
  ASSIGN_OR_RETURN(report.target, core_->TargetOf(sweep.target_fp));
  for (const db::SweepEntryRow& e : entries) {
    SweepChainResult& r = report.results.emplace_back();
    r.model = e.model;
    r.role = e.role;
    r.source = e.source;
    r.instances = e.instances;
    r.workload_key = e.workload_key;
    ASSIGN_OR_RETURN(ir::Chain chain, ir::ParseChainJson(e.chain_json));
    r.chain = chain.name;
    auto c = by_key.find(e.workload_key);
    if (c == by_key.end()) return absl::DataLossError(absl::StrCat("sweep ", sweep_id, " lost chain ", e.workload_key));
    const db::SweepChainRow& state = *c->second;
    r.task_id = state.task_id;
    r.error = state.error;
    r.state = state.state == SweepChainState::kDone ? (state.from_cache ? "cache" : "tuned")
                                                    : std::string(db::Name(state.state));
    if (state.state != SweepChainState::kDone) continue;
    ASSIGN_OR_RETURN(PreparedRequest request, core_->PrepareFor(chain, sweep.target_fp));
    auto result = core_->Lookup(request);
    if (!result.ok()) {
      // The cache lost it (e.g. a new salt since): say so in the entry.
      r.state = std::string(db::Name(SweepChainState::kFailed));
      r.error = std::string(result.status().message());
      continue;
    }
    r.best_s = result->measured.median_s;
    r.baseline_s = result->baseline.median_s;
    r.speedup = result->speedup;
    r.tuning_s = result->tuning_s;
    r.schedule = result->best.schedule;
    r.candidates_measured = result->candidates_measured;
  }
  return report;
}

}  // namespace fusor::server
