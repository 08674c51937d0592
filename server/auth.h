// Bearer tokens with roles. A token is "fusor_" and 40 random hex digits;
// the database keeps only its SHA-256. Roles: client (tune, compile,
// lookup, sweep, tasks, workers), worker (register, heartbeat, lease,
// report) and admin (client calls too, and the token commands).
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
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
// only) every call is allowed.
class Authenticator {
 public:
  explicit Authenticator(db::TuningDb* db) : db_(db) {}
  bool enabled() const { return db_ != nullptr; }
  // UNAUTHENTICATED without a valid, unrevoked token; PERMISSION_DENIED
  // when its role is not one of `roles` (admin counts as client). Sets
  // `caller` (when given) to the token's id and name, or, without tokens,
  // to the peer's address without its port.
  grpc::Status Check(const grpc::ServerContext& ctx, std::initializer_list<Role> roles,
                     Caller* caller = nullptr) const;

 private:
  db::TuningDb* db_;
};

}  // namespace fusor::server
