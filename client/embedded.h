// Embedded mode: a scheduler and a local CPU worker in this process,
// connected over in-process channels (no network port).
#pragma once

#include <memory>
#include <optional>
#include <thread>

#include "absl/status/statusor.h"
#include "server/service.h"
#include "worker/worker.h"

namespace fusor::client {

class Embedded {
 public:
  // Starts the scheduler on `options.db_path` and, unless `worker_options`
  // is empty, one worker; returns once the worker has described,
  // calibrated and registered itself.
  static absl::StatusOr<std::unique_ptr<Embedded>> Start(
      const server::SchedulerOptions& options, const std::optional<worker::WorkerOptions>& worker_options);
  ~Embedded();
  std::shared_ptr<grpc::Channel> channel() { return server_->InProcessChannel(); }

 private:
  Embedded() = default;
  std::unique_ptr<server::SchedulerServer> server_;
  std::unique_ptr<worker::Worker> worker_;
  std::thread worker_thread_;
};

}  // namespace fusor::client
