// The tuning database: every workload, target, worker, task, candidate,
// job and measurement, and the best record per (workload, target, salt).
// Thread-safe: calls are serialized on one connection. States, kinds and
// statuses are stored as their text (states.h): reading a row whose text
// this fusor does not know fails with DATA_LOSS naming the column and text.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/db/sqlite.h"
#include "server/db/states.h"

namespace fusor::db {

struct WorkloadRow {
  std::string key;
  std::string name;
  std::string canonical_text;
  std::string chain_json;
  // The key of the chain with its sizes left open (ir::CanonicalFamily):
  // records of the same chain at other sizes share it. Empty in rows of
  // older fusor until the scheduler fills it.
  std::string family_key;
};

struct TargetRow {
  std::string fingerprint;
  std::string backend;  // "cpu" or "cuda"
  std::string description_json;
  int64_t last_seen_ms = 0;
};

struct WorkerRow {
  std::string id;
  std::string name;
  std::string target_fp;
  WorkerState state = WorkerState::kAlive;
  int64_t registered_ms = 0;
  int64_t last_seen_ms = 0;
  int jobs_done = 0;
  // SHA-256 (hex) of the secret the worker got at Register; its Heartbeat,
  // Lease and Report calls must carry the secret. Empty for a worker
  // registered by older fusor, which can no longer act.
  std::string secret_hash;
};

struct TaskRow {
  std::string id;
  std::string workload_key;
  std::string target_fp;
  std::string salt;
  TaskState state = TaskState::kRunning;
  int budget = 0;
  int batch_size = 0;
  int64_t space_size = 0;
  int64_t space_after_pruning = 0;
  std::string error;
  int64_t created_ms = 0;
  std::optional<int64_t> finished_ms;
  std::string client;  // who started it (server/auth Caller id); quotas and fair sharing count by it
  // The target's W and P when the task started: the model ranks with these
  // for the task's whole life, so a resumed task replays the same ranking
  // after its target was calibrated again. 0 in tasks of older fusor.
  double bandwidth_bytes_per_s = 0;
  double peak_flops = 0;
  // The learned cost model the task ranks with (cost_models.id), 0 for the
  // analytical one: a resumed task replays the same ranking after the model
  // was trained again.
  int64_t cost_model_id = 0;
  // Where an imported task was measured: "HOST:DATABASE" of the database
  // that exported it ('' for a task of this database).
  std::string origin;
  // A task that starts from the schedule of another record (transferred):
  // that record's workload key, and the schedules proposed before the
  // search's own (a JSON array, canonical names; empty: none).
  std::string transferred_from;
  std::string seeds;
};

// A learned cost model of a target (common/model/learned_model.h) and what
// it was trained on and scored: Spearman's rank correlation, averaged over
// the workloads, of each model's predictions with the measured times when
// the workload is left out of training.
struct CostModelRow {
  int64_t id = 0;
  std::string target_fp;
  std::string model_json;
  int samples = 0;
  int workloads = 0;
  double spearman_analytical = 0;
  double spearman_learned = 0;
  int64_t created_ms = 0;
};

// A trusted measurement of a candidate, with what the learned model needs
// to rebuild its nest: its workload (whose chain GetWorkload gives), the
// schedule and the W and P its task ranked with (0 in tasks of older fusor).
struct TrainingRow {
  std::string workload_key;
  std::string schedule;
  double median_s = 0;
  double bandwidth_bytes_per_s = 0;
  double peak_flops = 0;
};

struct CandidateRow {
  int64_t id = 0;
  std::string task_id;
  std::string schedule;
  std::string mapping;
  double t_mem_s = 0, t_comp_s = 0, alpha = 1, t_estm_s = 0;
  int rank = 0;
};

struct JobRow {
  std::string id;
  std::string task_id;
  JobKind kind = JobKind::kCandidate;
  std::optional<int64_t> candidate_id;
  std::string target_fp;
  JobState state = JobState::kQueued;
  std::string worker_id;
  std::string lease_id;
  int64_t lease_expires_ms = 0;
  int attempts = 0;
  int64_t created_ms = 0;  // when it was queued
  int64_t leased_ms = 0;   // its latest lease's start (0: never leased)
  // A worker that must not lease it while another live worker of its target
  // can (a confirmation is run elsewhere than its candidate's measurement).
  std::string not_worker;
};

struct MeasurementRow {
  int64_t id = 0;
  std::string job_id;
  std::string task_id;
  std::optional<int64_t> candidate_id;
  JobKind kind = JobKind::kCandidate;
  std::string workload_key;
  std::string target_fp;
  std::string worker_id;
  MeasurementStatus status = MeasurementStatus::kOk;
  std::string error;
  double median_s = 0;
  std::vector<double> samples_s;
  double spread = 0;  // (p90 - p10) / median (common/util/timing.h)
  double max_abs_error = 0, max_rel_error = 0;
  double compile_s = 0;
  std::string compile_flags;
  std::string compiler;
  int64_t code_bytes = 0;
  std::string resources_json;  // GPU: registers, stack, spills, shared memory, launch
  int64_t measured_ms = 0;
};

struct BestRow {
  std::string task_id;
  int64_t candidate_id = 0;
  int64_t measurement_id = 0;
  double median_s = 0;
};

// A best record with its workload and where it holds (target, salt): what
// a lookup of another member of its family may use or compare with.
struct FamilyBestRow {
  WorkloadRow workload;
  std::string target_fp;
  std::string salt;
  BestRow best;
};

struct SweepRow {
  std::string id;
  std::string name;
  std::string digest;  // of what was asked: target, salt, budget, entries
  std::string target_fp;
  std::string salt;
  int budget = 0;
  SweepState state = SweepState::kRunning;
  int64_t created_ms = 0;
  std::optional<int64_t> finished_ms;
  std::string client;  // who started it; its tasks are that client's
};

// One chain of one model of a sweep, in the requester's names.
struct SweepEntryRow {
  int idx = 0;
  std::string model;
  std::string role;
  std::string source;
  int instances = 0;
  std::string workload_key;
  std::string chain_json;
};

// Where a sweep stands with one distinct chain (canonical key).
struct SweepChainRow {
  std::string workload_key;
  int ord = 0;  // tuning order: first seen first
  SweepChainState state = SweepChainState::kPending;
  bool from_cache = false;
  std::string task_id;  // of the task that tuned it (also when it joined one)
  std::string error;
};

// What a task's measurements say of its best: the fastest trusted candidate
// measurement whose candidate no trusted confirmation contradicted, and the
// confirmation that agrees with it (medians within `max_spread` of the
// larger), if there is one yet. Only a confirmed best is ever an answer:
// the scheduler's rule for its tasks, and an import's for what it brings.
struct BestOfTask {
  const MeasurementRow* candidate = nullptr;
  const MeasurementRow* confirmation = nullptr;
};

BestOfTask FindBest(const std::vector<MeasurementRow>& rows, double max_spread);

// Which measurements `ExportRecords` writes (empty: all).
struct RecordFilter {
  std::string target_fp;
  std::string workload_key;
  // What the records of this database's own tasks say of their origin
  // (ExportOrigin); imported tasks keep theirs.
  std::string origin;
};

// "HOST:PATH": the origin of the tasks of the database at `db_path`, as
// its exports stamp them.
std::string ExportOrigin(const std::string& db_path);

struct ImportStats {
  int records = 0;
  int added = 0;       // measurements new to this database
  int duplicates = 0;  // already here (same job id): skipped
  int best_updated = 0;
};

struct TokenRow {
  std::string id;
  std::string name;
  std::string role;  // "client", "worker" or "admin"
  std::string hash;  // SHA-256 of the token; the token itself is never stored
  int64_t created_ms = 0;
  std::optional<int64_t> revoked_ms;
};

// Counts for the metrics endpoint. Rows with a state, kind or status this
// fusor does not know are not counted.
struct DbMetrics {
  std::map<JobState, int64_t> jobs;
  std::map<TaskState, int64_t> tasks;
  std::map<SweepState, int64_t> sweeps;
  std::map<std::pair<JobKind, MeasurementStatus>, int64_t> measurements;
  std::map<std::pair<std::string, WorkerState>, int64_t> workers;  // by (target, state)
  // (max - min) / median of the samples of the latest ok measurements.
  std::vector<double> spreads;
  // Each finished task's final state and its time from start to end.
  std::vector<std::pair<TaskState, double>> task_seconds;
};

// kStaleLease: the job is no longer leased under this lease (it expired);
// kNotYourLease: the lease is another worker's.
enum class ReportOutcome { kRecorded, kDuplicate, kStaleLease, kNotYourLease };

struct RecordResult {
  ReportOutcome outcome = ReportOutcome::kRecorded;
  int64_t measurement_id = 0;  // when recorded
  JobRow job;                  // as it was before the report
};

class TuningDb {
 public:
  // Opens and migrates the database; see schema.h for version handling.
  static absl::StatusOr<std::unique_ptr<TuningDb>> Open(const std::string& path);

  // Caps the database file at about `bytes` (never below its size now):
  // writes beyond fail as on a full disk (RESOURCE_EXHAUSTED).
  absl::Status SetMaxBytes(int64_t bytes);
  // While set, every write fails at once as on a read-only disk (UNAVAILABLE
  // naming the file): what a scheduler meets when its storage refuses writes.
  absl::Status SetQueryOnly(bool query_only);

  // Changes whenever a best record is written: what was read of `best`
  // before is still current while this stays the same.
  int64_t best_generation() const { return best_generation_; }

  absl::Status UpsertWorkload(const WorkloadRow& w, int64_t now_ms);
  absl::StatusOr<WorkloadRow> GetWorkload(const std::string& key);
  // Workloads whose family_key is empty (written by older fusor), and
  // setting it.
  absl::StatusOr<std::vector<WorkloadRow>> WorkloadsWithoutFamily();
  absl::Status SetWorkloadFamily(const std::string& key, const std::string& family_key);
  // The best records of every workload of a family, or of every workload
  // named `name` (the requester's chain name), on any target and salt:
  // at most `limit`, those on `target_fp` with `salt` first, then the most
  // recently updated first.
  absl::StatusOr<std::vector<FamilyBestRow>> BestsOfFamily(const std::string& family_key, const std::string& target_fp,
                                                           const std::string& salt, int limit = 64);
  absl::StatusOr<std::vector<FamilyBestRow>> BestsNamed(const std::string& name, const std::string& target_fp,
                                                        const std::string& salt, int limit = 64);

  absl::Status UpsertTarget(const TargetRow& t, int64_t now_ms);
  absl::StatusOr<std::vector<TargetRow>> ListTargets();
  absl::StatusOr<TargetRow> GetTarget(const std::string& fingerprint);

  absl::Status InsertWorker(const WorkerRow& w);
  // Updates last_seen and revives a lost worker. NOT_FOUND if unknown.
  absl::Status TouchWorker(const std::string& id, int64_t now_ms);
  absl::StatusOr<WorkerRow> GetWorker(const std::string& id);
  // Every worker but those lost and last seen before `lost_since_ms`.
  absl::StatusOr<std::vector<WorkerRow>> ListWorkers(int64_t lost_since_ms = 0);
  // Fingerprints of the targets that have an alive worker.
  absl::StatusOr<std::vector<std::string>> AliveTargets();
  // Marks alive workers not seen since `cutoff_ms` lost, but those `heard`
  // from since (a call the database could not record); returns how many.
  absl::StatusOr<int> MarkLostWorkers(int64_t cutoff_ms, const std::set<std::string>& heard = {});

  absl::Status InsertTask(const TaskRow& t);
  absl::StatusOr<TaskRow> GetTask(const std::string& id);
  absl::StatusOr<std::vector<TaskRow>> ListTasksInState(TaskState state);
  // Whether a task that carried over `source_key`'s schedule to this
  // workload, target and salt failed (its schedule was refused or never
  // confirmed here: carrying it over again would fail the same way).
  absl::StatusOr<bool> TransferFailed(const std::string& workload_key, const std::string& target_fp,
                                      const std::string& salt, const std::string& source_key);
  // Sets the task's final state; its unfinished jobs fail with it.
  absl::Status FinishTask(const std::string& id, TaskState state, const std::string& error, int64_t now_ms);
  // Fails the task's queued and leased jobs.
  absl::Status FailOpenJobs(const std::string& task_id, int64_t now_ms);

  // The candidate of `task` with this schedule, inserting it (and a queued
  // job for it, with id `job_id`) if it is new, in one transaction.
  absl::StatusOr<std::pair<CandidateRow, JobRow>> FindOrInsertCandidate(const CandidateRow& c,
                                                                       const std::string& job_id,
                                                                       int64_t now_ms);
  // The candidate of `task` with this schedule, inserting it without a
  // job if it is new: a way of running the chain that another job measured
  // (the unfused chain, timed as the baseline).
  absl::StatusOr<CandidateRow> FindOrInsertUnqueuedCandidate(const CandidateRow& c);
  absl::StatusOr<CandidateRow> GetCandidate(int64_t id);
  absl::Status InsertJob(const JobRow& j, int64_t now_ms);
  absl::StatusOr<JobRow> GetJob(const std::string& id);
  absl::StatusOr<std::vector<JobRow>> JobsOfTask(const std::string& task_id);

  // Leases up to `max_jobs` queued jobs for `target_fp` to `worker_id`,
  // with fresh lease ids from `make_lease_id`, sharing workers fairly
  // between the tasks' clients (fewest leased jobs first, then the client
  // served longest ago, then the oldest job).
  absl::StatusOr<std::vector<JobRow>> LeaseJobs(const std::string& worker_id, const std::string& target_fp,
                                                int max_jobs, int64_t now_ms, int64_t expires_ms,
                                                const std::function<std::string()>& make_lease_id);
  // Extends the leases `lease_ids` of `worker_id` (those still leased to
  // it) to `expires_ms`; its other leases run out.
  absl::Status ExtendLeases(const std::string& worker_id, const std::vector<std::string>& lease_ids,
                            int64_t expires_ms);
  // Requeues leased jobs whose lease expired before `now_ms`; a job that
  // has been leased `max_attempts` times fails instead, with a crash
  // measurement saying so. Returns the ids of tasks whose jobs changed.
  absl::StatusOr<std::vector<std::string>> ExpireLeases(int64_t now_ms, int max_attempts);

  // Records the measurement of a leased job and marks the job done, in one
  // transaction. kDuplicate: the job was already reported (nothing
  // written); kStaleLease: the job is not leased under `lease_id` any more.
  absl::StatusOr<RecordResult> RecordMeasurement(const std::string& lease_id, const MeasurementRow& m);
  // With `kind`: only measurements of that kind.
  absl::StatusOr<std::vector<MeasurementRow>> MeasurementsOfTask(const std::string& task_id,
                                                                 std::optional<JobKind> kind = std::nullopt);
  // Candidate measurements of a task: all, and those not ok.
  absl::StatusOr<std::pair<int, int>> CountCandidateMeasurements(const std::string& task_id);
  absl::StatusOr<MeasurementRow> GetMeasurement(int64_t id);
  absl::StatusOr<int64_t> CountMeasurements();

  absl::StatusOr<std::optional<BestRow>> GetBest(const std::string& key, const std::string& fp,
                                                 const std::string& salt);
  // Sets the best record unless an existing one is faster.
  absl::Status OfferBest(const std::string& key, const std::string& fp, const std::string& salt,
                         const BestRow& best, int64_t now_ms);
  // A new sweep with its entries and one pending chain per distinct key (in
  // the entries' order), in one transaction. The entries' workloads must
  // exist.
  absl::Status CreateSweep(const SweepRow& sweep, const std::vector<SweepEntryRow>& entries, int64_t now_ms);
  absl::StatusOr<SweepRow> GetSweep(const std::string& id);
  // The running sweep with this digest, if any.
  absl::StatusOr<std::optional<SweepRow>> FindRunningSweep(const std::string& digest);
  absl::StatusOr<std::vector<SweepRow>> ListSweepsInState(SweepState state);
  absl::StatusOr<std::vector<SweepEntryRow>> SweepEntries(const std::string& sweep_id);
  absl::StatusOr<std::vector<SweepChainRow>> SweepChains(const std::string& sweep_id);  // by ord
  // The first entry of `sweep_id` with this workload (NOT_FOUND if none).
  absl::StatusOr<SweepEntryRow> FirstSweepEntry(const std::string& sweep_id, const std::string& workload_key);
  // The chains the sweep tuned itself (not from the cache) and finished:
  // how many, and their tasks' total seconds.
  absl::StatusOr<std::pair<int, double>> SweepTunedSeconds(const std::string& sweep_id);
  absl::Status UpdateSweepChain(const std::string& sweep_id, const SweepChainRow& chain, int64_t now_ms);
  absl::Status FinishSweep(const std::string& id, int64_t now_ms);

  // Records: one JSON object per measurement of a finished task, with
  // its workload, target, task and candidate, so that a line imports on
  // its own (server/db/records.cc).
  absl::Status ExportRecords(const RecordFilter& filter, const std::function<void(const std::string&)>& line);
  // Imports records (all or nothing): workloads, targets, tasks and
  // candidates are added when missing, a measurement whose job id is here
  // already is skipped. Measurements, not answers: a best record changes
  // only where a finished task's best is confirmed by the scheduler's rule
  // (FindBest with `max_spread`) and is faster than the answer here.
  // INVALID_ARGUMENT naming the line for a malformed one.
  absl::StatusOr<ImportStats> ImportRecords(const std::vector<std::string>& lines, int64_t now_ms,
                                            double max_spread);
  absl::StatusOr<DbMetrics> Metrics(int recent = 200);
  // Learned cost models (server/db/cost_models.cc). Insert returns the id.
  absl::StatusOr<int64_t> InsertCostModel(const CostModelRow& row);
  absl::StatusOr<CostModelRow> GetCostModel(int64_t id);  // NOT_FOUND if unknown
  absl::StatusOr<std::optional<CostModelRow>> LatestCostModel(const std::string& target_fp);
  // Every trusted candidate measurement (status ok) of the target, oldest first.
  absl::StatusOr<std::vector<TrainingRow>> TrainingRows(const std::string& target_fp);
  // How many TrainingRows would return.
  absl::StatusOr<int64_t> CountTrainingRows(const std::string& target_fp);
  absl::Status InsertToken(const TokenRow& token);
  absl::StatusOr<std::vector<TokenRow>> ListTokens();
  // NOT_FOUND for an unknown id; revoking twice keeps the first time.
  absl::Status RevokeToken(const std::string& id, int64_t now_ms);
  absl::StatusOr<std::optional<TokenRow>> FindToken(const std::string& hash);
  absl::StatusOr<int64_t> CountActiveTokens();
  // A consistent copy of the database (online: see Database::BackupTo).
  absl::Status BackupTo(const std::string& path);

 private:
  // A connection for one read: a pooled read-only one on a database file,
  // so that reads wait neither for each other nor for the writer; else the
  // writer's, held locked.
  class Reader {
   public:
    Reader(TuningDb& owner, std::unique_ptr<Database> connection);
    explicit Reader(TuningDb& owner);
    ~Reader();
    Reader(const Reader&) = delete;
    Reader& operator=(const Reader&) = delete;
    Database* operator->() { return connection_ ? connection_.get() : owner_.db_.get(); }

   private:
    TuningDb& owner_;
    std::unique_ptr<Database> connection_;
    std::unique_lock<std::mutex> lock_;
  };
  Reader Read();

  explicit TuningDb(std::unique_ptr<Database> db) : db_(std::move(db)) {}
  absl::StatusOr<JobRow> GetJobLocked(const std::string& id);
  absl::Status FailOpenJobsLocked(const std::string& task_id, int64_t now_ms);
  absl::StatusOr<CandidateRow> FindOrInsertCandidateLocked(const CandidateRow& c);
  absl::StatusOr<std::vector<FamilyBestRow>> BestsWhere(const std::string& column, const std::string& value,
                                                        const std::string& target_fp, const std::string& salt,
                                                        int limit);
  std::mutex mu_;
  std::unique_ptr<Database> db_;
  std::atomic<int64_t> best_generation_{0};
  std::mutex readers_mu_;
  std::vector<std::unique_ptr<Database>> idle_readers_;
};

}  // namespace fusor::db
