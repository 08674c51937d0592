#include "proto/wire/channel.h"

#include <grpcpp/support/client_interceptor.h>

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/util/files.h"
#include "common/util/log.h"

namespace fusor::wire {
namespace {

class TokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class TokenInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;
};

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& flag, const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", text.status().message()));
  if (text->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is not PEM (no -----BEGIN line)"));
  }
  return *text;
}

bool IsLoopbackAddress(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (absl::StartsWith(host, "ipv4:")) host = host.substr(5);
  return host == "localhost" || absl::StartsWith(host, "127.") || host == "[::1]" || absl::StartsWith(address, "unix:");
}

void DisableMutexDeadlockDetection() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

absl::StatusOr<std::shared_ptr<grpc::Channel>> Dial(const std::string& address, const std::string& token,
                                                    const ClientTls& tls, grpc::ChannelArguments args) {
  DisableMutexDeadlockDetection();
  // A scheduler that restarts is dialled again within seconds (gRPC's own reconnect backoff grows to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(kMaxReconnectBackoffMs));
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (tls.on()) {
    grpc::SslCredentialsOptions options;
    auto read = [](const char* flag, const std::string& path, std::string* out) -> absl::Status {
      if (path.empty()) return absl::OkStatus();
      auto text = ReadPemFile(flag, path);
      if (!text.ok()) return text.status();
      *out = std::move(*text);
      return absl::OkStatus();
    };
    if (tls.cert_file.empty() != tls.key_file.empty()) {
      return absl::InvalidArgumentError("a client certificate needs both --tls-cert and --tls-key");
    }
    if (absl::Status st = read("--tls-ca", tls.ca_file, &options.pem_root_certs); !st.ok()) return st;
    if (absl::Status st = read("--tls-cert", tls.cert_file, &options.pem_cert_chain); !st.ok()) return st;
    if (absl::Status st = read("--tls-key", tls.key_file, &options.pem_private_key); !st.ok()) return st;
    credentials = grpc::SslCredentials(options);
    if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  } else if (!token.empty() && !IsLoopbackAddress(address)) {
    Logger("rpc")->warn("the token goes to {} in plaintext: configure TLS (--tls-ca) for a scheduler on a network",
                        address);
  }
  if (token.empty()) return grpc::CreateCustomChannel(address, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<TokenInterceptorFactory>(token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args, std::move(factories));
}

}  // namespace fusor::wire
