#include "client/embedded.h"

#include <chrono>

#include "common/util/log.h"

namespace fusor::client {

absl::StatusOr<std::unique_ptr<Embedded>> Embedded::Start(
    const server::SchedulerOptions& options, const std::optional<worker::WorkerOptions>& worker_options) {
  std::unique_ptr<Embedded> e(new Embedded());
  auto server = server::SchedulerServer::Start(options, "");
  if (!server.ok()) return server.status();
  e->server_ = std::move(*server);
  if (!worker_options) return e;
  e->worker_ = std::make_unique<worker::Worker>(e->server_->InProcessChannel(), *worker_options);
  if (absl::Status st = e->worker_->Prepare(); !st.ok()) return st;
  worker::Worker* w = e->worker_.get();
  e->worker_thread_ = std::thread([w] {
    absl::Status st = w->Run();
    if (!st.ok()) Logger("worker")->error("embedded worker stopped: {}", st.ToString());
  });
  // Wait (bounded) until the worker has registered its target, so
  // requests made right away find it.
  for (int i = 0; i < 400; ++i) {
    if (w->registered()) return e;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return absl::DeadlineExceededError("the embedded worker did not register within 10 s");
}

Embedded::~Embedded() {
  if (worker_) worker_->Stop();
  if (worker_thread_.joinable()) worker_thread_.join();
  worker_.reset();
  server_.reset();
}

}  // namespace fusor::client
