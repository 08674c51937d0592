// Schema versions and step-by-step migrations of the tuning database.
//
// The meta table holds `version` (the schema this database has) and
// `compatible_version` (the oldest schema version whose code can still use
// it). Opening upgrades an older database one step at a time, all steps in
// one transaction, and refuses a database whose compatible_version is newer
// than the last migration this code has.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/db/sqlite.h"

namespace fusor::db {

struct Migration {
  int to_version;              // applying it moves the schema to this version
  int compatible_version;      // the oldest reader of the result
  std::string description;
  std::function<absl::Status(Database&)> apply;
};

// The migrations of this code; the last one's to_version is its schema.
const std::vector<Migration>& SchemaMigrations();

// Brings `db` up to the last migration of `migrations` (which must be in
// ascending to_version order starting at 1). FAILED_PRECONDITION, changing
// nothing, if the database is too new; a failing step rolls back them all.
absl::Status MigrateDatabase(Database& db, const std::vector<Migration>& migrations);

// The schema version recorded in `db` (0 for an empty database).
absl::StatusOr<int> SchemaVersion(Database& db);

}  // namespace fusor::db
