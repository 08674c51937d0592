// Thin RAII wrappers over the SQLite C API. Not thread-safe: one Database
// is used by one thread at a time (TuningDb serializes with a mutex).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusor::db {

class Statement;

// Failures of the storage under a database: out of space, an I/O error, a
// file that cannot be written. Each is logged at error level and counted
// (for the metrics), and comes back as RESOURCE_EXHAUSTED (out of space) or
// UNAVAILABLE with a message saying what to do.
enum class StorageFailure { kFull, kIo, kReadOnly };
int64_t StorageFailures(StorageFailure kind);  // since the process started

class Database {
 public:
  // Opens (creating if needed) the database at `path`; ":memory:" works.
  // Foreign keys on, WAL journal for files, a 5 s busy timeout.
  static absl::StatusOr<std::unique_ptr<Database>> Open(const std::string& path);
  // A read-only connection to an existing database file (WAL lets readers
  // work beside the writer, each on the last commit when it began).
  static absl::StatusOr<std::unique_ptr<Database>> OpenReadOnly(const std::string& path);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  // Runs one or more statements that return no rows.
  absl::Status Exec(const std::string& sql);
  absl::StatusOr<Statement> Prepare(const std::string& sql);
  int64_t LastInsertRowId() const;
  int Changes() const;
  // A consistent copy of the whole database into a new file at `path`
  // (SQLite's online backup: writers carry on meanwhile).
  absl::Status BackupTo(const std::string& path);
  const std::string& path() const { return path_; }
  // Caps the file at `pages` pages (of 4 KiB), as a full disk would: a
  // write beyond fails with SQLITE_FULL. For tests of full-disk handling.
  absl::Status SetMaxPages(int64_t pages);

 private:
  friend class Statement;
  Database(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  // A statement done with, reset, kept for the next Prepare of its SQL.
  void Keep(sqlite3_stmt* stmt);
  sqlite3* db_;
  std::string path_;
  // Prepared statements not in use, by SQL: a statement is prepared once
  // per connection (a Prepare of SQL in use prepares another).
  std::map<std::string, sqlite3_stmt*, std::less<>> idle_;
};

class Statement {
 public:
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&&) = delete;
  ~Statement();

  // Binds are 1-based, as in SQLite. They return *this for chaining.
  Statement& Bind(int index, int64_t value);
  Statement& Bind(int index, int value) { return Bind(index, static_cast<int64_t>(value)); }
  Statement& Bind(int index, double value);
  Statement& Bind(int index, absl::string_view value);
  Statement& BindNull(int index);
  Statement& Bind(int index, const std::optional<int64_t>& value) {
    return value ? Bind(index, *value) : BindNull(index);
  }

  // true when a row is available, false when done.
  absl::StatusOr<bool> Step();
  // Steps to completion, for statements that return no rows.
  absl::Status Run();

  int64_t Int(int column) const;
  double Double(int column) const;
  std::string Text(int column) const;
  bool IsNull(int column) const;
  std::optional<int64_t> OptionalInt(int column) const;

 private:
  friend class Database;
  Statement(Database* owner, sqlite3_stmt* stmt) : owner_(owner), db_(owner->db_), stmt_(stmt) {}
  Database* owner_;
  sqlite3* db_;
  sqlite3_stmt* stmt_;
  int bind_error_ = SQLITE_OK;
};

namespace internal {
template <typename T>
struct RowType {
  using type = T;
};
template <typename T>
struct RowType<absl::StatusOr<T>> {
  using type = T;
};
}  // namespace internal

// Every row `s` steps to, each read by `read(s)`, which returns the row or
// a StatusOr of it (its first error ends the reading).
template <typename Read, typename Result = std::invoke_result_t<Read&, const Statement&>,
          typename Row = typename internal::RowType<Result>::type>
absl::StatusOr<std::vector<Row>> ReadRows(Statement& s, Read read) {
  std::vector<Row> rows;
  while (true) {
    absl::StatusOr<bool> more = s.Step();
    if (!more.ok()) return more.status();
    if (!*more) return rows;
    if constexpr (std::is_same_v<Result, Row>) {
      rows.push_back(read(s));
    } else {
      Result row = read(s);
      if (!row.ok()) return row.status();
      rows.push_back(*std::move(row));
    }
  }
}

// BEGIN IMMEDIATE on creation; ROLLBACK on destruction unless committed.
class Transaction {
 public:
  static absl::StatusOr<Transaction> Begin(Database& db);
  Transaction(Transaction&& other) noexcept;
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction();
  absl::Status Commit();

 private:
  explicit Transaction(Database* db) : db_(db) {}
  Database* db_;
  bool done_ = false;
};

}  // namespace fusor::db
