#include "server/tls.h"

#include <openssl/err.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <tuple>

#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/str_cat.h"
#include "common/util/files.h"
#include "common/util/status_macros.h"
#include "proto/wire/channel.h"

namespace fusor::server {
namespace {

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

}  // namespace

absl::StatusOr<SslCtxPtr> MakeSslContext(const ServerTls& tls) {
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  for (const auto& [what, path] : {std::pair<std::string, std::string>{"--tls-cert", tls.cert_file},
                                   {"--tls-key", tls.key_file}, {"--tls-client-ca", tls.client_ca_file}}) {
    if (!path.empty()) {
      if (auto pem = wire::ReadPemFile(what, path); !pem.ok()) return pem.status();
    }
  }
  SslCtxPtr ctx(SSL_CTX_new(TLS_server_method()));
  if (!ctx) return absl::InternalError(absl::StrCat("OpenSSL: ", OpenSslError()));
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), tls.cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-cert ", tls.cert_file, ": ", OpenSslError()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), tls.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    if (ERR_GET_REASON(ERR_peek_error()) != X509_R_KEY_VALUES_MISMATCH) {
      return absl::InvalidArgumentError(absl::StrCat("--tls-key ", tls.key_file, ": ", OpenSslError()));
    }
    ERR_clear_error();
  }
  if (SSL_CTX_check_private_key(ctx.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key ", tls.key_file, " does not belong to --tls-cert ", tls.cert_file));
  }
  if (!tls.client_ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx.get(), tls.client_ca_file.c_str(), nullptr) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("--tls-client-ca ", tls.client_ca_file, ": ", OpenSslError()));
    }
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return ctx;
}

absl::StatusOr<std::unique_ptr<GrpcServerTls>> GrpcServerTls::Create(const ServerTls& tls) {
  std::unique_ptr<GrpcServerTls> t(new GrpcServerTls());
  if (!tls.enabled()) {
    t->credentials_ = grpc::InsecureServerCredentials();
    return t;
  }
  t->tls_ = tls;
  if (auto checked = MakeSslContext(tls); !checked.ok()) return checked.status();
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/fusor-tls-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot make a directory like ", pattern, ": ", std::strerror(errno)));
  }
  t->dir_ = pattern;
  RETURN_IF_ERROR(t->Publish());
  const std::string current = t->dir_ + "/current/";
  t->provider_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      current + "key.pem", current + "cert.pem", tls.client_ca_file.empty() ? "" : current + "ca.pem",
      /*refresh_interval_sec=*/1);
  grpc::experimental::TlsServerCredentialsOptions options(t->provider_);
  options.watch_identity_key_cert_pairs();
  if (tls.client_ca_file.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  t->credentials_ = grpc::experimental::TlsServerCredentials(options);
  return t;
}

GrpcServerTls::~GrpcServerTls() {
  credentials_.reset();  // (they hold the provider too)
  provider_.reset();     // its watcher thread stops before its files go
  if (!dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

absl::Status GrpcServerTls::Reload() {
  if (dir_.empty()) return absl::OkStatus();
  if (auto checked = MakeSslContext(tls_); !checked.ok()) return checked.status();
  return Publish();
}

absl::Status GrpcServerTls::Publish() {
  ++generation_;
  const std::string gen = absl::StrCat(dir_, "/", generation_);
  if (mkdir(gen.c_str(), 0700) != 0) {
    return absl::InternalError(absl::StrCat("cannot make ", gen, ": ", std::strerror(errno)));
  }
  for (const auto& [flag, from, to] : {std::tuple<const char*, std::string, const char*>{"--tls-key", tls_.key_file,
                                                                                       "key.pem"},
                                       {"--tls-cert", tls_.cert_file, "cert.pem"},
                                       {"--tls-client-ca", tls_.client_ca_file, "ca.pem"}}) {
    if (from.empty()) continue;
    ASSIGN_OR_RETURN(std::string pem, wire::ReadPemFile(flag, from));
    RETURN_IF_ERROR(WriteFile(absl::StrCat(gen, "/", to), pem));
  }
  // `current` moves in one rename; the generation before stays for a
  // reader that had just followed the old link.
  const std::string link = dir_ + "/current", next = dir_ + "/current.next";
  unlink(next.c_str());
  if (symlink(std::to_string(generation_).c_str(), next.c_str()) != 0 || rename(next.c_str(), link.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot point ", link, " at ", gen, ": ", std::strerror(errno)));
  }
  std::error_code ignored;
  std::filesystem::remove_all(absl::StrCat(dir_, "/", generation_ - 2), ignored);
  return absl::OkStatus();
}

}  // namespace fusor::server
