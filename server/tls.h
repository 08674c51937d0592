// TLS for the scheduler's ports: the gRPC port through gRPC's credentials,
// the metrics port through OpenSSL. Files are PEM.
#pragma once

#include <grpcpp/grpcpp.h>
#include <openssl/ssl.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace fusor::server {

struct ServerTls {
  std::string cert_file;       // the scheduler's certificate chain
  std::string key_file;        // its private key
  std::string client_ca_file;  // when set: mutual TLS, clients must present a certificate this CA signed
  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !client_ca_file.empty(); }
};

struct SslCtxDeleter {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
using SslCtxPtr = std::unique_ptr<SSL_CTX, SslCtxDeleter>;

// An OpenSSL server context for `tls`, which it also checks: both files
// given, readable, PEM, the key matching the certificate, the client CA
// loadable. INVALID_ARGUMENT naming the file otherwise.
absl::StatusOr<SslCtxPtr> MakeSslContext(const ServerTls& tls);

// gRPC server credentials: insecure when `tls` is not enabled.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(const ServerTls& tls);

}  // namespace fusor::server
