// Observability of fusor-scheduler: Prometheus metrics in the text
// exposition format, served over HTTP (or HTTPS) at /metrics.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "server/histogram.h"
#include "server/scheduler.h"
#include "server/tls.h"

namespace fusor::server {

// The time of every gRPC call the scheduler served, by method, from its
// start to its status (RpcLatencyInterceptors records it).
Histogram& RpcLatency();
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> RpcLatencyInterceptors();

// The build; queue depth (jobs by state), tasks and sweeps by state, cache
// lookups (hits, misses), quota refusals by limit, measurements by kind and
// status (candidates measured per second is
// rate(fusor_measurements_total{kind="candidate"}[1m]); failures by cause
// are its non-ok statuses), workers by target and state, the spread of the
// latest measurements' samples; histograms of RPC latency by method, of
// finished tasks' durations by state, and of jobs' queue wait and lease
// time by kind; and the process's own process_*
// metrics (CPU time, memory, file descriptors, start time).
absl::StatusOr<std::string> RenderMetrics(Scheduler& core);

// A minimal HTTP/1.1 server: GET /metrics answers `render()`, anything
// else 404; one connection at a time, each bounded in time and size.
// HTTPS when `tls` is enabled (with client certificates required when it
// names a client CA).
class MetricsServer {
 public:
  // `address` is host:port (port 0 picks one).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                             std::function<absl::StatusOr<std::string>()> render,
                                                             const ServerTls& tls = {});
  ~MetricsServer();
  int port() const { return port_; }
  // The certificate, key and client CA of `tls` read again (for the next
  // connection); on an error the ones in use stay. A no-op without TLS.
  absl::Status ReloadTls(const ServerTls& tls);

 private:
  MetricsServer() = default;
  void Loop();
  void Serve(int fd, SSL* ssl);

  std::function<absl::StatusOr<std::string>()> render_;
  std::mutex ssl_mu_;
  SslCtxPtr ssl_ctx_;  // null: plain HTTP
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace fusor::server
