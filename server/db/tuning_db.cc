#include "server/db/tuning_db.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"
#include "server/db/schema.h"

namespace fusor::db {
namespace {

constexpr char kJobColumns[] =
    "id, task_id, kind, candidate_id, target_fp, state, COALESCE(worker_id, ''), COALESCE(lease_id, ''), "
    "COALESCE(lease_expires_ms, 0), attempts, COALESCE(not_worker, ''), created_ms, COALESCE(leased_ms, 0)";

absl::StatusOr<JobRow> ReadJob(const Statement& s) {
  JobRow j;
  j.id = s.Text(0);
  j.task_id = s.Text(1);
  ASSIGN_OR_RETURN(j.kind, Parse<JobKind>(s.Text(2)));
  j.candidate_id = s.OptionalInt(3);
  j.target_fp = s.Text(4);
  ASSIGN_OR_RETURN(j.state, Parse<JobState>(s.Text(5)));
  j.worker_id = s.Text(6);
  j.lease_id = s.Text(7);
  j.lease_expires_ms = s.Int(8);
  j.attempts = static_cast<int>(s.Int(9));
  j.not_worker = s.Text(10);
  j.created_ms = s.Int(11);
  j.leased_ms = s.Int(12);
  return j;
}

constexpr char kTaskColumns[] =
    "id, workload_key, target_fp, salt, state, budget, batch_size, space_size, space_after_pruning, error, "
    "created_ms, finished_ms, client, bandwidth_bytes_per_s, peak_flops, cost_model_id, transferred_from, seeds, origin";

absl::StatusOr<TaskRow> ReadTask(const Statement& s) {
  TaskRow t;
  t.id = s.Text(0);
  t.workload_key = s.Text(1);
  t.target_fp = s.Text(2);
  t.salt = s.Text(3);
  ASSIGN_OR_RETURN(t.state, Parse<TaskState>(s.Text(4)));
  t.budget = static_cast<int>(s.Int(5));
  t.batch_size = static_cast<int>(s.Int(6));
  t.space_size = s.Int(7);
  t.space_after_pruning = s.Int(8);
  t.error = s.Text(9);
  t.created_ms = s.Int(10);
  t.finished_ms = s.OptionalInt(11);
  t.client = s.Text(12);
  t.bandwidth_bytes_per_s = s.Double(13);
  t.peak_flops = s.Double(14);
  t.cost_model_id = s.Int(15);
  t.transferred_from = s.Text(16);
  t.seeds = s.Text(17);
  t.origin = s.Text(18);
  return t;
}

constexpr char kCandidateColumns[] = "id, task_id, schedule, mapping, t_mem_s, t_comp_s, alpha, t_estm_s, rank";

CandidateRow ReadCandidate(const Statement& s) {
  CandidateRow c;
  c.id = s.Int(0);
  c.task_id = s.Text(1);
  c.schedule = s.Text(2);
  c.mapping = s.Text(3);
  c.t_mem_s = s.Double(4);
  c.t_comp_s = s.Double(5);
  c.alpha = s.Double(6);
  c.t_estm_s = s.Double(7);
  c.rank = static_cast<int>(s.Int(8));
  return c;
}

constexpr char kMeasurementColumns[] =
    "id, job_id, task_id, candidate_id, kind, workload_key, target_fp, worker_id, status, error, median_s, "
    "samples_json, max_abs_error, max_rel_error, compile_s, compile_flags, compiler, code_bytes, measured_ms, resources_json, "
    "spread";

absl::StatusOr<MeasurementRow> ReadMeasurement(const Statement& s) {
  MeasurementRow m;
  m.id = s.Int(0);
  m.job_id = s.Text(1);
  m.task_id = s.Text(2);
  m.candidate_id = s.OptionalInt(3);
  ASSIGN_OR_RETURN(m.kind, Parse<JobKind>(s.Text(4)));
  m.workload_key = s.Text(5);
  m.target_fp = s.Text(6);
  m.worker_id = s.Text(7);
  ASSIGN_OR_RETURN(m.status, Parse<MeasurementStatus>(s.Text(8)));
  m.error = s.Text(9);
  m.median_s = s.Double(10);
  nlohmann::json samples = nlohmann::json::parse(s.Text(11), nullptr, false);
  if (samples.is_array()) m.samples_s = samples.get<std::vector<double>>();
  m.max_abs_error = s.Double(12);
  m.max_rel_error = s.Double(13);
  m.compile_s = s.Double(14);
  m.compile_flags = s.Text(15);
  m.compiler = s.Text(16);
  m.code_bytes = s.Int(17);
  m.measured_ms = s.Int(18);
  m.resources_json = s.Text(19);
  m.spread = s.Double(20);
  return m;
}

// Columns id, name, target_fp, state, registered_ms, last_seen_ms.
absl::StatusOr<WorkerRow> ReadWorker(const Statement& s) {
  ASSIGN_OR_RETURN(WorkerState state, Parse<WorkerState>(s.Text(3)));
  return WorkerRow{s.Text(0), s.Text(1), s.Text(2), state, s.Int(4), s.Int(5), 0, ""};
}

absl::Status InsertMeasurementRow(Database& db, const MeasurementRow& m) {
  ASSIGN_OR_RETURN(Statement s, db.Prepare(absl::StrCat(
                                    "INSERT INTO measurements(job_id, task_id, candidate_id, kind, workload_key, "
                                    "target_fp, worker_id, status, error, median_s, samples_json, max_abs_error, "
                                    "max_rel_error, compile_s, compile_flags, compiler, code_bytes, measured_ms, "
                                    "resources_json, spread) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")));
  s.Bind(1, m.job_id).Bind(2, m.task_id).Bind(3, m.candidate_id).Bind(4, Name(m.kind)).Bind(5, m.workload_key);
  s.Bind(6, m.target_fp).Bind(7, m.worker_id).Bind(8, Name(m.status)).Bind(9, m.error).Bind(10, m.median_s);
  s.Bind(11, nlohmann::json(m.samples_s).dump()).Bind(12, m.max_abs_error).Bind(13, m.max_rel_error);
  s.Bind(14, m.compile_s).Bind(15, m.compile_flags).Bind(16, m.compiler).Bind(17, m.code_bytes);
  s.Bind(18, m.measured_ms).Bind(19, m.resources_json).Bind(20, m.spread);
  return s.Run();
}

}  // namespace

namespace {

// SQLite's quick_check (every page and index entry, not the cross-checks of
// integrity_check that take longer): DATA_LOSS listing the first problems.
absl::Status CheckIntegrity(Database& db) {
  ASSIGN_OR_RETURN(Statement s, db.Prepare("PRAGMA quick_check(5);"));
  ASSIGN_OR_RETURN(std::vector<std::string> problems, ReadRows(s, [](const Statement& row) { return row.Text(0); }));
  problems.erase(std::remove(problems.begin(), problems.end(), "ok"), problems.end());
  if (problems.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrJoin(problems, "; "));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TuningDb>> TuningDb::Open(const std::string& path) {
  auto opened = Database::Open(path);
  absl::Status st = opened.ok() ? CheckIntegrity(**opened) : opened.status();
  if (absl::IsDataLoss(st)) {
    return absl::DataLossError(absl::StrCat("the tuning database '", path, "' is damaged (", st.message(),
                                            "); fusor will not use it. Restore a backup (fusor db backup) or move "
                                            "the file aside to start an empty one"));
  }
  RETURN_IF_ERROR(st);
  std::unique_ptr<Database> db = std::move(*opened);
  RETURN_IF_ERROR(MigrateDatabase(*db, SchemaMigrations()));
  return std::unique_ptr<TuningDb>(new TuningDb(std::move(db)));
}

TuningDb::Reader::Reader(TuningDb& owner, std::unique_ptr<Database> connection)
    : owner_(owner), connection_(std::move(connection)) {}

TuningDb::Reader::Reader(TuningDb& owner) : owner_(owner), lock_(owner.mu_) {}

TuningDb::Reader::~Reader() {
  if (connection_ == nullptr) return;
  std::lock_guard<std::mutex> lock(owner_.readers_mu_);
  if (owner_.idle_readers_.size() < 16) owner_.idle_readers_.push_back(std::move(connection_));
}

TuningDb::Reader TuningDb::Read() {
  const std::string& path = db_->path();
  if (path.empty() || path == ":memory:") return Reader(*this);
  {
    std::lock_guard<std::mutex> lock(readers_mu_);
    if (!idle_readers_.empty()) {
      std::unique_ptr<Database> connection = std::move(idle_readers_.back());
      idle_readers_.pop_back();
      return Reader(*this, std::move(connection));
    }
  }
  auto opened = Database::OpenReadOnly(path);
  if (!opened.ok()) return Reader(*this);  // the writer's connection reads too
  return Reader(*this, std::move(*opened));
}

absl::Status TuningDb::SetMaxBytes(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return db_->SetMaxPages(std::max<int64_t>(1, bytes / 4096));
}

absl::Status TuningDb::SetQueryOnly(bool query_only) {
  std::lock_guard<std::mutex> lock(mu_);
  return db_->Exec(query_only ? "PRAGMA query_only = 1;" : "PRAGMA query_only = 0;");
}

absl::Status TuningDb::UpsertWorkload(const WorkloadRow& w, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  // A row written by a fusor older than families (sharing the file) gains its family here.
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("INSERT INTO workloads(key, name, canonical_text, chain_json, "
                                             "created_ms, family_key) VALUES (?,?,?,?,?,?) ON CONFLICT(key) DO "
                                             "UPDATE SET family_key = excluded.family_key WHERE "
                                             "workloads.family_key = ''"));
  return s.Bind(1, w.key).Bind(2, w.name).Bind(3, w.canonical_text).Bind(4, w.chain_json).Bind(5, now_ms)
      .Bind(6, w.family_key).Run();
}

namespace {

constexpr char kWorkloadColumns[] = "key, name, canonical_text, chain_json, family_key";

WorkloadRow ReadWorkload(const Statement& s, int at = 0) {
  return WorkloadRow{s.Text(at), s.Text(at + 1), s.Text(at + 2), s.Text(at + 3), s.Text(at + 4)};
}

}  // namespace

absl::StatusOr<WorkloadRow> TuningDb::GetWorkload(const std::string& key) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare(absl::StrCat("SELECT ", kWorkloadColumns, " FROM workloads WHERE key = ?")));
  s.Bind(1, key);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no workload ", key));
  return ReadWorkload(s);
}

absl::StatusOr<std::vector<WorkloadRow>> TuningDb::WorkloadsWithoutFamily() {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s,
                   db->Prepare(absl::StrCat("SELECT ", kWorkloadColumns, " FROM workloads WHERE family_key = ''")));
  return ReadRows(s, [](const Statement& st) -> absl::StatusOr<WorkloadRow> { return ReadWorkload(st); });
}

absl::Status TuningDb::SetWorkloadFamily(const std::string& key, const std::string& family_key) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("UPDATE workloads SET family_key = ? WHERE key = ?"));
  return s.Bind(1, family_key).Bind(2, key).Run();
}

absl::StatusOr<std::vector<FamilyBestRow>> TuningDb::BestsWhere(const std::string& column, const std::string& value,
                                                                const std::string& target_fp, const std::string& salt,
                                                                int limit) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s,
                   db->Prepare(absl::StrCat("SELECT w.key, w.name, w.canonical_text, w.chain_json, w.family_key, "
                                            "b.target_fp, b.salt, b.task_id, b.candidate_id, b.measurement_id, "
                                            "b.median_s FROM best b JOIN workloads w ON w.key = b.workload_key "
                                            "WHERE w.", column, " = ? ORDER BY (b.target_fp = ? AND b.salt = ?) DESC, "
                                            "b.updated_ms DESC LIMIT ?")));
  s.Bind(1, value).Bind(2, target_fp).Bind(3, salt).Bind(4, limit);
  return ReadRows(s, [](const Statement& st) -> absl::StatusOr<FamilyBestRow> {
    return FamilyBestRow{ReadWorkload(st), st.Text(5), st.Text(6),
                         BestRow{st.Text(7), st.Int(8), st.Int(9), st.Double(10)}};
  });
}

absl::StatusOr<std::vector<FamilyBestRow>> TuningDb::BestsOfFamily(const std::string& family_key,
                                                                   const std::string& target_fp,
                                                                   const std::string& salt, int limit) {
  if (family_key.empty()) return std::vector<FamilyBestRow>{};
  return BestsWhere("family_key", family_key, target_fp, salt, limit);
}

absl::StatusOr<std::vector<FamilyBestRow>> TuningDb::BestsNamed(const std::string& name, const std::string& target_fp,
                                                                const std::string& salt, int limit) {
  return BestsWhere("name", name, target_fp, salt, limit);
}

absl::Status TuningDb::UpsertTarget(const TargetRow& t, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare(
                                    "INSERT INTO targets(fingerprint, backend, description_json, first_seen_ms, "
                                    "last_seen_ms) VALUES (?,?,?,?,?) ON CONFLICT(fingerprint) DO UPDATE SET "
                                    "description_json = excluded.description_json, last_seen_ms = excluded.last_seen_ms"));
  return s.Bind(1, t.fingerprint).Bind(2, t.backend).Bind(3, t.description_json).Bind(4, now_ms).Bind(5, now_ms).Run();
}

absl::StatusOr<std::vector<TargetRow>> TuningDb::ListTargets() {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare("SELECT fingerprint, backend, description_json, last_seen_ms FROM "
                                            "targets ORDER BY last_seen_ms DESC"));
  return ReadRows(s, [](const Statement& row) { return TargetRow{row.Text(0), row.Text(1), row.Text(2), row.Int(3)}; });
}

absl::StatusOr<TargetRow> TuningDb::GetTarget(const std::string& fingerprint) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare("SELECT fingerprint, backend, description_json, last_seen_ms FROM "
                                            "targets WHERE fingerprint = ?"));
  s.Bind(1, fingerprint);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("unknown target ", fingerprint));
  return TargetRow{s.Text(0), s.Text(1), s.Text(2), s.Int(3)};
}

absl::Status TuningDb::InsertWorker(const WorkerRow& w) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("INSERT INTO workers(id, name, target_fp, state, registered_ms, "
                                             "last_seen_ms, secret_hash) VALUES (?,?,?,?,?,?,?)"));
  return s.Bind(1, w.id).Bind(2, w.name).Bind(3, w.target_fp).Bind(4, Name(w.state)).Bind(5, w.registered_ms)
      .Bind(6, w.last_seen_ms).Bind(7, w.secret_hash).Run();
}

absl::Status TuningDb::TouchWorker(const std::string& id, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("UPDATE workers SET last_seen_ms = ?, state = ? WHERE id = ?"));
  RETURN_IF_ERROR(s.Bind(1, now_ms).Bind(2, Name(WorkerState::kAlive)).Bind(3, id).Run());
  if (db_->Changes() == 0) return absl::NotFoundError(absl::StrCat("unknown worker '", id, "'"));
  return absl::OkStatus();
}

absl::StatusOr<WorkerRow> TuningDb::GetWorker(const std::string& id) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare("SELECT id, name, target_fp, state, registered_ms, last_seen_ms, "
                                            "secret_hash FROM workers WHERE id = ?"));
  s.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("unknown worker '", id, "'"));
  ASSIGN_OR_RETURN(WorkerRow w, ReadWorker(s));
  w.secret_hash = s.Text(6);
  return w;
}

absl::StatusOr<std::vector<WorkerRow>> TuningDb::ListWorkers(int64_t lost_since_ms) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare(
                                    "SELECT w.id, w.name, w.target_fp, w.state, w.registered_ms, w.last_seen_ms, "
                                    "(SELECT COUNT(*) FROM measurements m WHERE m.worker_id = w.id) FROM workers w "
                                    "WHERE w.state <> ? OR w.last_seen_ms >= ? ORDER BY w.registered_ms"));
  s.Bind(1, Name(WorkerState::kLost)).Bind(2, lost_since_ms);
  return ReadRows(s, [](const Statement& row) -> absl::StatusOr<WorkerRow> {
    ASSIGN_OR_RETURN(WorkerRow w, ReadWorker(row));
    w.jobs_done = static_cast<int>(row.Int(6));
    return w;
  });
}

absl::StatusOr<std::vector<std::string>> TuningDb::AliveTargets() {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare("SELECT DISTINCT target_fp FROM workers WHERE state = ?"));
  s.Bind(1, Name(WorkerState::kAlive));
  return ReadRows(s, [](const Statement& row) { return row.Text(0); });
}

absl::StatusOr<int> TuningDb::MarkLostWorkers(int64_t cutoff_ms, const std::set<std::string>& heard) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(*db_));
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("SELECT id FROM workers WHERE state = ? AND last_seen_ms < ?"));
  s.Bind(1, Name(WorkerState::kAlive)).Bind(2, cutoff_ms);
  ASSIGN_OR_RETURN(std::vector<std::string> silent, ReadRows(s, [](const Statement& row) { return row.Text(0); }));
  int lost = 0;
  for (const std::string& id : silent) {
    if (heard.count(id) > 0) continue;
    ASSIGN_OR_RETURN(Statement u, db_->Prepare("UPDATE workers SET state = ? WHERE id = ?"));
    RETURN_IF_ERROR(u.Bind(1, Name(WorkerState::kLost)).Bind(2, id).Run());
    ++lost;
  }
  RETURN_IF_ERROR(txn.Commit());
  return lost;
}

absl::Status TuningDb::InsertTask(const TaskRow& t) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare(absl::StrCat("INSERT INTO tasks(", kTaskColumns,
                                                          ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")));
  s.Bind(1, t.id).Bind(2, t.workload_key).Bind(3, t.target_fp).Bind(4, t.salt).Bind(5, Name(t.state)).Bind(6, t.budget);
  s.Bind(7, t.batch_size).Bind(8, t.space_size).Bind(9, t.space_after_pruning).Bind(10, t.error);
  s.Bind(11, t.created_ms).Bind(12, t.finished_ms).Bind(13, t.client).Bind(14, t.bandwidth_bytes_per_s);
  s.Bind(15, t.peak_flops).Bind(16, t.cost_model_id).Bind(17, t.transferred_from).Bind(18, t.seeds).Bind(19, t.origin);
  return s.Run();
}

absl::StatusOr<TaskRow> TuningDb::GetTask(const std::string& id) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare(absl::StrCat("SELECT ", kTaskColumns, " FROM tasks WHERE id = ?")));
  s.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no task '", id, "'"));
  return ReadTask(s);
}

absl::StatusOr<std::vector<TaskRow>> TuningDb::ListTasksInState(TaskState state) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare(absl::StrCat("SELECT ", kTaskColumns,
                                                          " FROM tasks WHERE state = ? ORDER BY created_ms")));
  s.Bind(1, Name(state));
  return ReadRows(s, ReadTask);
}

absl::StatusOr<bool> TuningDb::TransferFailed(const std::string& workload_key, const std::string& target_fp,
                                              const std::string& salt, const std::string& source_key) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("SELECT 1 FROM tasks WHERE workload_key = ? AND target_fp = ? AND "
                                             "salt = ? AND transferred_from = ? AND state = ? LIMIT 1"));
  s.Bind(1, workload_key).Bind(2, target_fp).Bind(3, salt).Bind(4, source_key).Bind(5, Name(TaskState::kFailed));
  ASSIGN_OR_RETURN(bool row, s.Step());
  return row;
}

absl::Status TuningDb::FinishTask(const std::string& id, TaskState state, const std::string& error, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(*db_));
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("UPDATE tasks SET state = ?, error = ?, finished_ms = ? WHERE id = ?"));
  RETURN_IF_ERROR(s.Bind(1, Name(state)).Bind(2, error).Bind(3, now_ms).Bind(4, id).Run());
  RETURN_IF_ERROR(FailOpenJobsLocked(id, now_ms));
  return txn.Commit();
}

absl::Status TuningDb::FailOpenJobsLocked(const std::string& task_id, int64_t now_ms) {
  ASSIGN_OR_RETURN(Statement jobs, db_->Prepare("UPDATE jobs SET state = ?, finished_ms = ? WHERE task_id = ? "
                                                "AND state IN (?, ?)"));
  return jobs.Bind(1, Name(JobState::kFailed)).Bind(2, now_ms).Bind(3, task_id).Bind(4, Name(JobState::kQueued))
      .Bind(5, Name(JobState::kLeased)).Run();
}

absl::Status TuningDb::FailOpenJobs(const std::string& task_id, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  return FailOpenJobsLocked(task_id, now_ms);
}

absl::StatusOr<CandidateRow> TuningDb::FindOrInsertCandidateLocked(const CandidateRow& c) {
  ASSIGN_OR_RETURN(Statement find, db_->Prepare(absl::StrCat("SELECT ", kCandidateColumns,
                                                             " FROM candidates WHERE task_id = ? AND schedule = ?")));
  find.Bind(1, c.task_id).Bind(2, c.schedule);
  ASSIGN_OR_RETURN(bool found, find.Step());
  if (found) return ReadCandidate(find);
  ASSIGN_OR_RETURN(Statement ins, db_->Prepare("INSERT INTO candidates(task_id, schedule, mapping, t_mem_s, "
                                               "t_comp_s, alpha, t_estm_s, rank) VALUES (?,?,?,?,?,?,?,?)"));
  ins.Bind(1, c.task_id).Bind(2, c.schedule).Bind(3, c.mapping).Bind(4, c.t_mem_s).Bind(5, c.t_comp_s);
  ins.Bind(6, c.alpha).Bind(7, c.t_estm_s).Bind(8, c.rank);
  RETURN_IF_ERROR(ins.Run());
  CandidateRow row = c;
  row.id = db_->LastInsertRowId();
  return row;
}

absl::StatusOr<CandidateRow> TuningDb::FindOrInsertUnqueuedCandidate(const CandidateRow& c) {
  std::lock_guard<std::mutex> lock(mu_);
  return FindOrInsertCandidateLocked(c);
}

absl::StatusOr<std::pair<CandidateRow, JobRow>> TuningDb::FindOrInsertCandidate(const CandidateRow& c,
                                                                               const std::string& job_id,
                                                                               int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(*db_));
  ASSIGN_OR_RETURN(CandidateRow row, FindOrInsertCandidateLocked(c));
  ASSIGN_OR_RETURN(Statement job, db_->Prepare(absl::StrCat("SELECT ", kJobColumns,
                                                            " FROM jobs WHERE candidate_id = ?")));
  job.Bind(1, row.id);
  ASSIGN_OR_RETURN(bool has_job, job.Step());
  JobRow j;
  if (has_job) {
    ASSIGN_OR_RETURN(j, ReadJob(job));
  } else {
    ASSIGN_OR_RETURN(Statement task, db_->Prepare("SELECT target_fp FROM tasks WHERE id = ?"));
    task.Bind(1, c.task_id);
    ASSIGN_OR_RETURN(bool has_task, task.Step());
    if (!has_task) return absl::NotFoundError(absl::StrCat("no task '", c.task_id, "'"));
    j.id = job_id;
    j.task_id = c.task_id;
    j.kind = JobKind::kCandidate;
    j.candidate_id = row.id;
    j.target_fp = task.Text(0);
    j.state = JobState::kQueued;
    ASSIGN_OR_RETURN(Statement ins, db_->Prepare("INSERT INTO jobs(id, task_id, kind, candidate_id, target_fp, state, "
                                                 "created_ms) VALUES (?,?,?,?,?,?,?)"));
    RETURN_IF_ERROR(ins.Bind(1, j.id).Bind(2, j.task_id).Bind(3, Name(j.kind)).Bind(4, j.candidate_id)
                        .Bind(5, j.target_fp).Bind(6, Name(j.state)).Bind(7, now_ms).Run());
  }
  RETURN_IF_ERROR(txn.Commit());
  return std::make_pair(row, j);
}

absl::StatusOr<CandidateRow> TuningDb::GetCandidate(int64_t id) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare(absl::StrCat("SELECT ", kCandidateColumns,
                                                         " FROM candidates WHERE id = ?")));
  s.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no candidate ", id));
  return ReadCandidate(s);
}

absl::Status TuningDb::InsertJob(const JobRow& j, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("INSERT INTO jobs(id, task_id, kind, candidate_id, target_fp, state, "
                                             "created_ms, not_worker) VALUES (?,?,?,?,?,?,?,NULLIF(?, ''))"));
  return s.Bind(1, j.id).Bind(2, j.task_id).Bind(3, Name(j.kind)).Bind(4, j.candidate_id).Bind(5, j.target_fp)
      .Bind(6, Name(j.state)).Bind(7, now_ms).Bind(8, j.not_worker).Run();
}

absl::StatusOr<JobRow> TuningDb::GetJobLocked(const std::string& id) {
  ASSIGN_OR_RETURN(Statement s, db_->Prepare(absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE id = ?")));
  s.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  return ReadJob(s);
}

absl::StatusOr<JobRow> TuningDb::GetJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  return GetJobLocked(id);
}

absl::StatusOr<std::vector<JobRow>> TuningDb::JobsOfTask(const std::string& task_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare(absl::StrCat("SELECT ", kJobColumns,
                                                          " FROM jobs WHERE task_id = ? ORDER BY created_ms, id")));
  s.Bind(1, task_id);
  return ReadRows(s, ReadJob);
}

absl::StatusOr<std::vector<JobRow>> TuningDb::LeaseJobs(const std::string& worker_id, const std::string& target_fp,
                                                        int max_jobs, int64_t now_ms, int64_t expires_ms,
                                                        const std::function<std::string()>& make_lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(*db_));
  // Fair sharing between clients, one job at a time: the next job is the
  // oldest queued one of the client holding the fewest leased jobs on this
  // target, ties going to the client served longest ago (round robin).
  // Only running tasks' jobs count, so this reads the live queue, not history.
  const std::string pick = absl::StrCat(
      "WITH live AS (SELECT j.*, t.client AS client FROM jobs j JOIN tasks t ON t.id = j.task_id "
      "WHERE t.state = ?2 AND j.target_fp = ?1), "
      "clients AS (SELECT client, SUM(state = ?3) AS leased, MAX(COALESCE(leased_ms, 0)) AS served "
      "FROM live GROUP BY client) "
      "SELECT ", kJobColumns, " FROM live JOIN clients USING (client) WHERE state = ?4 "
      // A job kept from a worker goes to it only when no other live worker of the target is there.
      "AND (not_worker IS NULL OR not_worker <> ?5 OR NOT EXISTS (SELECT 1 FROM workers w WHERE "
      "w.target_fp = ?1 AND w.state = ?6 AND w.id <> ?5)) "
      "ORDER BY clients.leased, clients.served, created_ms, id LIMIT 1");
  std::vector<JobRow> jobs;
  while (static_cast<int>(jobs.size()) < max_jobs) {
    ASSIGN_OR_RETURN(Statement s, db_->Prepare(pick));
    s.Bind(1, target_fp).Bind(2, Name(TaskState::kRunning)).Bind(3, Name(JobState::kLeased));
    s.Bind(4, Name(JobState::kQueued)).Bind(5, worker_id).Bind(6, Name(WorkerState::kAlive));
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    ASSIGN_OR_RETURN(JobRow j, ReadJob(s));
    j.state = JobState::kLeased;
    j.worker_id = worker_id;
    j.lease_id = make_lease_id();
    j.lease_expires_ms = expires_ms;
    j.attempts += 1;
    j.leased_ms = now_ms;
    ASSIGN_OR_RETURN(Statement u, db_->Prepare("UPDATE jobs SET state = ?, worker_id = ?, lease_id = ?, "
                                               "lease_expires_ms = ?, attempts = ?, leased_ms = ? WHERE id = ?"));
    RETURN_IF_ERROR(u.Bind(1, Name(j.state)).Bind(2, j.worker_id).Bind(3, j.lease_id).Bind(4, j.lease_expires_ms)
                        .Bind(5, j.attempts).Bind(6, now_ms).Bind(7, j.id).Run());
    jobs.push_back(std::move(j));
  }
  RETURN_IF_ERROR(txn.Commit());
  return jobs;
}

absl::Status TuningDb::ExtendLeases(const std::string& worker_id, const std::vector<std::string>& lease_ids,
                                    int64_t expires_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(*db_));
  for (const std::string& lease : lease_ids) {
    ASSIGN_OR_RETURN(Statement s, db_->Prepare("UPDATE jobs SET lease_expires_ms = ? WHERE state = ? AND "
                                               "worker_id = ? AND lease_id = ?"));
    RETURN_IF_ERROR(s.Bind(1, expires_ms).Bind(2, Name(JobState::kLeased)).Bind(3, worker_id).Bind(4, lease).Run());
  }
  return txn.Commit();
}

absl::StatusOr<std::vector<std::string>> TuningDb::ExpireLeases(int64_t now_ms, int max_attempts) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(*db_));
  ASSIGN_OR_RETURN(Statement s, db_->Prepare(absl::StrCat("SELECT ", kJobColumns,
                                                          " FROM jobs WHERE state = ? AND lease_expires_ms < ?")));
  s.Bind(1, Name(JobState::kLeased)).Bind(2, now_ms);
  ASSIGN_OR_RETURN(std::vector<JobRow> expired, ReadRows(s, ReadJob));
  std::vector<std::string> tasks;
  for (const JobRow& j : expired) {
    if (j.attempts >= max_attempts) {
      ASSIGN_OR_RETURN(Statement task, db_->Prepare("SELECT workload_key FROM tasks WHERE id = ?"));
      task.Bind(1, j.task_id);
      ASSIGN_OR_RETURN(bool has_task, task.Step());
      MeasurementRow m;
      m.job_id = j.id;
      m.task_id = j.task_id;
      m.candidate_id = j.candidate_id;
      m.kind = j.kind;
      m.workload_key = has_task ? task.Text(0) : "";
      m.target_fp = j.target_fp;
      m.worker_id = j.worker_id;
      m.status = MeasurementStatus::kCrash;
      m.error = absl::StrCat("lease expired ", j.attempts, " times: the workers running it went silent");
      m.measured_ms = now_ms;
      RETURN_IF_ERROR(InsertMeasurementRow(*db_, m));
      ASSIGN_OR_RETURN(Statement u, db_->Prepare("UPDATE jobs SET state = ?, finished_ms = ? WHERE id = ?"));
      RETURN_IF_ERROR(u.Bind(1, Name(JobState::kFailed)).Bind(2, now_ms).Bind(3, j.id).Run());
    } else {
      ASSIGN_OR_RETURN(Statement u, db_->Prepare("UPDATE jobs SET state = ?, worker_id = NULL, "
                                                 "lease_id = NULL, lease_expires_ms = NULL WHERE id = ?"));
      RETURN_IF_ERROR(u.Bind(1, Name(JobState::kQueued)).Bind(2, j.id).Run());
    }
    tasks.push_back(j.task_id);
  }
  RETURN_IF_ERROR(txn.Commit());
  return tasks;
}

absl::StatusOr<RecordResult> TuningDb::RecordMeasurement(const std::string& lease_id, const MeasurementRow& m) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(*db_));
  ASSIGN_OR_RETURN(JobRow job, GetJobLocked(m.job_id));
  // The job's lease, reported by another worker than the one holding it.
  if (!lease_id.empty() && job.lease_id == lease_id && job.worker_id != m.worker_id) {
    return RecordResult{ReportOutcome::kNotYourLease, 0, job};
  }
  // A report again of a finished job: only under the lease it was finished
  // under, by its worker (anything else is someone else's lease, or none).
  if ((job.state == JobState::kDone || job.state == JobState::kFailed) && job.lease_id == lease_id &&
      !lease_id.empty()) {
    return RecordResult{ReportOutcome::kDuplicate, 0, job};
  }
  if (job.state != JobState::kLeased || job.lease_id != lease_id) {
    return RecordResult{ReportOutcome::kStaleLease, 0, job};
  }
  MeasurementRow row = m;
  row.task_id = job.task_id;
  row.candidate_id = job.candidate_id;
  row.kind = job.kind;
  row.target_fp = job.target_fp;
  RETURN_IF_ERROR(InsertMeasurementRow(*db_, row));
  const int64_t id = db_->LastInsertRowId();
  ASSIGN_OR_RETURN(Statement u, db_->Prepare("UPDATE jobs SET state = ?, finished_ms = ? WHERE id = ?"));
  RETURN_IF_ERROR(u.Bind(1, Name(JobState::kDone)).Bind(2, m.measured_ms).Bind(3, m.job_id).Run());
  RETURN_IF_ERROR(txn.Commit());
  return RecordResult{ReportOutcome::kRecorded, id, job};
}

absl::StatusOr<std::vector<MeasurementRow>> TuningDb::MeasurementsOfTask(const std::string& task_id,
                                                                         std::optional<JobKind> kind) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare(absl::StrCat("SELECT ", kMeasurementColumns,
                                                         " FROM measurements WHERE task_id = ? AND (? = '' OR kind = ?)"
                                                         " ORDER BY id")));
  const absl::string_view kind_text = kind ? Name(*kind) : "";
  s.Bind(1, task_id).Bind(2, kind_text).Bind(3, kind_text);
  return ReadRows(s, ReadMeasurement);
}

absl::StatusOr<std::pair<int, int>> TuningDb::CountCandidateMeasurements(const std::string& task_id) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare("SELECT COUNT(*), COALESCE(SUM(status <> ?), 0) FROM measurements "
                                            "WHERE task_id = ? AND kind = ?"));
  s.Bind(1, Name(MeasurementStatus::kOk)).Bind(2, task_id).Bind(3, Name(JobKind::kCandidate));
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::make_pair(0, 0);
  return std::make_pair(static_cast<int>(s.Int(0)), static_cast<int>(s.Int(1)));
}

absl::StatusOr<MeasurementRow> TuningDb::GetMeasurement(int64_t id) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare(absl::StrCat("SELECT ", kMeasurementColumns,
                                                         " FROM measurements WHERE id = ?")));
  s.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no measurement ", id));
  return ReadMeasurement(s);
}

absl::StatusOr<int64_t> TuningDb::CountMeasurements() {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare("SELECT COUNT(*) FROM measurements"));
  ASSIGN_OR_RETURN(bool row, s.Step());
  return row ? s.Int(0) : 0;
}

absl::StatusOr<std::optional<BestRow>> TuningDb::GetBest(const std::string& key, const std::string& fp,
                                                         const std::string& salt) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare("SELECT task_id, candidate_id, measurement_id, median_s FROM best "
                                            "WHERE workload_key = ? AND target_fp = ? AND salt = ?"));
  s.Bind(1, key).Bind(2, fp).Bind(3, salt);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<BestRow>();
  return std::optional<BestRow>(BestRow{s.Text(0), s.Int(1), s.Int(2), s.Double(3)});
}

absl::Status TuningDb::OfferBest(const std::string& key, const std::string& fp, const std::string& salt,
                                 const BestRow& best, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare(
                                    "INSERT INTO best(workload_key, target_fp, salt, task_id, candidate_id, "
                                    "measurement_id, median_s, updated_ms) VALUES (?,?,?,?,?,?,?,?) "
                                    "ON CONFLICT(workload_key, target_fp, salt) DO UPDATE SET "
                                    "task_id = excluded.task_id, candidate_id = excluded.candidate_id, "
                                    "measurement_id = excluded.measurement_id, median_s = excluded.median_s, "
                                    "updated_ms = excluded.updated_ms WHERE excluded.median_s < best.median_s"));
  RETURN_IF_ERROR(s.Bind(1, key).Bind(2, fp).Bind(3, salt).Bind(4, best.task_id).Bind(5, best.candidate_id)
                      .Bind(6, best.measurement_id).Bind(7, best.median_s).Bind(8, now_ms).Run());
  if (db_->Changes() > 0) best_generation_++;  // after the write: a reader holding the old value sees it change
  return absl::OkStatus();
}

// -------------------------------------------------------------- sweeps ---

namespace {

constexpr char kSweepColumns[] =
    "id, name, digest, target_fp, salt, budget, state, created_ms, finished_ms, client";

absl::StatusOr<SweepRow> ReadSweep(const Statement& s) {
  SweepRow w;
  w.id = s.Text(0);
  w.name = s.Text(1);
  w.digest = s.Text(2);
  w.target_fp = s.Text(3);
  w.salt = s.Text(4);
  w.budget = static_cast<int>(s.Int(5));
  ASSIGN_OR_RETURN(w.state, Parse<SweepState>(s.Text(6)));
  w.created_ms = s.Int(7);
  w.finished_ms = s.OptionalInt(8);
  w.client = s.Text(9);
  return w;
}

// Columns idx, model, role, source, instances, workload_key, chain_json.
SweepEntryRow ReadSweepEntry(const Statement& s) {
  return {static_cast<int>(s.Int(0)), s.Text(1), s.Text(2), s.Text(3), static_cast<int>(s.Int(4)), s.Text(5),
          s.Text(6)};
}

}  // namespace

absl::Status TuningDb::CreateSweep(const SweepRow& sweep, const std::vector<SweepEntryRow>& entries,
                                   int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(*db_));
  ASSIGN_OR_RETURN(Statement s, db_->Prepare(absl::StrCat("INSERT INTO sweeps(", kSweepColumns,
                                                          ") VALUES (?,?,?,?,?,?,?,?,?,?)")));
  RETURN_IF_ERROR(s.Bind(1, sweep.id).Bind(2, sweep.name).Bind(3, sweep.digest).Bind(4, sweep.target_fp)
                      .Bind(5, sweep.salt).Bind(6, sweep.budget).Bind(7, Name(sweep.state)).Bind(8, sweep.created_ms)
                      .Bind(9, sweep.finished_ms).Bind(10, sweep.client).Run());
  int ord = 0;
  for (const SweepEntryRow& e : entries) {
    ASSIGN_OR_RETURN(Statement ins, db_->Prepare("INSERT INTO sweep_entries(sweep_id, idx, model, role, source, "
                                                 "instances, workload_key, chain_json) VALUES (?,?,?,?,?,?,?,?)"));
    RETURN_IF_ERROR(ins.Bind(1, sweep.id).Bind(2, e.idx).Bind(3, e.model).Bind(4, e.role).Bind(5, e.source)
                        .Bind(6, e.instances).Bind(7, e.workload_key).Bind(8, e.chain_json).Run());
    ASSIGN_OR_RETURN(Statement chain, db_->Prepare("INSERT OR IGNORE INTO sweep_chains(sweep_id, workload_key, ord, "
                                                   "state, updated_ms) VALUES (?,?,?,?,?)"));
    RETURN_IF_ERROR(chain.Bind(1, sweep.id).Bind(2, e.workload_key).Bind(3, ord)
                        .Bind(4, Name(SweepChainState::kPending)).Bind(5, now_ms).Run());
    ord += db_->Changes();
  }
  return txn.Commit();
}

absl::StatusOr<SweepRow> TuningDb::GetSweep(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare(absl::StrCat("SELECT ", kSweepColumns, " FROM sweeps WHERE id = ?")));
  s.Bind(1, id);
  ASSIGN_OR_RETURN(std::vector<SweepRow> rows, ReadRows(s, ReadSweep));
  if (rows.empty()) return absl::NotFoundError(absl::StrCat("no sweep '", id, "'"));
  return rows.front();
}

absl::StatusOr<std::optional<SweepRow>> TuningDb::FindRunningSweep(const std::string& digest) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare(absl::StrCat("SELECT ", kSweepColumns, " FROM sweeps WHERE digest = ? "
                                                          "AND state = ? ORDER BY created_ms LIMIT 1")));
  s.Bind(1, digest).Bind(2, Name(SweepState::kRunning));
  ASSIGN_OR_RETURN(std::vector<SweepRow> rows, ReadRows(s, ReadSweep));
  if (rows.empty()) return std::optional<SweepRow>();
  return std::optional<SweepRow>(rows.front());
}

absl::StatusOr<std::vector<SweepRow>> TuningDb::ListSweepsInState(SweepState state) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare(absl::StrCat("SELECT ", kSweepColumns,
                                                          " FROM sweeps WHERE state = ? ORDER BY created_ms")));
  s.Bind(1, Name(state));
  return ReadRows(s, ReadSweep);
}

absl::StatusOr<std::vector<SweepEntryRow>> TuningDb::SweepEntries(const std::string& sweep_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("SELECT idx, model, role, source, instances, workload_key, chain_json "
                                             "FROM sweep_entries WHERE sweep_id = ? ORDER BY idx"));
  s.Bind(1, sweep_id);
  return ReadRows(s, ReadSweepEntry);
}

absl::StatusOr<std::vector<SweepChainRow>> TuningDb::SweepChains(const std::string& sweep_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("SELECT workload_key, ord, state, from_cache, COALESCE(task_id, ''), "
                                             "error FROM sweep_chains WHERE sweep_id = ? ORDER BY ord"));
  s.Bind(1, sweep_id);
  return ReadRows(s, [](const Statement& row) -> absl::StatusOr<SweepChainRow> {
    ASSIGN_OR_RETURN(SweepChainState state, Parse<SweepChainState>(row.Text(2)));
    return SweepChainRow{row.Text(0), static_cast<int>(row.Int(1)), state, row.Int(3) != 0, row.Text(4), row.Text(5)};
  });
}

absl::StatusOr<SweepEntryRow> TuningDb::FirstSweepEntry(const std::string& sweep_id,
                                                        const std::string& workload_key) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("SELECT idx, model, role, source, instances, workload_key, chain_json "
                                             "FROM sweep_entries WHERE sweep_id = ? AND workload_key = ? "
                                             "ORDER BY idx LIMIT 1"));
  s.Bind(1, sweep_id).Bind(2, workload_key);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("sweep ", sweep_id, " has no entry for ", workload_key));
  return ReadSweepEntry(s);
}

absl::StatusOr<std::pair<int, double>> TuningDb::SweepTunedSeconds(const std::string& sweep_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare(
                                    "SELECT COUNT(*), COALESCE(SUM(t.finished_ms - t.created_ms), 0) FROM "
                                    "sweep_chains c JOIN tasks t ON t.id = c.task_id WHERE c.sweep_id = ? AND "
                                    "c.state = ? AND c.from_cache = 0 AND t.finished_ms IS NOT NULL"));
  s.Bind(1, sweep_id).Bind(2, Name(SweepChainState::kDone));
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::make_pair(0, 0.0);
  return std::make_pair(static_cast<int>(s.Int(0)), static_cast<double>(s.Int(1)) / 1000);
}

absl::Status TuningDb::UpdateSweepChain(const std::string& sweep_id, const SweepChainRow& chain, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("UPDATE sweep_chains SET state = ?, from_cache = ?, task_id = ?, "
                                             "error = ?, updated_ms = ? WHERE sweep_id = ? AND workload_key = ?"));
  s.Bind(1, Name(chain.state)).Bind(2, chain.from_cache ? 1 : 0);
  if (chain.task_id.empty()) {
    s.BindNull(3);
  } else {
    s.Bind(3, chain.task_id);
  }
  RETURN_IF_ERROR(s.Bind(4, chain.error).Bind(5, now_ms).Bind(6, sweep_id).Bind(7, chain.workload_key).Run());
  if (db_->Changes() != 1) {
    return absl::NotFoundError(absl::StrCat("sweep ", sweep_id, " has no chain ", chain.workload_key));
  }
  return absl::OkStatus();
}

absl::Status TuningDb::FinishSweep(const std::string& id, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("UPDATE sweeps SET state = ?, finished_ms = ? WHERE id = ?"));
  return s.Bind(1, Name(SweepState::kDone)).Bind(2, now_ms).Bind(3, id).Run();
}

}  // namespace fusor::db
