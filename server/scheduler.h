// The scheduler's core logic, free of gRPC: tuning tasks, the job queue
// with leases, workers, and the tuning cache, all kept in the TuningDb so
// that a restarted scheduler carries on with the tasks it had.
//
// Tasks work on the canonical form of a chain (names t0.., d0..), so every
// chain with the same canonical key shares one cache entry and one running
// task; results are translated back to each requester's names.
//
// Thread-safe. Lease() and WaitForTask() block (up to their timeouts).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/hw/target.h"
#include "common/ir/canonical.h"
#include "common/ir/chain.h"
#include "common/model/cost_model.h"
#include "common/util/files.h"
#include "common/search/search_strategy.h"
#include "server/db/tuning_db.h"
#include "server/histogram.h"
#include "server/learned_models.h"
#include "worker/backend.h"

namespace fusor::server {

// Requests whose answers are kept in memory (each with its kernel source,
// some tens of KB).
inline constexpr size_t kMaxCachedAnswers = 2048;

// Part of every cache key: bump it when a change makes old results wrong.
inline constexpr char kEngineVersion[] = "fusor-engine-2";

// Who is asking. Quotas and the fair sharing of workers count by `id` (a
// token's id, or the peer's address when tokens are off); `name` is for
// messages and logs.
struct Caller {
  std::string id;
  std::string name;
};

// How workers measure, sent with every job. Zero fields take the defaults
// in Create.
struct MeasureOptions {
  int warmup = 0;
  int min_repeats = 0;
  int max_repeats = 0;
  double time_budget_s = 0;
  double timeout_s = 0;
  // The spread (p90 - p10) / median beyond which a sample set is taken
  // again and, if it stays there, the measurement is noisy.
  double max_spread = 0;
};

struct SchedulerOptions {
  std::string db_path;
  int64_t db_max_mb = 0;  // 0: no cap but the disk's
  // Appended to kEngineVersion in cache keys: a new salt starts a fresh
  // cache without deleting the old one.
  std::string salt;
  int default_budget = 16;
  int max_budget = 512;
  int batch_size = 4;
  absl::Duration lease = absl::Seconds(60);
  absl::Duration heartbeat_interval = absl::Seconds(2);
  absl::Duration worker_timeout = absl::Seconds(20);
  // A lost worker leaves the list of workers when it has been silent this
  // long (its measurements keep its id).
  absl::Duration lost_worker_retention = absl::Hours(24);
  absl::Duration reaper_interval = absl::Milliseconds(250);
  int max_attempts = 3;
  int sweep_parallel = 2;  // chains of one sweep tuned at once
  // Request complexity: larger chains are refused with INVALID_ARGUMENT.
  int max_ops = 32;
  int64_t max_tensor_elements = int64_t{1} << 31;
  // Per client (RESOURCE_EXHAUSTED with a retry hint beyond): running tasks
  // it started, the candidates they have yet to measure, running sweeps.
  int max_tasks_per_client = 8;
  int max_candidates_per_client = 2048;
  int max_sweeps_per_client = 2;
  // Learned cost models (server/learned_models.h).
  LearnOptions learn;
  // Every network call needs a bearer token of the right role (server/auth).
  bool require_tokens = false;
  // On a CPU, the unfused chain is the answer where it measured faster
  // than every fused candidate, and the chain split in two parts (each
  // fused or unfused) is a candidate; false: always one fused kernel.
  bool unfused_answers = true;
  MeasureOptions measure;
};

// Which registered target a request is for. A fingerprint names one
// target, whatever its backend; without one, the backend (the CPU when
// unset) and, when given, the arch choose among the registered targets.
struct TargetSelector {
  std::optional<hw::Backend> backend;
  std::string fingerprint;
  std::string arch;
};

struct TuneOptions {
  int budget = 0;      // candidates to measure at most; 0: the scheduler's default
  bool force = false;  // tune again even when the cache has an answer
  // On a miss, where a record of the same chain at other sizes holds on the
  // target: the task measures that record's schedule, fitted to these
  // sizes, alone (validated at every size of interest, timed, confirmed)
  // instead of searching: seconds, not a tune.
  bool transfer = false;
};

// How an answer was found.
enum class AnswerKind {
  kTuned,        // this workload's own record, tuned by a task
  kCovered,      // the record of a range of sizes of the same chain that holds these
  kTransferred,  // the schedule of the nearest record of the same chain (other sizes), fitted to these
};
std::string AnswerKindName(AnswerKind kind);  // "tuned", "covered", "transferred"

struct TaskStarted {
  std::string task_id;
  std::string workload_key;
  std::string target_fp;
  int64_t space_size = 0;
  int64_t space_after_pruning = 0;
  int budget = 0;
};

struct TuneProgress {
  int measured = 0;
  int failed = 0;
  int noisy = 0;  // of `failed`: measured but too noisy to trust
  int budget = 0;
  double best_s = 0;
  std::string best_schedule;  // canonical names
  bool operator==(const TuneProgress&) const = default;
};

// The unfused chain measured in the same task as the best: timed together
// with its confirmation where the worker did that, else the trusted
// measurement nearest the confirmation, else all trusted ones together.
// No status when it was not measured; noisy when none was trusted.
struct BaselineResult {
  std::optional<db::MeasurementStatus> status;
  std::vector<double> samples_s;
  double median_s = 0;  // 0 without a trusted measurement
  double spread = 0;
  std::string kind;  // what it ran: "openblas" or "onednn" GEMMs, and so on
};

// A tuned kernel: the best candidate for a workload on a target, its
// measurement, and the baseline it is compared with.
struct TuneResult {
  std::string task_id;
  bool from_cache = false;
  std::string workload_key;
  std::string target_fp;
  hw::TargetDesc target;
  db::CandidateRow best;  // schedule and mappings: in the requester's names once translated
  std::string intrinsic;  // of the first mapped op
  db::MeasurementRow measured;
  BaselineResult baseline;
  double speedup = 0;  // the baseline's median over the best's; 0 without a trusted baseline
  // When the unfused chain won (best.schedule "unfused <vendor>"): the best
  // fused kernel it beat, in the same measurement where it could be.
  double fused_s = 0;
  std::string fused_schedule;
  int candidates_measured = 0;
  int candidates_failed = 0;
  double tuning_s = 0;
  AnswerKind answer = AnswerKind::kTuned;
  // A transferred schedule is validated once a task has measured it at
  // these sizes; until then the answer is its fitted schedule alone.
  bool validated = true;
  // Covered or transferred: the record it came from (workload key, and its
  // canonical text, sizes readable).
  std::string source_key;
  std::string source_chain;
  // The ranged dims the answer's kernel takes, "m=65..256 n=65..256" ("":
  // it takes exact sizes).
  std::string served_dims;
  // The best's task's origin (db::TaskRow::origin): "" unless imported.
  std::string origin;
};

// One field of a workload's key, or of the target it is tuned for, that
// differs between a request and a record.
struct Difference {
  std::string field;  // "dim m", "dtype", "input Q", "op 2", "target compiler", "salt", ...
  std::string wanted;
  std::string found;
};

// Why a request has no record (or what a covering or transferred answer's
// record differs in): the record nearest to it, of its family (the same
// chain at other sizes) on any target, else of a chain of the same name,
// and each field in which the two differ.
struct Explanation {
  std::string workload_key;
  std::string family_key;
  std::string nearest_key;  // "" when no record is near
  std::string nearest_chain;
  std::string nearest_target_fp;
  std::string nearest_salt;
  std::vector<Difference> differences;
  std::string summary;  // one line
};

// What Compile answers: the result, and its kernel from the target's backend.
struct CompileResult {
  TuneResult result;
  worker::KernelAnswer kernel;
};

// A request's workload and target, resolved: the user's chain, its
// canonical form, and the target it will be tuned for.
struct PreparedRequest {
  ir::Chain chain;  // as served: the requester's, its varying dims widened to their ranges
  ir::CanonicalForm canonical;
  ir::CanonicalForm family;  // ir::CanonicalFamily(chain)
  std::string target_fp;
  hw::TargetDesc target;
};

// The worker protocol in the core's own terms (server/wire_rows.h converts
// the fusor.v1 messages). After Register, a worker names itself on every
// call with the id and secret Register returned.
struct WorkerCredentials {
  std::string worker_id;
  std::string secret;
};

struct Registration {
  WorkerCredentials credentials;
  std::string target_fp;
};

// A job leased to a worker: the job (its id, lease, kind and task), the
// task's canonical chain, and the candidate it measures, if any.
struct LeasedJob {
  db::JobRow job;
  ir::Chain chain;
  std::optional<db::CandidateRow> candidate;
};

// A worker's result for the job it holds under `lease_id`. Of
// `measurement`, what the worker measured is read (status, error, samples,
// median, errors, compile record); the scheduler fills in the rest.
struct JobReport {
  WorkerCredentials worker;
  std::string job_id;
  std::string lease_id;
  db::MeasurementRow measurement;
};

enum class ReportReceipt { kRecorded, kDuplicate };

struct TaskSnapshot {
  int64_t version = 0;
  db::TaskState state = db::TaskState::kRunning;
  TaskStarted started;
  TuneProgress progress;  // canonical names
  std::optional<TuneResult> result;  // canonical names; set when done
  std::string error;
};

class Scheduler {
 public:
  // Locks the database file (`<db>.lock`: FAILED_PRECONDITION when another
  // scheduler, embedded or not, has it), opens it, resumes its running
  // tasks and starts the reaper.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const SchedulerOptions& options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // --- clients ---
  // INVALID_ARGUMENT for a chain beyond this scheduler's limits;
  // FAILED_PRECONDITION when no worker has registered a matching target.
  // `vary`: dims whose size changes from call to call, each served over the
  // range around its size (ir::Widen; INVALID_ARGUMENT where it cannot).
  absl::StatusOr<PreparedRequest> Prepare(const ir::Chain& chain, const TargetSelector& selector,
                                          const std::vector<std::string>& vary = {});
  // `chain` for the known target `target_fp` (NOT_FOUND if unknown).
  absl::StatusOr<PreparedRequest> PrepareFor(const ir::Chain& chain, const std::string& target_fp,
                                             const std::vector<std::string>& vary = {});
  // The budget a task asking for `requested` gets (0: the default).
  int EffectiveBudget(int requested) const;
  // The cache-key salt of this scheduler's results.
  std::string Salt() const;
  // The registered target `fp` (NOT_FOUND if unknown).
  absl::StatusOr<hw::TargetDesc> TargetOf(const std::string& fp);
  // The cached result (translated), or NOT_FOUND: the workload's own
  // record, else a record of the same chain whose range holds its sizes
  // (covered). `served`, when given, gets the request the answer's kernel
  // is for (a covering record's range in the requester's names).
  absl::StatusOr<TuneResult> Lookup(const PreparedRequest& request,
                                    std::shared_ptr<const PreparedRequest>* served = nullptr);
  // Lookup, and on a miss the nearest record of the chain's family on the
  // target, its schedule fitted to this request: a transferred answer, not
  // yet validated (NOT_FOUND when there is none, or it does not fit).
  absl::StatusOr<TuneResult> LookupOrTransfer(const PreparedRequest& request,
                                              std::shared_ptr<const PreparedRequest>* served = nullptr);
  // Why the request has no record of its own; see Explanation.
  absl::StatusOr<Explanation> Explain(const PreparedRequest& request);
  // A request's prepared form and cache answer, kept in memory by the
  // SHA-256 of the workload's bytes and the selector: a repeated request is
  // neither parsed, canonicalized nor looked up again, and its kernel is
  // emitted once. Entries last until a best record lands or the targets change.
  struct Answer {
    int64_t best_generation = 0;
    int64_t targets_generation = 0;
    std::shared_ptr<const PreparedRequest> prepared;
    // What the answer's kernel is for: `prepared`, or the range of a
    // record that covers it.
    std::shared_ptr<const PreparedRequest> served;
    absl::StatusOr<TuneResult> result;  // translated; NOT_FOUND on a miss
    std::once_flag compile_once;
    absl::StatusOr<CompileResult> compile;  // rendered by CompileAnswer
  };
  // Parsing's and Prepare's errors; a miss is an Answer whose result is
  // NOT_FOUND.
  // `workload_bytes` are the request's workload as sent (the service edge
  // passes its serialized form); `parse` gives its chain, and is called only
  // when no answer is kept for those bytes and `selector`.
  // `vary`: as for Prepare (part of the workload's bytes).
  absl::StatusOr<std::shared_ptr<Answer>> CachedAnswer(const std::string& workload_bytes,
                                                       const std::function<absl::StatusOr<ir::Chain>()>& parse,
                                                       const TargetSelector& selector,
                                                       const std::vector<std::string>& vary = {});
  // The answer's Compile response (its result must be ok), rendered once.
  const absl::StatusOr<CompileResult>& CompileAnswer(Answer& answer) const;
  // Starts a task for `caller` (or joins the running one for the same key,
  // which any caller may). When the cache answers (and !options.force)
  // `cached` is set and no task starts. A new task must fit the caller's
  // quota unless !`counted` (a sweep's, admitted as a whole): else
  // RESOURCE_EXHAUSTED, with a retry hint (wire::RetryAfter).
  struct TuneStart {
    std::optional<TuneResult> cached;
    // What the cached answer's kernel is for (the request, or the range of
    // the record that covers it).
    std::shared_ptr<const PreparedRequest> served;
    TaskStarted started;
  };
  absl::StatusOr<TuneStart> StartTune(const PreparedRequest& request, const TuneOptions& options,
                                      const Caller& caller, bool counted = true);
  const SchedulerOptions& options() const { return options_; }
  // Blocks until the task's version exceeds `after_version` or `timeout`.
  absl::StatusOr<TaskSnapshot> WaitForTask(const std::string& task_id, int64_t after_version,
                                           absl::Duration timeout);
  // A canonical-name result or schedule -> the requester's names.
  TuneResult Translate(const TuneResult& result, const PreparedRequest& request) const;
  std::string TranslateSchedule(const std::string& canonical_schedule, const PreparedRequest& request) const;
  // Kernel source and metadata for the requester's chain under `result`.
  absl::StatusOr<CompileResult> BuildCompileResult(const PreparedRequest& request, const TuneResult& result) const;

  // --- workers ---
  // INVALID_ARGUMENT for a target without compute units.
  absl::StatusOr<Registration> Register(const std::string& name, const hw::TargetDesc& target);
  // Extends the worker's leases; false when the worker is unknown (the
  // scheduler lost its database: register again).
  absl::StatusOr<bool> Heartbeat(const WorkerCredentials& worker, const std::vector<std::string>& lease_ids);
  // Up to `max_jobs` (1..16) jobs, waiting up to `wait` (capped at 10 s)
  // for the first; `cancelled` is polled.
  absl::StatusOr<std::vector<LeasedJob>> Lease(const WorkerCredentials& worker, int max_jobs, absl::Duration wait,
                                               const std::function<bool()>& cancelled);
  // FAILED_PRECONDITION when the lease is no longer the job's (it expired),
  // PERMISSION_DENIED when it is another worker's.
  absl::StatusOr<ReportReceipt> Report(const JobReport& report);

  db::TuningDb& db() { return *db_; }
  // Trains the learned cost model of each target that finished a task
  // since the last call (every target, on start) when it has enough new
  // measurements; the reaper calls it, and tests may.
  void TrainCostModels();
  LearnedModels& cost_models() { return models_; }

  // Cache lookups on behalf of requests (tune, compile, lookup, a sweep's
  // chains), for the metrics; not persisted.
  void NoteCacheLookup(bool hit) { (hit ? cache_hits_ : cache_misses_)++; }
  int64_t cache_hits() const { return cache_hits_; }
  int64_t cache_misses() const { return cache_misses_; }
  // Requests refused for a per-client limit since start, by limit.
  enum class Quota { kTasks, kCandidates, kSweeps };
  void NoteQuotaRefusal(Quota q) { quota_refusals_[static_cast<int>(q)]++; }
  int64_t quota_refusals(Quota q) const { return quota_refusals_[static_cast<int>(q)]; }
  // Reports refused as implausible (a time under the chain's physical
  // floor), by worker id.
  std::map<std::string, int64_t> ImplausibleReports();
  // Since start, by job kind: how long jobs waited from queued to their
  // first lease, and how long a lease took from its start to its accepted
  // report (compiling, validating and timing on the worker).
  const Histogram& queue_wait() const { return queue_wait_; }
  const Histogram& job_duration() const { return job_duration_; }

 private:
  struct Task;
  Scheduler(SchedulerOptions options, std::optional<FileLock> lock, std::unique_ptr<db::TuningDb> db);
  std::string NewId(const char* prefix);
  absl::Status ResumeTasks();
  absl::StatusOr<Task*> LoadTask(const db::TaskRow& row);
  // The worker, if `secret` is the one its Register returned: else
  // PERMISSION_DENIED (NOT_FOUND for an unknown worker).
  absl::StatusOr<db::WorkerRow> Authenticate(const std::string& worker_id, const std::string& secret,
                                             absl::string_view call);
  absl::Status Advance(Task& task);  // mu_ held
  absl::Status Finalize(Task& task, const std::vector<db::MeasurementRow>& rows);  // mu_ held; the task's measurements
  // How the task's search runs: `model` ranks, and on a CPU the chain's
  // splits are candidates too, unless answers must be fused.
  search::McfuserSearchOptions SearchOptions(const Task& task, std::shared_ptr<const model::CostModel> model) const;
  absl::Status QueueBaseline(Task& task, int64_t now_ms);  // mu_ held
  // The baseline measured by task `task_id` into `r`, and the speedup of
  // `best` over it: for a confirmation, the baseline timed together with it
  // (else the trusted one measured nearest it); otherwise every trusted
  // baseline measurement's samples together.
  absl::Status SetBaselineOfTask(const std::string& task_id, const db::MeasurementRow& best, TuneResult& r);
  // The unfused chain as the task's best, when its trusted measurement
  // beat `best` (the best fused one): timed beside the confirmation where
  // it was, else the trusted baseline measured nearest it. CPU targets only.
  absl::StatusOr<std::optional<db::BestRow>> UnfusedBest(const Task& task, const db::MeasurementRow& best);
  // `r` for a best that runs the chain unfused: its measurement, and the
  // fused kernel it beat.
  absl::Status SetUnfusedResult(const db::MeasurementRow& meas, const std::string& vendor, TuneResult& r);
  absl::Status RefreshProgress(Task& task);  // mu_ held
  // A median below this is refused as implausible (0 for a task not running).
  double ImplausibleBelowS(const std::string& task_id);
  absl::Status CheckQuota(const Caller& caller, int budget);  // mu_ held
  absl::StatusOr<TuneResult> ResultFromBest(const std::string& key, const std::string& fp, bool from_cache);
  // Fills the family key of workloads written by older fusor.
  absl::Status FillFamilies();
  // The nearest record of the request's family on its target whose
  // schedule, fitted to the request's sizes, the space's rules allow, and
  // whose carrying over to this workload has not failed before.
  struct Transfer {
    db::FamilyBestRow source;
    std::string schedule;  // the request's canonical names
    std::string mapping;
    model::Prediction prediction;
  };
  absl::StatusOr<Transfer> FindTransfer(const PreparedRequest& request);
  void ReaperLoop();

  const SchedulerOptions options_;
  std::optional<FileLock> lock_;  // one scheduler per database file
  std::unique_ptr<db::TuningDb> db_;
  LearnedModels models_;
  std::mutex train_mu_;
  std::set<std::string> train_wanted_;  // targets to train (TrainCostModels)

  std::mutex mu_;
  std::condition_variable task_cv_;
  std::condition_variable lease_cv_;
  std::map<std::string, std::unique_ptr<Task>> tasks_;

  // Request digest -> answer; see CachedAnswer. Not under mu_.
  std::mutex answers_mu_;
  std::map<std::string, std::shared_ptr<Answer>> answers_;
  // Changes when a worker registers or is found lost or back: which target
  // a request's selector picks may change with it.
  std::atomic<int64_t> targets_generation_{0};

  std::mutex id_mu_;
  uint64_t id_state_;

  std::atomic<bool> stop_{false};
  std::atomic<int64_t> cache_hits_{0}, cache_misses_{0};
  std::atomic<int64_t> quota_refusals_[3] = {};
  std::mutex contact_mu_;
  std::map<std::string, int64_t> contact_ms_;  // worker id -> when it last called (within the worker timeout)
  std::mutex implausible_mu_;
  std::map<std::string, int64_t> implausible_;  // worker id -> reports refused as implausible
  Histogram queue_wait_{{0.1, 0.5, 2, 10, 30, 120, 600, 3600}};
  Histogram job_duration_{{0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300}};
  std::mutex reaper_mu_;
  std::condition_variable reaper_cv_;
  std::thread reaper_;
};

int64_t NowMs();

}  // namespace fusor::server
