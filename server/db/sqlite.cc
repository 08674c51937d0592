#include "server/db/sqlite.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"

namespace fusor::db {
namespace {

std::atomic<int64_t> g_storage_failures[3] = {};

std::string FileOf(sqlite3* db) {
  const char* name = db ? sqlite3_db_filename(db, "main") : nullptr;
  return name && *name ? name : "(in memory)";
}

// A failure of the storage itself (a full disk, lost I/O, a file that can
// no longer be written) says what to do, is logged and counted; the SQL
// goes to the log only. Other failures keep SQLite's message.
absl::Status SqliteError(sqlite3* db, int rc, const std::string& what) {
  std::string message = absl::StrCat(what, ": ", db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  std::optional<StorageFailure> failure;
  std::string advice;
  switch (rc & 0xff) {
    case SQLITE_FULL:
      failure = StorageFailure::kFull;
      advice = "is out of space (the disk or its quota is full); free space there, then retry";
      break;
    case SQLITE_IOERR:
      failure = StorageFailure::kIo;
      advice = "had an I/O error; check the disk and the scheduler's log, then retry";
      break;
    case SQLITE_READONLY:
      failure = StorageFailure::kReadOnly;
      advice = "cannot be written (a read-only file, directory or file system); make it writable, then retry";
      break;
    default: break;
  }
  if (failure) {
    g_storage_failures[static_cast<int>(*failure)]++;
    Logger("db")->error("storage failure on {}: {}", FileOf(db), message);
    const std::string text = absl::StrCat("the tuning database ", FileOf(db), " ", advice, "; nothing was recorded");
    return *failure == StorageFailure::kFull ? absl::ResourceExhaustedError(text) : absl::UnavailableError(text);
  }
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return absl::UnavailableError(message);
    case SQLITE_CONSTRAINT: return absl::AlreadyExistsError(message);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB: return absl::DataLossError(message);
    case SQLITE_CANTOPEN:
    case SQLITE_PERM: return absl::PermissionDeniedError(message);
    default: return absl::InternalError(message);
  }
}

// A raw connection to `path`, or the error (the half-open handle closed).
absl::StatusOr<sqlite3*> OpenConnection(const std::string& path, int flags, const std::string& what) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  if (rc == SQLITE_OK) return raw;
  absl::Status st = SqliteError(raw, rc, what);
  sqlite3_close(raw);
  return st;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Database>> Database::Open(const std::string& path) {
  ASSIGN_OR_RETURN(sqlite3 * raw,
                   OpenConnection(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                                  absl::StrCat("cannot open database '", path, "'")));
  std::unique_ptr<Database> db(new Database(raw, path));
  sqlite3_busy_timeout(raw, 5000);
  absl::Status st = db->Exec("PRAGMA foreign_keys = ON;");
  if (!st.ok()) return st;
  if (path != ":memory:") {
    auto stmt = db->Prepare("PRAGMA journal_mode = WAL;");
    if (!stmt.ok()) return stmt.status();
    auto row = stmt->Step();
    if (!row.ok()) return row.status();
    if (*row && stmt->Text(0) != "wal") {
      return absl::FailedPreconditionError(
          absl::StrCat("database '", path, "' cannot use WAL mode (journal mode is ", stmt->Text(0), ")"));
    }
    st = db->Exec("PRAGMA synchronous = NORMAL;");
    if (!st.ok()) return st;
  }
  return db;
}

absl::StatusOr<std::unique_ptr<Database>> Database::OpenReadOnly(const std::string& path) {
  ASSIGN_OR_RETURN(sqlite3 * raw, OpenConnection(path, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX,
                                                 absl::StrCat("cannot open database '", path, "' to read")));
  sqlite3_busy_timeout(raw, 5000);
  return std::unique_ptr<Database>(new Database(raw, path));
}

Database::~Database() {
  for (const auto& [sql, stmt] : idle_) sqlite3_finalize(stmt);
  sqlite3_close(db_);
}

int64_t StorageFailures(StorageFailure kind) { return g_storage_failures[static_cast<int>(kind)]; }

absl::Status Database::SetMaxPages(int64_t pages) {
  return Exec(absl::StrCat("PRAGMA max_page_count = ", pages, ";"));
}

absl::Status Database::BackupTo(const std::string& path) {
  ASSIGN_OR_RETURN(sqlite3 * dest, OpenConnection(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                                                  absl::StrCat("cannot create backup '", path, "'")));
  sqlite3_backup* backup = sqlite3_backup_init(dest, "main", db_, "main");
  if (backup == nullptr) {
    absl::Status st = SqliteError(dest, sqlite3_errcode(dest), absl::StrCat("cannot back up to '", path, "'"));
    sqlite3_close(dest);
    return st;
  }
  // Copies every page in one step (the caller holds the connection for its
  // length); a busy source is retried, each try waiting on the busy
  // timeout, a while.
  int rc = SQLITE_OK;
  for (int tries = 0; tries < 100; ++tries) {
    rc = sqlite3_backup_step(backup, -1);
    if (rc != SQLITE_BUSY && rc != SQLITE_LOCKED && rc != SQLITE_OK) break;
    sqlite3_sleep(50);
  }
  sqlite3_backup_finish(backup);
  absl::Status st = rc == SQLITE_DONE ? absl::OkStatus()
                                      : SqliteError(dest, rc, absl::StrCat("backup to '", path, "' failed"));
  sqlite3_close(dest);
  return st;
}

absl::Status Database::Exec(const std::string& sql) {
  char* error = nullptr;
  int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error);
  if (rc != SQLITE_OK) {
    sqlite3_free(error);  // the connection's message says the same
    // The connection, so that a storage failure names its file.
    return SqliteError(db_, rc, "SQL failed");
  }
  return absl::OkStatus();
}

absl::StatusOr<Statement> Database::Prepare(const std::string& sql) {
  auto it = idle_.find(sql);
  if (it != idle_.end()) {
    sqlite3_stmt* stmt = it->second;
    idle_.erase(it);
    return Statement(this, stmt);
  }
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v3(db_, sql.c_str(), -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, absl::StrCat("cannot prepare '", sql, "'"));
  return Statement(this, stmt);
}

void Database::Keep(sqlite3_stmt* stmt) {
  sqlite3_reset(stmt);
  sqlite3_clear_bindings(stmt);
  if (idle_.size() < 256 && idle_.emplace(sqlite3_sql(stmt), stmt).second) return;
  sqlite3_finalize(stmt);  // another one of the same SQL is kept already
}

int64_t Database::LastInsertRowId() const { return sqlite3_last_insert_rowid(db_); }
int Database::Changes() const { return sqlite3_changes(db_); }

Statement::Statement(Statement&& other) noexcept
    : owner_(other.owner_), db_(other.db_), stmt_(other.stmt_), bind_error_(other.bind_error_) {
  other.stmt_ = nullptr;
}

Statement::~Statement() {
  if (stmt_ != nullptr) owner_->Keep(stmt_);
}

Statement& Statement::Bind(int index, int64_t value) {
  int rc = sqlite3_bind_int64(stmt_, index, value);
  if (rc != SQLITE_OK) bind_error_ = rc;
  return *this;
}

Statement& Statement::Bind(int index, double value) {
  int rc = sqlite3_bind_double(stmt_, index, value);
  if (rc != SQLITE_OK) bind_error_ = rc;
  return *this;
}

Statement& Statement::Bind(int index, absl::string_view value) {
  int rc = sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  if (rc != SQLITE_OK) bind_error_ = rc;
  return *this;
}

Statement& Statement::BindNull(int index) {
  int rc = sqlite3_bind_null(stmt_, index);
  if (rc != SQLITE_OK) bind_error_ = rc;
  return *this;
}

absl::StatusOr<bool> Statement::Step() {
  if (bind_error_ != SQLITE_OK) return SqliteError(db_, bind_error_, "bind failed");
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return SqliteError(db_, rc, absl::StrCat("step failed for '", sqlite3_sql(stmt_), "'"));
}

absl::Status Statement::Run() {
  while (true) {
    auto row = Step();
    if (!row.ok()) return row.status();
    if (!*row) return absl::OkStatus();
  }
}

int64_t Statement::Int(int column) const { return sqlite3_column_int64(stmt_, column); }
double Statement::Double(int column) const { return sqlite3_column_double(stmt_, column); }
std::string Statement::Text(int column) const {
  const unsigned char* text = sqlite3_column_text(stmt_, column);
  return text ? std::string(reinterpret_cast<const char*>(text), sqlite3_column_bytes(stmt_, column)) : "";
}
bool Statement::IsNull(int column) const { return sqlite3_column_type(stmt_, column) == SQLITE_NULL; }
std::optional<int64_t> Statement::OptionalInt(int column) const {
  if (IsNull(column)) return std::nullopt;
  return Int(column);
}

absl::StatusOr<Transaction> Transaction::Begin(Database& db) {
  absl::Status st = db.Exec("BEGIN IMMEDIATE;");
  if (!st.ok()) return st;
  return Transaction(&db);
}

Transaction::Transaction(Transaction&& other) noexcept : db_(other.db_), done_(other.done_) {
  other.done_ = true;
}

Transaction::~Transaction() {
  if (!done_) (void)db_->Exec("ROLLBACK;");
}

absl::Status Transaction::Commit() {
  absl::Status st = db_->Exec("COMMIT;");
  if (st.ok()) done_ = true;
  return st;
}

}  // namespace fusor::db
