#include "server/db/schema.h"

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace fusor::db {
namespace {

constexpr char kSchemaV1[] = R"sql(
CREATE TABLE workloads(
  key TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  canonical_text TEXT NOT NULL,
  chain_json TEXT NOT NULL,
  created_ms INTEGER NOT NULL);
CREATE TABLE targets(
  fingerprint TEXT PRIMARY KEY,
  backend TEXT NOT NULL,
  description_json TEXT NOT NULL,
  first_seen_ms INTEGER NOT NULL,
  last_seen_ms INTEGER NOT NULL);
CREATE TABLE workers(
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  target_fp TEXT NOT NULL REFERENCES targets(fingerprint),
  state TEXT NOT NULL,
  registered_ms INTEGER NOT NULL,
  last_seen_ms INTEGER NOT NULL);
CREATE TABLE tasks(
  id TEXT PRIMARY KEY,
  workload_key TEXT NOT NULL REFERENCES workloads(key),
  target_fp TEXT NOT NULL REFERENCES targets(fingerprint),
  salt TEXT NOT NULL,
  state TEXT NOT NULL,
  budget INTEGER NOT NULL,
  batch_size INTEGER NOT NULL,
  space_size INTEGER NOT NULL DEFAULT 0,
  space_after_pruning INTEGER NOT NULL DEFAULT 0,
  error TEXT NOT NULL DEFAULT '',
  created_ms INTEGER NOT NULL,
  finished_ms INTEGER);
CREATE INDEX tasks_by_state ON tasks(state);
CREATE TABLE candidates(
  id INTEGER PRIMARY KEY,
  task_id TEXT NOT NULL REFERENCES tasks(id),
  schedule TEXT NOT NULL,
  mapping TEXT NOT NULL,
  t_mem_s REAL NOT NULL,
  t_comp_s REAL NOT NULL,
  alpha REAL NOT NULL,
  t_estm_s REAL NOT NULL,
  rank INTEGER NOT NULL,
  UNIQUE(task_id, schedule));
CREATE TABLE jobs(
  id TEXT PRIMARY KEY,
  task_id TEXT NOT NULL REFERENCES tasks(id),
  kind TEXT NOT NULL,
  candidate_id INTEGER REFERENCES candidates(id),
  target_fp TEXT NOT NULL,
  state TEXT NOT NULL,
  worker_id TEXT,
  lease_id TEXT,
  lease_expires_ms INTEGER,
  attempts INTEGER NOT NULL DEFAULT 0,
  created_ms INTEGER NOT NULL,
  finished_ms INTEGER);
CREATE INDEX jobs_queue ON jobs(target_fp, state, created_ms);
CREATE INDEX jobs_by_task ON jobs(task_id);
CREATE TABLE measurements(
  id INTEGER PRIMARY KEY,
  job_id TEXT NOT NULL UNIQUE REFERENCES jobs(id),
  task_id TEXT NOT NULL REFERENCES tasks(id),
  candidate_id INTEGER REFERENCES candidates(id),
  kind TEXT NOT NULL,
  workload_key TEXT NOT NULL,
  target_fp TEXT NOT NULL,
  worker_id TEXT NOT NULL,
  status TEXT NOT NULL,
  error TEXT NOT NULL,
  median_s REAL NOT NULL,
  samples_json TEXT NOT NULL,
  max_abs_error REAL NOT NULL,
  max_rel_error REAL NOT NULL,
  compile_s REAL NOT NULL,
  compile_flags TEXT NOT NULL,
  compiler TEXT NOT NULL,
  code_bytes INTEGER NOT NULL,
  measured_ms INTEGER NOT NULL);
CREATE INDEX measurements_by_task ON measurements(task_id);
CREATE TABLE best(
  workload_key TEXT NOT NULL,
  target_fp TEXT NOT NULL,
  salt TEXT NOT NULL,
  task_id TEXT NOT NULL REFERENCES tasks(id),
  candidate_id INTEGER NOT NULL REFERENCES candidates(id),
  measurement_id INTEGER NOT NULL REFERENCES measurements(id),
  median_s REAL NOT NULL,
  updated_ms INTEGER NOT NULL,
  PRIMARY KEY(workload_key, target_fp, salt));
CREATE TABLE baselines(
  workload_key TEXT NOT NULL,
  target_fp TEXT NOT NULL,
  measurement_id INTEGER NOT NULL REFERENCES measurements(id),
  median_s REAL NOT NULL,
  PRIMARY KEY(workload_key, target_fp));
)sql";

// Sweeps over model zoos: the models' chains (entries, in the requester's
// names) and, per distinct canonical key, where the sweep stands with it.
constexpr char kSchemaV3[] = R"sql(
CREATE TABLE sweeps(
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  digest TEXT NOT NULL,
  target_fp TEXT NOT NULL REFERENCES targets(fingerprint),
  salt TEXT NOT NULL,
  budget INTEGER NOT NULL,
  state TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  finished_ms INTEGER);
CREATE INDEX sweeps_by_digest ON sweeps(digest, state);
CREATE TABLE sweep_entries(
  sweep_id TEXT NOT NULL REFERENCES sweeps(id),
  idx INTEGER NOT NULL,
  model TEXT NOT NULL,
  role TEXT NOT NULL,
  source TEXT NOT NULL,
  instances INTEGER NOT NULL,
  workload_key TEXT NOT NULL REFERENCES workloads(key),
  chain_json TEXT NOT NULL,
  PRIMARY KEY(sweep_id, idx));
CREATE TABLE sweep_chains(
  sweep_id TEXT NOT NULL REFERENCES sweeps(id),
  workload_key TEXT NOT NULL REFERENCES workloads(key),
  ord INTEGER NOT NULL,
  state TEXT NOT NULL,
  from_cache INTEGER NOT NULL DEFAULT 0,
  task_id TEXT REFERENCES tasks(id),
  error TEXT NOT NULL DEFAULT '',
  updated_ms INTEGER NOT NULL,
  PRIMARY KEY(sweep_id, workload_key));
)sql";

absl::StatusOr<int> MetaValue(Database& db, const std::string& key) {
  ASSIGN_OR_RETURN(Statement stmt, db.Prepare("SELECT value FROM meta WHERE key = ?"));
  stmt.Bind(1, key);
  ASSIGN_OR_RETURN(bool row, stmt.Step());
  return row ? static_cast<int>(stmt.Int(0)) : 0;
}

absl::Status SetMeta(Database& db, const std::string& key, int value) {
  ASSIGN_OR_RETURN(Statement stmt, db.Prepare("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)"));
  return stmt.Bind(1, key).Bind(2, value).Run();
}

}  // namespace

const std::vector<Migration>& SchemaMigrations() {
  static const auto* migrations = new std::vector<Migration>{
      {1, 1, "tuning database: workloads, targets, workers, tasks, candidates, jobs, measurements, best, baselines",
       [](Database& db) { return db.Exec(kSchemaV1); }},
      // Older fusor (compatible version 1) still reads and writes version 2:
      // the column has a default.
      {2, 1, "measurements.resources_json: a GPU kernel's registers, stack, spills, shared memory and launch",
       [](Database& db) {
         return db.Exec("ALTER TABLE measurements ADD COLUMN resources_json TEXT NOT NULL DEFAULT '';");
       }},
      // New tables only: older fusor goes on reading and writing the rest.
      {3, 1, "sweeps, sweep_entries, sweep_chains: batch sweeps over model zoos",
       [](Database& db) { return db.Exec(kSchemaV3); }},
      {4, 1, "tokens: bearer tokens (stored hashed) and their roles",
       [](Database& db) {
         return db.Exec("CREATE TABLE tokens(id TEXT PRIMARY KEY, name TEXT NOT NULL, role TEXT NOT NULL, "
                        "hash TEXT NOT NULL UNIQUE, created_ms INTEGER NOT NULL, revoked_ms INTEGER);");
       }},
      // Columns with defaults: older fusor goes on reading and writing.
      {5, 1, "tasks.client, sweeps.client, jobs.leased_ms: who asked, for quotas and fair sharing of workers",
       [](Database& db) {
         return db.Exec("ALTER TABLE tasks ADD COLUMN client TEXT NOT NULL DEFAULT '';"
                        "ALTER TABLE sweeps ADD COLUMN client TEXT NOT NULL DEFAULT '';"
                        "ALTER TABLE jobs ADD COLUMN leased_ms INTEGER;");
       }},
      // A column with a default and a new status text ('noisy', which older
      // fusor counts as a failure): older fusor goes on reading and writing.
      // The baselines table is no longer written: a task measures its own.
      {6, 1, "measurements.spread: (p90 - p10) / median of the samples; status 'noisy' beyond the trusted bound",
       [](Database& db) { return db.Exec("ALTER TABLE measurements ADD COLUMN spread REAL NOT NULL DEFAULT 0;"); }},
      // A column with a default: older fusor goes on reading and writing
      // (its workers register without a secret and cannot be bound).
      {7, 1, "workers.secret_hash: the hashed per-registration secret that binds a worker's leases and reports to it",
       [](Database& db) { return db.Exec("ALTER TABLE workers ADD COLUMN secret_hash TEXT NOT NULL DEFAULT '';"); }},
      // Columns with defaults: older fusor goes on reading and writing (its
      // tasks rank with the target's current W and P).
      {8, 1, "tasks.bandwidth_bytes_per_s, tasks.peak_flops: W and P frozen when a task starts",
       [](Database& db) {
         return db.Exec("ALTER TABLE tasks ADD COLUMN bandwidth_bytes_per_s REAL NOT NULL DEFAULT 0;"
                        "ALTER TABLE tasks ADD COLUMN peak_flops REAL NOT NULL DEFAULT 0;");
       }},
      // A new table and a column with a default: older fusor goes on reading
      // and writing (its tasks rank with the analytical model).
      {9, 1, "cost_models: learned cost models per target; tasks.cost_model_id: the one a task ranks with",
       [](Database& db) {
         return db.Exec(
             "CREATE TABLE cost_models(id INTEGER PRIMARY KEY, target_fp TEXT NOT NULL, model_json TEXT NOT NULL, "
             "samples INTEGER NOT NULL, workloads INTEGER NOT NULL, spearman_analytical REAL NOT NULL, "
             "spearman_learned REAL NOT NULL, created_ms INTEGER NOT NULL);"
             "CREATE INDEX cost_models_by_target ON cost_models(target_fp, id);"
             "ALTER TABLE tasks ADD COLUMN cost_model_id INTEGER NOT NULL DEFAULT 0;");
       }},
      // A nullable column: older fusor goes on reading and writing (it may
      // lease a confirmation to the worker that measured the candidate).
      {10, 1, "jobs.not_worker: a worker that must not lease the job (a confirmation's candidate's measurer)",
       [](Database& db) { return db.Exec("ALTER TABLE jobs ADD COLUMN not_worker TEXT;"); }},
      // Columns with defaults: older fusor goes on reading and writing (it
      // neither finds records of other sizes nor transfers their schedules).
      // The scheduler fills the family of the workloads written before.
      {11, 1,
       "workloads.family_key: the key of the chain with its sizes left open (records of other sizes, ranges); "
       "tasks.transferred_from, tasks.seeds: a task that starts from another record's schedule",
       [](Database& db) {
         return db.Exec("ALTER TABLE workloads ADD COLUMN family_key TEXT NOT NULL DEFAULT '';"
                        "CREATE INDEX workloads_by_family ON workloads(family_key);"
                        "CREATE INDEX workloads_by_name ON workloads(name);"
                        "ALTER TABLE tasks ADD COLUMN transferred_from TEXT NOT NULL DEFAULT '';"
                        "ALTER TABLE tasks ADD COLUMN seeds TEXT NOT NULL DEFAULT '';");
       }},
      // A column with a default: older fusor goes on reading and writing
      // (its exports carry no origin; an import says so).
      {12, 1, "tasks.origin: the host and database an imported task was measured in ('' for this one's)",
       [](Database& db) { return db.Exec("ALTER TABLE tasks ADD COLUMN origin TEXT NOT NULL DEFAULT '';"); }},
  };
  return *migrations;
}

absl::StatusOr<int> SchemaVersion(Database& db) {
  RETURN_IF_ERROR(db.Exec("CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);"));
  return MetaValue(db, "version");
}

absl::Status MigrateDatabase(Database& db, const std::vector<Migration>& migrations) {
  const int target = migrations.empty() ? 0 : migrations.back().to_version;
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db));
  ASSIGN_OR_RETURN(int version, SchemaVersion(db));
  ASSIGN_OR_RETURN(int compatible, MetaValue(db, "compatible_version"));
  if (compatible > target || (version > target && compatible == 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "database '", db.path(), "' has schema version ", version, " and needs code that reads version ",
        compatible, " or newer; this fusor reads up to version ", target, ". Upgrade fusor or use another database."));
  }
  if (version >= target) return txn.Commit();
  for (const Migration& m : migrations) {
    if (m.to_version <= version) continue;
    absl::Status st = m.apply(db);
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("migration to schema version ", m.to_version, " (",
                                                  m.description, ") failed: ", st.message()));
    }
    RETURN_IF_ERROR(SetMeta(db, "version", m.to_version));
    RETURN_IF_ERROR(SetMeta(db, "compatible_version", m.compatible_version));
  }
  return txn.Commit();
}

}  // namespace fusor::db
