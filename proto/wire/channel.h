// Client channels to a scheduler: TLS (optionally with a client
// certificate) and the bearer token (when there is one) on every call.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace fusor::wire {

struct ClientTls {
  bool enabled = false;         // TLS on; implied by ca_file
  std::string ca_file;          // PEM roots for the scheduler's certificate (default: the system's)
  std::string cert_file;        // PEM certificate and key for mutual TLS
  std::string key_file;
  std::string server_name;      // name to verify instead of the address's host
  bool on() const { return enabled || !ca_file.empty() || !cert_file.empty(); }
};

// The longest a channel waits before dialling a scheduler that went away
// again (gRPC's default grows to 120 s).
inline constexpr int64_t kMaxReconnectBackoffMs = 2000;

// A channel to host:port that sends `authorization: Bearer <token>` with
// every call when `token` is not empty; it dials a scheduler that went away
// again at least every kMaxReconnectBackoffMs. INVALID_ARGUMENT for
// unreadable or incomplete TLS files. Warns when a token would cross a
// network in plaintext (TLS off, address not loopback).
absl::StatusOr<std::shared_ptr<grpc::Channel>> Dial(const std::string& address, const std::string& token,
                                                    const ClientTls& tls = {},
                                                    grpc::ChannelArguments args = grpc::ChannelArguments());

// The PEM file `path` given by `flag`: INVALID_ARGUMENT naming both when it
// cannot be read or holds no PEM block.
absl::StatusOr<std::string> ReadPemFile(const std::string& flag, const std::string& path);

// Turns off absl::Mutex deadlock detection for the process. Debian's Abseil
// is built with it on, a debugging aid whose lock-graph bookkeeping
// (GraphCycles) took about 2% of a cache-hit call's CPU on either side (gRPC
// takes absl::Mutex locks on every call). Dial and the scheduler's server
// call it.
void DisableMutexDeadlockDetection();

// Whether host:port names this machine (localhost, 127.x, ::1).
bool IsLoopbackAddress(const std::string& address);

}  // namespace fusor::wire
