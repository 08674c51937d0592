// Client channels to a scheduler, with the bearer token (when there is
// one) on every call.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace fusor::wire {

// A channel to host:port that sends `authorization: Bearer <token>` with
// every call when `token` is not empty. Plaintext (TLS is not built yet).
std::shared_ptr<grpc::Channel> Dial(const std::string& address, const std::string& token,
                                    const grpc::ChannelArguments& args = grpc::ChannelArguments());

}  // namespace fusor::wire
