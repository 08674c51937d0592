// The commands on the tuning database: records (export, import), db
// (backup) and admin (token create, list, revoke).
//
// records / db: straight on the database file, no scheduler (a running
// one may keep it: reads and SQLite's online backup do not disturb it).
// records, db and admin: the scheduler's Admin service with --server (an
// admin token), else the --db file itself.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "client/cli_common.h"

namespace fusor::cli {

struct RecordsCommand {
  CLI::App* export_cmd = nullptr;
  CLI::App* import_cmd = nullptr;
  std::string workload_key;
  std::string path;  // written by export (default: standard output), read by import
  std::string output = "text";  // import's -o
};
// export's --target sets g.target_fp.
void AddRecords(CLI::App& app, GlobalOptions& g, RecordsCommand& c);
// The exit status of records export or import; nullopt when neither was given.
std::optional<int> RunRecords(const GlobalOptions& g, const RecordsCommand& c);

struct DbCommand {
  CLI::App* backup = nullptr;
  std::string backup_path;
};
void AddDb(CLI::App& app, DbCommand& c);
// The exit status of db backup; nullopt when it was not given.
std::optional<int> RunDb(const GlobalOptions& g, const DbCommand& c);

struct AdminCommand {
  CLI::App* token_create = nullptr;
  CLI::App* token_list = nullptr;
  CLI::App* token_revoke = nullptr;
  std::string role_name, token_name, token_id;
  std::string output = "text";  // list's -o
};
void AddAdmin(CLI::App& app, AdminCommand& c);
// The exit status of admin token create, list or revoke; nullopt when none
// was given.
std::optional<int> RunAdmin(const GlobalOptions& g, const AdminCommand& c);

}  // namespace fusor::cli
