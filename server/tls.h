// TLS for the scheduler's ports: the gRPC port through gRPC's credentials,
// the metrics port through OpenSSL. Files are PEM.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/tls_certificate_provider.h>
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

// The gRPC port's credentials. With TLS they serve a private copy of the
// operator's files (a 0700 directory under $TMPDIR) that gRPC reads again
// every second; Reload() checks the operator's files as at start and only
// then swaps the copy whole, so a certificate and key replaced on disk are
// served from the next SIGHUP on, never a half-replaced pair or a bad file.
class GrpcServerTls {
 public:
  // INVALID_ARGUMENT naming the file when `tls` does not check out.
  static absl::StatusOr<std::unique_ptr<GrpcServerTls>> Create(const ServerTls& tls);
  ~GrpcServerTls();
  std::shared_ptr<grpc::ServerCredentials> credentials() const { return credentials_; }
  // Reads the files again; on an error the served ones stay. A no-op
  // without TLS.
  absl::Status Reload();

 private:
  GrpcServerTls() = default;
  absl::Status Publish();  // copies the files into a new generation and points `current` at it

  ServerTls tls_;
  std::string dir_;  // empty: no TLS
  int generation_ = 0;
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider_;
  std::shared_ptr<grpc::ServerCredentials> credentials_;
};

}  // namespace fusor::server
