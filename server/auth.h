// Bearer tokens with roles. A token is "fusor_" and 40 random hex digits;
// the database keeps only its SHA-256. Roles: client (tune, compile,
// lookup, sweep, tasks, workers), worker (register, heartbeat, lease,
// report) and admin (client calls too, and the token commands).
#pragma once

#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/db/tuning_db.h"
#include "server/scheduler.h"

namespace fusor::server {

enum class Role { kClient, kWorker, kAdmin };
const char* RoleName(Role role);
// INVALID_ARGUMENT for anything but client, worker, admin.
absl::StatusOr<Role> ParseRole(const std::string& name);

std::string TokenHash(const std::string& token);

// A new token for `role`, stored (hashed) in `db`; returns its row and the
// token, which is shown once and kept nowhere.
absl::StatusOr<std::pair<db::TokenRow, std::string>> CreateToken(db::TuningDb& db, Role role,
                                                                 const std::string& name, int64_t now_ms);

// Checks each call's `authorization: Bearer <token>` metadata against the
// database. Without a database (an embedded scheduler: in-process calls
// only) every call is allowed. A valid token is remembered for
// kTokenRecheck, so a cache hit does not read the database; Forget() drops
// what is remembered (a revocation through this scheduler), and a token
// revoked in the database file directly is refused within kTokenRecheck.
class Authenticator {
 public:
  static constexpr absl::Duration kTokenRecheck = absl::Seconds(1);
  explicit Authenticator(db::TuningDb* db) : db_(db) {}
  bool enabled() const { return db_ != nullptr; }
  // UNAUTHENTICATED without a valid, unrevoked token; PERMISSION_DENIED
  // when its role is not one of `roles` (admin counts as client). Sets
  // `caller` (when given) to the token's id and name, or, without tokens,
  // to the peer's address without its port.
  grpc::Status Check(const grpc::ServerContextBase& ctx, std::initializer_list<Role> roles,
                     Caller* caller = nullptr) const;
  // The same for the value of the call's `authorization` metadata (nullopt:
  // none); needs the database.
  grpc::Status CheckAuthorization(const std::optional<std::string>& authorization,
                                  std::initializer_list<Role> roles, Caller* caller = nullptr) const;
  void Forget() const;

 private:
  struct Remembered {
    db::TokenRow row;
    absl::Time until;
  };
  // The token's row: remembered, or read from the database (nullopt:
  // unknown or revoked).
  absl::StatusOr<std::optional<db::TokenRow>> Find(const std::string& hash) const;

  db::TuningDb* db_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, Remembered> remembered_;  // token hash -> row
};

}  // namespace fusor::server
