// Export and import of measurement records (JSON lines), backups, the
// counts behind the metrics and the tokens: how a team moves, merges,
// keeps, watches and guards its tuning database.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/util/files.h"
#include "common/util/status_macros.h"
#include "common/util/timing.h"
#include "proto/wire/convert.h"
#include "server/db/tuning_db.h"

namespace fusor::db {
namespace {

using nlohmann::json;

constexpr char kExportSql[] = R"sql(
SELECT m.job_id, m.kind, m.status, m.error, m.median_s, m.samples_json, m.max_abs_error, m.max_rel_error,
       m.compile_s, m.compile_flags, m.compiler, m.code_bytes, m.resources_json, m.worker_id, m.measured_ms,
       t.id, t.state, t.salt, t.budget, t.batch_size, t.space_size, t.space_after_pruning, t.error, t.created_ms,
       t.finished_ms,
       w.key, w.name, w.canonical_text, w.chain_json,
       g.fingerprint, g.backend, g.description_json,
       c.schedule, c.mapping, c.t_mem_s, c.t_comp_s, c.alpha, c.t_estm_s, c.rank,
       m.id, m.spread, t.origin
FROM measurements m
JOIN tasks t ON t.id = m.task_id
JOIN workloads w ON w.key = m.workload_key
JOIN targets g ON g.fingerprint = m.target_fp
LEFT JOIN candidates c ON c.id = m.candidate_id
WHERE t.state IN (?5, ?6) AND (?1 = '' OR m.target_fp = ?1) AND (?2 = '' OR m.workload_key = ?2)
  AND m.id > ?3
ORDER BY m.id
LIMIT ?4
)sql";

// The origin of an imported task whose export did not say (older fusor).
constexpr char kUnknownOrigin[] = "an export without origin";

// Rows per page of an export: the database lock is released between
// pages, so `line` (which may write to a network) runs outside it.
constexpr int kExportPage = 500;

// A field of a record, or INVALID_ARGUMENT naming it.
template <typename T>
absl::StatusOr<T> Field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return absl::InvalidArgumentError(absl::StrCat("no '", name, "'"));
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' has the wrong type"));
  }
}

struct Record {
  json m, task, workload, target, candidate;
  JobKind kind = JobKind::kCandidate;  // of m
  MeasurementStatus status = MeasurementStatus::kOk;
  TaskState state = TaskState::kDone;  // of task
};

// A confirmation is the task's best candidate measured again at its end.
bool OfCandidate(JobKind kind) { return kind == JobKind::kCandidate || kind == JobKind::kConfirm; }

absl::StatusOr<Record> ParseRecord(const std::string& line) {
  RETURN_IF_ERROR(CheckJsonDepth(line, "record"));
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  Record r;
  r.m = j;
  for (auto [name, part] : {std::pair{"task", &r.task}, {"workload", &r.workload}, {"target", &r.target}}) {
    auto it = j.find(name);
    if (it == j.end() || !it->is_object()) return absl::InvalidArgumentError(absl::StrCat("no '", name, "' object"));
    *part = *it;
  }
  if (auto it = j.find("candidate"); it != j.end() && it->is_object()) r.candidate = *it;
  // Everything the import reads, checked before anything is written.
  for (const char* f : {"job_id", "kind", "status", "worker_id"}) RETURN_IF_ERROR(Field<std::string>(r.m, f).status());
  RETURN_IF_ERROR(Field<double>(r.m, "median_s").status());
  RETURN_IF_ERROR(Field<std::vector<double>>(r.m, "samples_s").status());
  for (const char* f : {"id", "state", "salt"}) RETURN_IF_ERROR(Field<std::string>(r.task, f).status());
  for (const char* f : {"key", "canonical_text", "chain_json"}) {
    RETURN_IF_ERROR(Field<std::string>(r.workload, f).status());
  }
  for (const char* f : {"fingerprint", "backend", "description_json"}) {
    RETURN_IF_ERROR(Field<std::string>(r.target, f).status());
  }
  if (absl::StatusOr<hw::TargetDesc> target = wire::TargetFromJson(r.target["description_json"].get<std::string>());
      !target.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("'target': ", target.status().message()));
  }
  absl::StatusOr<JobKind> kind = Parse<JobKind>(r.m["kind"].get<std::string>());
  if (!kind.ok()) return absl::InvalidArgumentError("'kind' is not candidate, confirm or baseline");
  r.kind = *kind;
  absl::StatusOr<TaskState> state = Parse<TaskState>(r.task["state"].get<std::string>());
  if (!state.ok() || *state == TaskState::kRunning) return absl::InvalidArgumentError("the task is not finished");
  r.state = *state;
  absl::StatusOr<MeasurementStatus> status = Parse<MeasurementStatus>(r.m["status"].get<std::string>());
  if (!status.ok()) return absl::InvalidArgumentError(absl::StrCat("'status': ", status.status().message()));
  r.status = *status;
  if (OfCandidate(r.kind)) {
    if (r.candidate.is_null()) return absl::InvalidArgumentError("a candidate measurement without its 'candidate'");
    RETURN_IF_ERROR(Field<std::string>(r.candidate, "schedule").status());
  }
  return r;
}

template <typename T>
T Or(const json& j, const char* name, T fallback) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    return fallback;
  }
}

// Puts the count in column `count_column` of each row of `sql` into `into`,
// under the key `key` reads from the row. A row whose key does not read (a
// state this fusor does not know) is left out.
template <typename Key, typename ReadKey>
absl::Status CountBy(Database& db, const char* sql, int count_column, const ReadKey& key,
                     std::map<Key, int64_t>& into) {
  ASSIGN_OR_RETURN(Statement s, db.Prepare(sql));
  ASSIGN_OR_RETURN(auto rows, ReadRows(s, [&](const Statement& row) {
                     return std::make_pair(absl::StatusOr<Key>(key(row)), row.Int(count_column));
                   }));
  for (const auto& [k, count] : rows) {
    if (k.ok()) into[*k] = count;
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<T> FirstColumn(const Statement& row) {
  return Parse<T>(row.Text(0));
}

// One exported record: a row of kExportSql as a JSON line; a task of this
// database says it came from `origin`.
std::string RecordLine(const Statement& s, const std::string& origin) {
  json j;
  j["job_id"] = s.Text(0);
  j["kind"] = s.Text(1);
  j["status"] = s.Text(2);
  j["error"] = s.Text(3);
  j["median_s"] = s.Double(4);
  json samples = json::parse(s.Text(5), nullptr, false);
  j["samples_s"] = samples.is_array() ? samples : json::array();
  j["max_abs_error"] = s.Double(6);
  j["max_rel_error"] = s.Double(7);
  j["compile_s"] = s.Double(8);
  j["compile_flags"] = s.Text(9);
  j["compiler"] = s.Text(10);
  j["code_bytes"] = s.Int(11);
  j["resources_json"] = s.Text(12);
  j["worker_id"] = s.Text(13);
  j["measured_ms"] = s.Int(14);
  j["spread"] = s.Double(40);
  j["task"] = {{"id", s.Text(15)},         {"state", s.Text(16)},         {"salt", s.Text(17)},
               {"budget", s.Int(18)},      {"batch_size", s.Int(19)},     {"space_size", s.Int(20)},
               {"space_after_pruning", s.Int(21)}, {"error", s.Text(22)}, {"created_ms", s.Int(23)},
               {"finished_ms", s.Int(24)}, {"origin", s.Text(41).empty() ? origin : s.Text(41)}};
  j["workload"] = {{"key", s.Text(25)}, {"name", s.Text(26)}, {"canonical_text", s.Text(27)},
                   {"chain_json", s.Text(28)}};
  j["target"] = {{"fingerprint", s.Text(29)}, {"backend", s.Text(30)}, {"description_json", s.Text(31)}};
  if (s.IsNull(32)) {
    j["candidate"] = nullptr;
  } else {
    j["candidate"] = {{"schedule", s.Text(32)}, {"mapping", s.Text(33)}, {"t_mem_s", s.Double(34)},
                      {"t_comp_s", s.Double(35)}, {"alpha", s.Double(36)},  {"t_estm_s", s.Double(37)},
                      {"rank", s.Int(38)}};
  }
  return j.dump();
}

}  // namespace

BestOfTask FindBest(const std::vector<MeasurementRow>& rows, double max_spread) {
  std::map<int64_t, const MeasurementRow*> fastest;  // candidate id -> its fastest trusted measurement
  for (const MeasurementRow& m : rows) {
    if (m.kind != JobKind::kCandidate || m.status != MeasurementStatus::kOk || !m.candidate_id) continue;
    const MeasurementRow*& f = fastest[*m.candidate_id];
    if (f == nullptr || m.median_s < f->median_s) f = &m;
  }
  std::map<int64_t, const MeasurementRow*> agreeing;
  std::set<int64_t> refuted;
  for (const MeasurementRow& m : rows) {
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

std::string ExportOrigin(const std::string& db_path) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(db_path, ec);
  return absl::StrCat(host, ":", ec ? db_path : absolute.string());
}

absl::Status TuningDb::ExportRecords(const RecordFilter& filter,
                                     const std::function<void(const std::string&)>& line) {
  int64_t after = 0;  // the last measurement id exported
  while (true) {
    std::vector<std::string> page;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ASSIGN_OR_RETURN(Statement s, db_->Prepare(kExportSql));
      s.Bind(1, filter.target_fp).Bind(2, filter.workload_key).Bind(3, after).Bind(4, kExportPage);
      s.Bind(5, Name(TaskState::kDone)).Bind(6, Name(TaskState::kFailed));
      ASSIGN_OR_RETURN(page, ReadRows(s, [&](const Statement& row) {
                         after = row.Int(39);
                         return RecordLine(row, filter.origin);
                       }));
    }
    for (const std::string& l : page) line(l);
    if (static_cast<int>(page.size()) < kExportPage) return absl::OkStatus();
  }
}

namespace {

// Every record of `lines` (blank ones skipped), or INVALID_ARGUMENT naming
// the first line that is not one: all are read before anything is written.
absl::StatusOr<std::vector<Record>> ParseRecords(const std::vector<std::string>& lines) {
  std::vector<Record> records;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find_first_not_of(" \t\r") == std::string::npos) continue;
    auto r = ParseRecord(lines[i]);
    if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat("line ", i + 1, ": ", r.status().message()));
    records.push_back(std::move(*r));
  }
  return records;
}

// Where a record belongs: its job, workload (key), target (fp) and task.
struct RecordIds {
  std::string job_id, key, fp, task_id;
};

RecordIds IdsOf(const Record& r) {
  return {r.m["job_id"].get<std::string>(), r.workload["key"].get<std::string>(),
          r.target["fingerprint"].get<std::string>(), r.task["id"].get<std::string>()};
}

// Whether the measurement of job `job_id` is here already.
absl::StatusOr<bool> HasMeasurement(Database& db, const std::string& job_id) {
  ASSIGN_OR_RETURN(Statement seen, db.Prepare("SELECT 1 FROM measurements WHERE job_id = ?"));
  seen.Bind(1, job_id);
  return seen.Step();
}

// The record's workload, target and task, each unless here already.
absl::Status InsertWorkloadTargetTask(Database& db, const Record& r, const RecordIds& ids, int64_t measured) {
  ASSIGN_OR_RETURN(Statement w, db.Prepare("INSERT OR IGNORE INTO workloads(key, name, canonical_text, "
                                           "chain_json, created_ms) VALUES (?,?,?,?,?)"));
  RETURN_IF_ERROR(w.Bind(1, ids.key).Bind(2, Or<std::string>(r.workload, "name", ids.key))
                      .Bind(3, r.workload["canonical_text"].get<std::string>())
                      .Bind(4, r.workload["chain_json"].get<std::string>()).Bind(5, measured).Run());
  ASSIGN_OR_RETURN(Statement t, db.Prepare("INSERT OR IGNORE INTO targets(fingerprint, backend, "
                                           "description_json, first_seen_ms, last_seen_ms) VALUES (?,?,?,?,?)"));
  RETURN_IF_ERROR(t.Bind(1, ids.fp).Bind(2, r.target["backend"].get<std::string>())
                      .Bind(3, r.target["description_json"].get<std::string>()).Bind(4, measured)
                      .Bind(5, measured).Run());
  ASSIGN_OR_RETURN(Statement task, db.Prepare(
                                       "INSERT OR IGNORE INTO tasks(id, workload_key, target_fp, salt, state, "
                                       "budget, batch_size, space_size, space_after_pruning, error, created_ms, "
                                       "finished_ms, origin) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"));
  const std::string origin = Or<std::string>(r.task, "origin", "");
  return task.Bind(1, ids.task_id).Bind(2, ids.key).Bind(3, ids.fp).Bind(4, r.task["salt"].get<std::string>())
      .Bind(5, Name(r.state)).Bind(6, Or<int64_t>(r.task, "budget", 0))
      .Bind(7, Or<int64_t>(r.task, "batch_size", 0)).Bind(8, Or<int64_t>(r.task, "space_size", 0))
      .Bind(9, Or<int64_t>(r.task, "space_after_pruning", 0))
      .Bind(10, Or<std::string>(r.task, "error", "")).Bind(11, Or<int64_t>(r.task, "created_ms", measured))
      .Bind(12, Or<int64_t>(r.task, "finished_ms", measured))
      .Bind(13, origin.empty() ? std::string(kUnknownOrigin) : origin)
      .Run();
}

// FAILED_PRECONDITION unless the record's task, as it is here now, is of
// the record's workload and target.
absl::Status CheckTaskOwner(Database& db, const RecordIds& ids) {
  ASSIGN_OR_RETURN(Statement owner, db.Prepare("SELECT workload_key, target_fp FROM tasks WHERE id = ?"));
  owner.Bind(1, ids.task_id);
  ASSIGN_OR_RETURN(bool has_task, owner.Step());
  if (!has_task || owner.Text(0) != ids.key || owner.Text(1) != ids.fp) {
    return absl::FailedPreconditionError(absl::StrCat("job ", ids.job_id, ": task ", ids.task_id,
                                                      " is here already for another workload or target"));
  }
  return absl::OkStatus();
}

// The id of the record's candidate in its task: the one here with the same
// schedule, else a new one.
absl::StatusOr<int64_t> FindOrInsertCandidate(Database& db, const Record& r, const std::string& task_id) {
  const std::string schedule = r.candidate["schedule"];
  ASSIGN_OR_RETURN(Statement find, db.Prepare("SELECT id FROM candidates WHERE task_id = ? AND schedule = ?"));
  find.Bind(1, task_id).Bind(2, schedule);
  ASSIGN_OR_RETURN(bool found, find.Step());
  if (found) return find.Int(0);
  ASSIGN_OR_RETURN(Statement ins, db.Prepare("INSERT INTO candidates(task_id, schedule, mapping, t_mem_s, "
                                             "t_comp_s, alpha, t_estm_s, rank) VALUES (?,?,?,?,?,?,?,?)"));
  RETURN_IF_ERROR(ins.Bind(1, task_id).Bind(2, schedule).Bind(3, Or<std::string>(r.candidate, "mapping", ""))
                      .Bind(4, Or<double>(r.candidate, "t_mem_s", 0)).Bind(5, Or<double>(r.candidate, "t_comp_s", 0))
                      .Bind(6, Or<double>(r.candidate, "alpha", 1)).Bind(7, Or<double>(r.candidate, "t_estm_s", 0))
                      .Bind(8, Or<int64_t>(r.candidate, "rank", 0)).Run());
  return db.LastInsertRowId();
}

// The record's job (done, unless here already) and its measurement.
absl::Status InsertJobAndMeasurement(Database& db, const Record& r, const RecordIds& ids,
                                     std::optional<int64_t> candidate_id, int64_t measured) {
  ASSIGN_OR_RETURN(Statement job, db.Prepare("INSERT OR IGNORE INTO jobs(id, task_id, kind, candidate_id, "
                                             "target_fp, state, worker_id, attempts, created_ms, finished_ms) "
                                             "VALUES (?,?,?,?,?,?,?,1,?,?)"));
  RETURN_IF_ERROR(job.Bind(1, ids.job_id).Bind(2, ids.task_id).Bind(3, Name(r.kind)).Bind(4, candidate_id)
                      .Bind(5, ids.fp).Bind(6, Name(JobState::kDone)).Bind(7, r.m["worker_id"].get<std::string>())
                      .Bind(8, measured).Bind(9, measured).Run());
  ASSIGN_OR_RETURN(Statement m, db.Prepare(
                                    "INSERT INTO measurements(job_id, task_id, candidate_id, kind, workload_key, "
                                    "target_fp, worker_id, status, error, median_s, samples_json, max_abs_error, "
                                    "max_rel_error, compile_s, compile_flags, compiler, code_bytes, measured_ms, "
                                    "resources_json, spread) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"));
  return m.Bind(1, ids.job_id).Bind(2, ids.task_id).Bind(3, candidate_id).Bind(4, Name(r.kind)).Bind(5, ids.key)
      .Bind(6, ids.fp).Bind(7, r.m["worker_id"].get<std::string>()).Bind(8, Name(r.status))
      .Bind(9, Or<std::string>(r.m, "error", "")).Bind(10, r.m["median_s"].get<double>())
      .Bind(11, r.m["samples_s"].dump()).Bind(12, Or<double>(r.m, "max_abs_error", 0))
      .Bind(13, Or<double>(r.m, "max_rel_error", 0)).Bind(14, Or<double>(r.m, "compile_s", 0))
      .Bind(15, Or<std::string>(r.m, "compile_flags", "")).Bind(16, Or<std::string>(r.m, "compiler", ""))
      .Bind(17, Or<int64_t>(r.m, "code_bytes", 0)).Bind(18, measured)
      .Bind(19, Or<std::string>(r.m, "resources_json", ""))
      .Bind(20, r.m.contains("spread") ? r.m["spread"].get<double>()
                                       : Summarize(r.m["samples_s"].get<std::vector<double>>()).spread)
      .Run();
}

// Adds one record: its workload, target, task and candidate where they are
// not here yet, then its job and measurement. False, adding nothing, when
// its measurement is here already.
absl::StatusOr<bool> ImportRecord(Database& db, const Record& r, int64_t now_ms) {
  const RecordIds ids = IdsOf(r);
  ASSIGN_OR_RETURN(bool duplicate, HasMeasurement(db, ids.job_id));
  if (duplicate) return false;
  const int64_t measured = Or<int64_t>(r.m, "measured_ms", now_ms);
  RETURN_IF_ERROR(InsertWorkloadTargetTask(db, r, ids, measured));
  RETURN_IF_ERROR(CheckTaskOwner(db, ids));
  std::optional<int64_t> candidate_id;
  if (OfCandidate(r.kind)) {
    ASSIGN_OR_RETURN(candidate_id, FindOrInsertCandidate(db, r, ids.task_id));
  }
  RETURN_IF_ERROR(InsertJobAndMeasurement(db, r, ids, candidate_id, measured));
  return true;
}

using BestKey = std::tuple<std::string, std::string, std::string>;  // workload key, target, salt

// The best record per (workload, target, salt) in `touched`, by the
// scheduler's rule: in each finished task here the confirmed best
// (FindBest), the fastest of them offered as an answer, replacing a slower
// one only; how many best records changed.
absl::StatusOr<int> UpdateBestRecords(Database& db, const std::set<BestKey>& touched, double max_spread,
                                      int64_t now_ms) {
  int updated = 0;
  for (const auto& [key, fp, salt] : touched) {
    ASSIGN_OR_RETURN(Statement rows, db.Prepare(
                                         "SELECT m.id, m.task_id, m.candidate_id, m.kind, m.status, m.median_s "
                                         "FROM measurements m JOIN tasks t ON t.id = m.task_id WHERE "
                                         "m.workload_key = ? AND m.target_fp = ? AND t.salt = ? AND t.state = ? "
                                         "AND m.kind IN (?, ?) ORDER BY m.task_id, m.id"));
    rows.Bind(1, key).Bind(2, fp).Bind(3, salt).Bind(4, Name(TaskState::kDone));
    rows.Bind(5, Name(JobKind::kCandidate)).Bind(6, Name(JobKind::kConfirm));
    std::map<std::string, std::vector<MeasurementRow>> by_task;
    while (true) {
      ASSIGN_OR_RETURN(bool more, rows.Step());
      if (!more) break;
      MeasurementRow m;
      m.id = rows.Int(0);
      m.task_id = rows.Text(1);
      m.candidate_id = rows.OptionalInt(2);
      ASSIGN_OR_RETURN(m.kind, Parse<JobKind>(rows.Text(3)));
      ASSIGN_OR_RETURN(m.status, Parse<MeasurementStatus>(rows.Text(4)));
      m.median_s = rows.Double(5);
      by_task[m.task_id].push_back(std::move(m));
    }
    std::optional<BestRow> fastest;
    for (const auto& [task_id, measured] : by_task) {
      const MeasurementRow* confirmed = FindBest(measured, max_spread).confirmation;
      if (confirmed == nullptr || !(confirmed->median_s > 0)) continue;
      if (!fastest || confirmed->median_s < fastest->median_s) {
        fastest = BestRow{task_id, *confirmed->candidate_id, confirmed->id, confirmed->median_s};
      }
    }
    if (!fastest) continue;
    ASSIGN_OR_RETURN(Statement set, db.Prepare(
                                        "INSERT INTO best(workload_key, target_fp, salt, task_id, candidate_id, "
                                        "measurement_id, median_s, updated_ms) VALUES (?,?,?,?,?,?,?,?) "
                                        "ON CONFLICT(workload_key, target_fp, salt) DO UPDATE SET "
                                        "task_id = excluded.task_id, candidate_id = excluded.candidate_id, "
                                        "measurement_id = excluded.measurement_id, median_s = excluded.median_s, "
                                        "updated_ms = excluded.updated_ms WHERE excluded.median_s < best.median_s"));
    RETURN_IF_ERROR(set.Bind(1, key).Bind(2, fp).Bind(3, salt).Bind(4, fastest->task_id)
                        .Bind(5, fastest->candidate_id).Bind(6, fastest->measurement_id)
                        .Bind(7, fastest->median_s).Bind(8, now_ms).Run());
    updated += db.Changes();
  }
  return updated;
}

}  // namespace

absl::StatusOr<ImportStats> TuningDb::ImportRecords(const std::vector<std::string>& lines, int64_t now_ms,
                                                    double max_spread) {
  ASSIGN_OR_RETURN(std::vector<Record> records, ParseRecords(lines));
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(*db_));
  ImportStats stats;
  std::set<BestKey> touched;
  for (const Record& r : records) {
    ++stats.records;
    ASSIGN_OR_RETURN(bool added, ImportRecord(*db_, r, now_ms));
    if (!added) {
      ++stats.duplicates;
      continue;
    }
    ++stats.added;
    touched.emplace(r.workload["key"].get<std::string>(), r.target["fingerprint"].get<std::string>(),
                    r.task["salt"].get<std::string>());
  }
  ASSIGN_OR_RETURN(stats.best_updated, UpdateBestRecords(*db_, touched, max_spread, now_ms));
  RETURN_IF_ERROR(txn.Commit());
  if (stats.best_updated > 0) best_generation_++;
  return stats;
}

absl::StatusOr<DbMetrics> TuningDb::Metrics(int recent) {
  std::lock_guard<std::mutex> lock(mu_);
  DbMetrics out;
  RETURN_IF_ERROR(CountBy(*db_, "SELECT state, COUNT(*) FROM jobs GROUP BY state", 1, FirstColumn<JobState>, out.jobs));
  RETURN_IF_ERROR(
      CountBy(*db_, "SELECT state, COUNT(*) FROM tasks GROUP BY state", 1, FirstColumn<TaskState>, out.tasks));
  RETURN_IF_ERROR(
      CountBy(*db_, "SELECT state, COUNT(*) FROM sweeps GROUP BY state", 1, FirstColumn<SweepState>, out.sweeps));
  RETURN_IF_ERROR(CountBy(
      *db_, "SELECT kind, status, COUNT(*) FROM measurements GROUP BY kind, status", 2,
      [](const Statement& row) -> absl::StatusOr<std::pair<JobKind, MeasurementStatus>> {
        ASSIGN_OR_RETURN(JobKind kind, Parse<JobKind>(row.Text(0)));
        ASSIGN_OR_RETURN(MeasurementStatus status, Parse<MeasurementStatus>(row.Text(1)));
        return std::make_pair(kind, status);
      },
      out.measurements));
  RETURN_IF_ERROR(CountBy(
      *db_, "SELECT target_fp, state, COUNT(*) FROM workers GROUP BY target_fp, state", 2,
      [](const Statement& row) -> absl::StatusOr<std::pair<std::string, WorkerState>> {
        ASSIGN_OR_RETURN(WorkerState state, Parse<WorkerState>(row.Text(1)));
        return std::make_pair(row.Text(0), state);
      },
      out.workers));
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("SELECT samples_json, median_s FROM measurements WHERE status = ? "
                                             "AND median_s > 0 ORDER BY id DESC LIMIT ?"));
  s.Bind(1, Name(MeasurementStatus::kOk)).Bind(2, recent);
  ASSIGN_OR_RETURN(auto latest,
                   ReadRows(s, [](const Statement& row) { return std::make_pair(row.Text(0), row.Double(1)); }));
  for (const auto& [samples_json, median_s] : latest) {
    json samples = json::parse(samples_json, nullptr, false);
    if (!samples.is_array() || samples.empty()) continue;
    double lo = 0, hi = 0;
    bool first = true;
    for (const json& x : samples) {
      if (!x.is_number()) continue;
      const double v = x.get<double>();
      lo = first ? v : std::min(lo, v);
      hi = first ? v : std::max(hi, v);
      first = false;
    }
    if (!first) out.spreads.push_back((hi - lo) / median_s);
  }
  ASSIGN_OR_RETURN(Statement tasks, db_->Prepare("SELECT state, finished_ms - created_ms FROM tasks WHERE "
                                                 "finished_ms IS NOT NULL AND state != ?"));
  tasks.Bind(1, Name(TaskState::kRunning));
  ASSIGN_OR_RETURN(out.task_seconds, ReadRows(tasks, [](const Statement& row) -> absl::StatusOr<std::pair<TaskState, double>> {
                     ASSIGN_OR_RETURN(TaskState state, Parse<TaskState>(row.Text(0)));
                     return std::make_pair(state, static_cast<double>(row.Int(1)) / 1000);
                   }));
  return out;
}

namespace {

TokenRow ReadToken(const Statement& s) {
  return {s.Text(0), s.Text(1), s.Text(2), s.Text(3), s.Int(4), s.OptionalInt(5)};
}

}  // namespace

absl::Status TuningDb::InsertToken(const TokenRow& t) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("INSERT INTO tokens(id, name, role, hash, created_ms) VALUES (?,?,?,?,?)"));
  return s.Bind(1, t.id).Bind(2, t.name).Bind(3, t.role).Bind(4, t.hash).Bind(5, t.created_ms).Run();
}

absl::StatusOr<std::vector<TokenRow>> TuningDb::ListTokens() {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("SELECT id, name, role, hash, created_ms, revoked_ms FROM tokens "
                                             "ORDER BY created_ms"));
  return ReadRows(s, ReadToken);
}

absl::Status TuningDb::RevokeToken(const std::string& id, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("UPDATE tokens SET revoked_ms = COALESCE(revoked_ms, ?) WHERE id = ?"));
  RETURN_IF_ERROR(s.Bind(1, now_ms).Bind(2, id).Run());
  if (db_->Changes() == 0) return absl::NotFoundError(absl::StrCat("no token '", id, "'"));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<TokenRow>> TuningDb::FindToken(const std::string& hash) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare("SELECT id, name, role, hash, created_ms, revoked_ms FROM tokens "
                                            "WHERE hash = ?"));
  s.Bind(1, hash);
  ASSIGN_OR_RETURN(std::vector<TokenRow> rows, ReadRows(s, ReadToken));
  if (rows.empty()) return std::optional<TokenRow>();
  return std::optional<TokenRow>(rows.front());
}

absl::StatusOr<int64_t> TuningDb::CountActiveTokens() {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("SELECT COUNT(*) FROM tokens WHERE revoked_ms IS NULL"));
  ASSIGN_OR_RETURN(bool row, s.Step());
  return row ? s.Int(0) : 0;
}

absl::Status TuningDb::BackupTo(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  return db_->BackupTo(path);
}

}  // namespace fusor::db
