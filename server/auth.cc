#include "server/auth.h"

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"
#include "common/util/text.h"

namespace fusor::server {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kClient: return "client";
    case Role::kWorker: return "worker";
    case Role::kAdmin: return "admin";
  }
  return "?";
}

absl::StatusOr<Role> ParseRole(const std::string& name) {
  for (Role r : {Role::kClient, Role::kWorker, Role::kAdmin}) {
    if (name == RoleName(r)) return r;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown role '", name, "' (client, worker or admin)"));
}

std::string TokenHash(const std::string& token) { return Sha256Hex(token); }

absl::StatusOr<std::pair<db::TokenRow, std::string>> CreateToken(db::TuningDb& db, Role role,
                                                                 const std::string& name, int64_t now_ms) {
  RETURN_IF_ERROR(CheckName(name, "token"));  // listed and logged
  unsigned char bytes[26];
  std::ifstream random("/dev/urandom", std::ios::binary);
  if (!random.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) {
    return absl::InternalError("cannot read /dev/urandom");
  }
  static const char kHex[] = "0123456789abcdef";
  std::string secret, id = "tok-";
  for (size_t i = 0; i < sizeof(bytes); ++i) {
    std::string& into = i < 20 ? secret : id;
    into += kHex[bytes[i] >> 4];
    into += kHex[bytes[i] & 15];
  }
  const std::string token = "fusor_" + secret;
  db::TokenRow row{id, name, RoleName(role), TokenHash(token), now_ms, std::nullopt};
  RETURN_IF_ERROR(db.InsertToken(row));
  return std::make_pair(row, token);
}

grpc::Status Authenticator::Check(const grpc::ServerContextBase& ctx, std::initializer_list<Role> roles,
                                  Caller* caller) const {
  if (db_ == nullptr) {
    if (caller != nullptr) {
      // "ipv4:127.0.0.1:5000" -> "ipv4:127.0.0.1"; in-process calls have no port.
      std::string peer = ctx.peer();
      const size_t colon = peer.rfind(':');
      if (colon != std::string::npos && colon > peer.find(':')) peer.resize(colon);
      caller->id = caller->name = peer.empty() ? "local" : peer;
    }
    return grpc::Status::OK;
  }
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return CheckAuthorization(std::nullopt, roles, caller);
  return CheckAuthorization(std::string(it->second.data(), it->second.size()), roles, caller);
}

grpc::Status Authenticator::CheckAuthorization(const std::optional<std::string>& authorization,
                                               std::initializer_list<Role> roles, Caller* caller) const {
  if (!authorization) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this scheduler needs a token: pass --token (or FUSOR_TOKEN); an admin creates one with "
                        "`fusor admin token create`");
  }
  const std::string& value = *authorization;
  if (!absl::StartsWith(value, "Bearer ")) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "authorization is not 'Bearer <token>'");
  }
  auto token = Find(TokenHash(value.substr(7)));
  if (!token.ok()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(token.status().message()));
  if (!token->has_value()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "unknown or revoked token");
  }
  const std::string& role = (*token)->role;
  for (Role r : roles) {
    if (role == RoleName(r) || (r == Role::kClient && role == RoleName(Role::kAdmin))) {
      if (caller != nullptr) *caller = {(*token)->id, (*token)->name};
      return grpc::Status::OK;
    }
  }
  std::string wanted;
  for (Role r : roles) absl::StrAppend(&wanted, wanted.empty() ? "" : " or ", RoleName(r));
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      absl::StrCat("token '", (*token)->name, "' has role ", role, "; this call needs ", wanted));
}

absl::StatusOr<std::optional<db::TokenRow>> Authenticator::Find(const std::string& hash) const {
  const absl::Time now = absl::Now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = remembered_.find(hash);
    if (it != remembered_.end() && now < it->second.until) return it->second.row;
  }
  ASSIGN_OR_RETURN(std::optional<db::TokenRow> row, db_->FindToken(hash));
  if (row && row->revoked_ms) row.reset();
  std::lock_guard<std::mutex> lock(mu_);
  if (!row) {
    remembered_.erase(hash);
    return row;
  }
  // Only tokens found valid are remembered, so unknown ones cannot fill
  // the map; it is emptied once it holds more than any team has tokens.
  if (remembered_.size() >= 4096) remembered_.clear();
  remembered_[hash] = {*row, now + kTokenRecheck};
  return row;
}

void Authenticator::Forget() const {
  std::lock_guard<std::mutex> lock(mu_);
  remembered_.clear();
}

}  // namespace fusor::server
