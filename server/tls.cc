#include "server/tls.h"

#include <openssl/err.h>
#include <openssl/x509.h>

#include "absl/strings/str_cat.h"
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

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(const ServerTls& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  if (auto checked = MakeSslContext(tls); !checked.ok()) return checked.status();
  auto cert = wire::ReadPemFile("--tls-cert", tls.cert_file);
  auto key = wire::ReadPemFile("--tls-key", tls.key_file);
  if (!cert.ok()) return cert.status();
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(tls.client_ca_file.empty()
                                                ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.client_ca_file.empty()) {
    auto ca = wire::ReadPemFile("--tls-client-ca", tls.client_ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  return grpc::SslServerCredentials(options);
}

}  // namespace fusor::server
