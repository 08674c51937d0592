#include "client/cli_database.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/util/files.h"
#include "common/util/paths.h"
#include "common/util/timing.h"
#include "server/auth.h"
#include "server/db/tuning_db.h"
#include "server/service.h"

namespace fusor::cli {
namespace {

absl::StatusOr<std::unique_ptr<fusor::client::AdminClient>> RemoteAdmin(const GlobalOptions& g) {
  auto channel = DialServer(g);
  if (!channel.ok()) return channel.status();
  return std::make_unique<fusor::client::AdminClient>(*channel);
}

// The database, created if missing (import, tokens).
absl::StatusOr<std::unique_ptr<fusor::db::TuningDb>> OpenOrCreate(const GlobalOptions& g) {
  if (absl::Status st = fusor::EnsureParentDirectory(g.db_path); !st.ok()) return st;
  return fusor::db::TuningDb::Open(g.db_path);
}

absl::StatusOr<std::unique_ptr<fusor::db::TuningDb>> OpenExisting(const GlobalOptions& g) {
  if (!std::filesystem::is_regular_file(g.db_path)) {
    return absl::NotFoundError(absl::StrCat("no tuning database at ", g.db_path));
  }
  return fusor::db::TuningDb::Open(g.db_path);
}

int ExportRecords(const GlobalOptions& g, const std::string& workload, const std::string& out_path) {
  std::ofstream file;
  if (!out_path.empty()) {
    file.open(out_path, std::ios::trunc);
    if (!file) return Fail(absl::PermissionDeniedError(absl::StrCat("cannot write ", out_path)));
  }
  std::ostream& out = out_path.empty() ? std::cout : file;
  int64_t n = 0;
  auto write = [&](const std::string& line) {
    out << line << '\n';
    ++n;
  };
  absl::Status st;
  if (!g.server.empty()) {
    auto admin = RemoteAdmin(g);
    if (!admin.ok()) return Fail(admin.status());
    fusor::v1::ExportRecordsRequest req;
    req.set_target_fingerprint(g.target_fp);
    req.set_workload_key(workload);
    st = (*admin)->ExportRecords(req, write);
  } else {
    auto db = OpenExisting(g);
    if (!db.ok()) return Fail(db.status());
    st = (*db)->ExportRecords({g.target_fp, workload, fusor::db::ExportOrigin(g.db_path)}, write);
  }
  if (!st.ok()) return Fail(st);
  out.flush();
  if (!out) return Fail(absl::InternalError("writing the records failed"));
  std::cerr << "exported " << n << " measurement records" << (out_path.empty() ? "" : " to " + out_path) << "\n";
  return 0;
}

int ImportRecords(const GlobalOptions& g, const std::string& path, bool json) {
  const nlohmann::json which = {{"file", path}};
  auto text = fusor::ReadFile(path, fusor::server::kMaxImportBytes);  // what the scheduler takes in one import
  if (!text.ok()) return Fail(text.status(), json, which);
  std::vector<std::string> lines = absl::StrSplit(*text, '\n');
  fusor::db::ImportStats stats;
  if (!g.server.empty()) {
    auto admin = RemoteAdmin(g);
    if (!admin.ok()) return Fail(admin.status(), json, which);
    auto resp = (*admin)->ImportRecords(lines);
    if (!resp.ok()) {
      return Fail(absl::Status(resp.status().code(), absl::StrCat(path, ": ", resp.status().message())), json, which);
    }
    stats = {resp->records(), resp->added(), resp->duplicates(), resp->best_updated()};
  } else {
    auto db = OpenOrCreate(g);
    if (!db.ok()) return Fail(db.status(), json, which);
    auto local = (*db)->ImportRecords(lines, NowMs(), g.max_spread > 0 ? g.max_spread : fusor::kMaxSpread);
    if (!local.ok()) {
      return Fail(absl::Status(local.status().code(), absl::StrCat(path, ": ", local.status().message())), json, which);
    }
    stats = *local;
  }
  if (json) {
    nlohmann::json j = which;
    j.update({{"into", g.server.empty() ? g.db_path : g.server}, {"records", stats.records}, {"added", stats.added},
              {"duplicates", stats.duplicates}, {"best_updated", stats.best_updated}});
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::cout << absl::StrFormat("imported %s into %s: %d records, %d new measurements, %d already here, "
                               "%d best records changed\n",
                               path, g.server.empty() ? g.db_path : g.server, stats.records, stats.added,
                               stats.duplicates, stats.best_updated);
  return 0;
}

int Backup(const GlobalOptions& g, const std::string& to) {
  if (std::filesystem::exists(to)) return Fail(absl::AlreadyExistsError(absl::StrCat(to, " exists; not overwritten")));
  if (!g.server.empty()) {
    // Streamed into TO.part, renamed once whole and checked.
    auto admin = RemoteAdmin(g);
    if (!admin.ok()) return Fail(admin.status());
    const std::string part = to + ".part";
    std::ofstream out(part, std::ios::binary | std::ios::trunc);
    if (!out) return Fail(absl::PermissionDeniedError(absl::StrCat("cannot write ", part)));
    absl::Status st = (*admin)->Backup([&](const std::string& chunk) {
      return static_cast<bool>(out.write(chunk.data(), static_cast<std::streamsize>(chunk.size())));
    });
    out.close();
    if (st.ok() && !out) st = absl::InternalError(absl::StrCat("writing ", part, " failed"));
    if (!st.ok()) {
      std::filesystem::remove(part);
      return Fail(st);
    }
    std::filesystem::rename(part, to);
  } else {
    auto db = OpenExisting(g);
    if (!db.ok()) return Fail(db.status());
    if (absl::Status st = (*db)->BackupTo(to); !st.ok()) return Fail(st);
  }
  auto copy = fusor::db::TuningDb::Open(to);  // checks the copy's integrity
  if (!copy.ok()) return Fail(copy.status());
  auto n = (*copy)->CountMeasurements();
  if (!n.ok()) return Fail(n.status());
  std::cout << "backed up " << (g.server.empty() ? g.db_path : g.server) << " to " << to << " (" << *n
            << " measurements, " << std::filesystem::file_size(to) << " bytes, integrity checked)\n";
  return 0;
}

// Where the tokens are: the scheduler's Admin service (admin) with
// --server, else the --db file (db).
struct TokenStore {
  std::unique_ptr<fusor::db::TuningDb> db;
  std::unique_ptr<fusor::client::AdminClient> admin;
};

absl::StatusOr<TokenStore> OpenTokenStore(const GlobalOptions& g) {
  TokenStore store;
  if (!g.server.empty()) {
    auto remote = RemoteAdmin(g);
    if (!remote.ok()) return remote.status();
    store.admin = std::move(*remote);
  } else {
    auto local = OpenOrCreate(g);
    if (!local.ok()) return local.status();
    store.db = std::move(*local);
  }
  return store;
}

int CreateToken(const TokenStore& store, const std::string& role_name, const std::string& name) {
  std::string token_id, token;
  if (store.admin) {
    auto created = store.admin->CreateToken(role_name, name);
    if (!created.ok()) return Fail(created.status());
    token_id = created->info().id();
    token = created->token();
  } else {
    auto role = fusor::server::ParseRole(role_name);
    if (!role.ok()) return Fail(role.status());
    auto created = fusor::server::CreateToken(*store.db, *role, name, NowMs());
    if (!created.ok()) return Fail(created.status());
    token_id = created->first.id;
    token = created->second;
  }
  std::cerr << "token " << token_id << " (" << role_name << ", '" << name
            << "'); it is shown once, only its hash is kept:\n";
  std::cout << token << "\n";
  return 0;
}

int RevokeToken(const TokenStore& store, const std::string& id) {
  absl::Status st = store.admin ? store.admin->RevokeToken(id) : store.db->RevokeToken(id, NowMs());
  if (!st.ok()) return Fail(st);
  std::cout << "revoked " << id << "\n";
  return 0;
}

void PrintTokens(const std::vector<fusor::db::TokenRow>& tokens, bool json) {
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& t : tokens) {
      list.push_back({{"id", t.id}, {"role", t.role}, {"name", t.name}, {"created_unix_ms", t.created_ms},
                      {"revoked_unix_ms", t.revoked_ms.value_or(0)}});
    }
    std::cout << nlohmann::json{{"tokens", list}}.dump() << std::endl;
    return;
  }
  std::cout << absl::StrFormat("%-30s %-7s %-24s %s\n", "ID", "ROLE", "NAME", "STATE");
  for (const auto& t : tokens) {
    std::cout << absl::StrFormat("%-30s %-7s %-24s %s\n", t.id, t.role, t.name, t.revoked_ms ? "revoked" : "active");
  }
}

int ListTokens(const TokenStore& store, bool json) {
  std::vector<fusor::db::TokenRow> tokens;
  if (store.admin) {
    auto list = store.admin->ListTokens();
    if (!list.ok()) return Fail(list.status(), json);
    for (const auto& t : list->tokens()) {
      tokens.push_back({t.id(), t.name(), t.role(), "", t.created_unix_ms(),
                        t.revoked_unix_ms() ? std::optional<int64_t>(t.revoked_unix_ms()) : std::nullopt});
    }
  } else {
    auto list = store.db->ListTokens();
    if (!list.ok()) return Fail(list.status(), json);
    tokens = std::move(*list);
  }
  PrintTokens(tokens, json);
  return 0;
}

}  // namespace

void AddRecords(CLI::App& app, GlobalOptions& g, RecordsCommand& c) {
  CLI::App* records = app.add_subcommand("records", "measurement records of --db as JSON lines, for moving and "
                                                    "merging tuning databases");
  records->require_subcommand(1);
  c.export_cmd = records->add_subcommand("export", "write every measurement of finished tasks");
  c.export_cmd->add_option("--target", g.target_fp, "only this target fingerprint");
  c.export_cmd->add_option("--workload", c.workload_key, "only this workload key");
  c.export_cmd->add_option("-o,--out", c.path, "file to write (default: standard output)");
  c.import_cmd = records->add_subcommand(
      "import", "add records to --db (all or nothing; ones already here are skipped; best records recomputed)");
  c.import_cmd->add_option("file", c.path, "records file (JSON lines)")->required()->check(CLI::ExistingFile);
  AddOutputOption(c.import_cmd, c.output);
}

std::optional<int> RunRecords(const GlobalOptions& g, const RecordsCommand& c) {
  if (*c.export_cmd) return ExportRecords(g, c.workload_key, c.path);
  if (*c.import_cmd) return ImportRecords(g, c.path, c.output == "json");
  return std::nullopt;
}

void AddDb(CLI::App& app, DbCommand& c) {
  CLI::App* db = app.add_subcommand("db", "maintenance of the tuning database file (--db)");
  db->require_subcommand(1);
  c.backup = db->add_subcommand("backup", "a consistent copy, also while a scheduler uses the database");
  c.backup->add_option("to", c.backup_path, "new file")->required();
}

std::optional<int> RunDb(const GlobalOptions& g, const DbCommand& c) {
  if (*c.backup) return Backup(g, c.backup_path);
  return std::nullopt;
}

void AddAdmin(CLI::App& app, AdminCommand& c) {
  CLI::App* admin = app.add_subcommand("admin", "administration of --db (on the scheduler's host)");
  admin->require_subcommand(1);
  CLI::App* token = admin->add_subcommand("token", "bearer tokens of the scheduler on --db");
  token->require_subcommand(1);
  c.token_create = token->add_subcommand("create", "print a new token (shown once; only its hash is kept)");
  c.token_create->add_option("--role", c.role_name, "client, worker or admin")->required();
  c.token_create->add_option("--name", c.token_name, "who or what holds it")->required();
  c.token_list = token->add_subcommand("list", "the tokens, their roles and whether revoked");
  AddOutputOption(c.token_list, c.output);
  c.token_revoke = token->add_subcommand("revoke", "refuse a token from now on");
  c.token_revoke->add_option("id", c.token_id, "token id (from list)")->required();
}

std::optional<int> RunAdmin(const GlobalOptions& g, const AdminCommand& c) {
  if (!*c.token_create && !*c.token_list && !*c.token_revoke) return std::nullopt;
  auto store = OpenTokenStore(g);
  if (!store.ok()) return Fail(store.status());
  if (*c.token_create) return CreateToken(*store, c.role_name, c.token_name);
  if (*c.token_list) return ListTokens(*store, c.output == "json");
  return RevokeToken(*store, c.token_id);
}

}  // namespace fusor::cli
