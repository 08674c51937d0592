#include "server/metrics.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/build_info.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"

namespace fusor::server {
namespace {

// A label value, escaped as the exposition format wants.
std::string Label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void Family(std::string& out, const char* name, const char* type, const char* help) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

}  // namespace

absl::StatusOr<std::string> RenderMetrics(Scheduler& core) {
  ASSIGN_OR_RETURN(db::DbMetrics m, core.db().Metrics());
  std::string out;
  Family(out, "fusor_build_info", "gauge", "The scheduler's build: always 1, its labels say which.");
  const BuildInfo& build = Build();
  absl::StrAppend(&out, "fusor_build_info{version=\"", Label(build.version), "\",commit=\"",
                  Label(build.commit), "\",compiler=\"", Label(build.compiler), "\"} 1\n");
  Family(out, "fusor_jobs", "gauge", "Jobs by state; queued and leased are the queue.");
  for (db::JobState state : db::kJobStates) {
    absl::StrAppend(&out, "fusor_jobs{state=\"", db::Name(state), "\"} ", m.jobs[state], "\n");
  }
  Family(out, "fusor_tasks", "gauge", "Tuning tasks by state.");
  for (db::TaskState state : db::kTaskStates) {
    absl::StrAppend(&out, "fusor_tasks{state=\"", db::Name(state), "\"} ", m.tasks[state], "\n");
  }
  Family(out, "fusor_sweeps", "gauge", "Sweeps by state.");
  for (db::SweepState state : db::kSweepStates) {
    absl::StrAppend(&out, "fusor_sweeps{state=\"", db::Name(state), "\"} ", m.sweeps[state], "\n");
  }
  Family(out, "fusor_cache_lookups_total", "counter",
         "Cache lookups for requests since the scheduler started, by result.");
  absl::StrAppend(&out, "fusor_cache_lookups_total{result=\"hit\"} ", core.cache_hits(), "\n");
  absl::StrAppend(&out, "fusor_cache_lookups_total{result=\"miss\"} ", core.cache_misses(), "\n");
  const int64_t lookups = core.cache_hits() + core.cache_misses();
  Family(out, "fusor_cache_hit_ratio", "gauge", "Hits over lookups since the scheduler started (0 before any).");
  absl::StrAppend(&out, "fusor_cache_hit_ratio ",
                  absl::StrFormat("%.6g", lookups > 0 ? static_cast<double>(core.cache_hits()) / lookups : 0.0),
                  "\n");
  Family(out, "fusor_quota_refusals_total", "counter",
         "Requests refused with RESOURCE_EXHAUSTED for a per-client limit since the scheduler started, by limit.");
  for (const auto& [name, q] : {std::pair<const char*, Scheduler::Quota>{"tasks", Scheduler::Quota::kTasks},
                                {"candidates", Scheduler::Quota::kCandidates},
                                {"sweeps", Scheduler::Quota::kSweeps}}) {
    absl::StrAppend(&out, "fusor_quota_refusals_total{limit=\"", name, "\"} ", core.quota_refusals(q), "\n");
  }
  Family(out, "fusor_implausible_reports_total", "counter",
         "Worker reports refused as implausible (a time under the chain's physical floor on its target) since the "
         "scheduler started, by worker id.");
  for (const auto& [worker, n] : core.ImplausibleReports()) {
    absl::StrAppend(&out, "fusor_implausible_reports_total{worker=\"", Label(worker), "\"} ", n, "\n");
  }
  Family(out, "fusor_storage_failures_total", "counter",
         "Database writes or reads refused by the storage since the scheduler started, by cause (full: out of "
         "space; io: I/O error; readonly: not writable).");
  for (const auto& [name, f] : {std::pair<const char*, db::StorageFailure>{"full", db::StorageFailure::kFull},
                                {"io", db::StorageFailure::kIo},
                                {"readonly", db::StorageFailure::kReadOnly}}) {
    absl::StrAppend(&out, "fusor_storage_failures_total{cause=\"", name, "\"} ", db::StorageFailures(f), "\n");
  }
  Family(out, "fusor_measurements_total", "counter",
         "Measurements recorded, by kind and status (failures by cause: compile_error, invalid_result, timeout, "
         "crash, runtime_error).");
  // Confirmations and noisy measurements are not series of their own.
  using db::MeasurementStatus;
  for (db::JobKind kind : {db::JobKind::kCandidate, db::JobKind::kBaseline}) {
    for (MeasurementStatus status : {MeasurementStatus::kOk, MeasurementStatus::kCompileError,
                                     MeasurementStatus::kInvalidResult, MeasurementStatus::kTimeout,
                                     MeasurementStatus::kCrash, MeasurementStatus::kRuntimeError}) {
      absl::StrAppend(&out, "fusor_measurements_total{kind=\"", db::Name(kind), "\",status=\"", db::Name(status),
                      "\"} ", m.measurements[{kind, status}], "\n");
    }
  }
  Family(out, "fusor_workers", "gauge", "Workers by target fingerprint and state.");
  for (const auto& [key, n] : m.workers) {
    absl::StrAppend(&out, "fusor_workers{target=\"", Label(key.first), "\",state=\"", db::Name(key.second), "\"} ", n,
                    "\n");
  }
  Family(out, "fusor_measurement_spread", "summary",
         "(max - min) / median of each of the latest ok measurements' timing samples.");
  for (double q : {0.5, 0.9, 0.99}) {
    absl::StrAppend(&out, "fusor_measurement_spread{quantile=\"", q, "\"} ",
                    absl::StrFormat("%.6g", Quantile(m.spreads, q)), "\n");
  }
  double sum = 0;
  for (double s : m.spreads) sum += s;
  absl::StrAppend(&out, "fusor_measurement_spread_sum ", absl::StrFormat("%.6g", sum), "\n");
  absl::StrAppend(&out, "fusor_measurement_spread_count ", m.spreads.size(), "\n");
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, std::function<absl::StatusOr<std::string>()> render, const ServerTls& tls) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not host:port"));
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", address, "': ", gai_strerror(rc)));
  }
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->render_ = std::move(render);
  if (tls.enabled()) {
    auto ctx = MakeSslContext(tls);
    if (!ctx.ok()) return ctx.status();
    s->ssl_ctx_ = std::move(*ctx);
  }
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && s->listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 16) == 0) {
      s->listen_fd_ = fd;
      sockaddr_storage bound{};
      socklen_t len = sizeof(bound);
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      s->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                   : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    } else {
      error = std::strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(found);
  if (s->listen_fd_ < 0) return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ": ", error));
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

MetricsServer::~MetricsServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

void MetricsServer::Loop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    // Every read and write of a connection waits at most 2 s.
    const timeval limit{2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
    if (ssl_ctx_) {
      SSL* ssl = SSL_new(ssl_ctx_.get());
      SSL_set_fd(ssl, fd);
      if (SSL_accept(ssl) == 1) {
        Serve(fd, ssl);
        SSL_shutdown(ssl);
      } else {
        Logger("metrics")->debug("TLS handshake refused or failed");
        ERR_clear_error();
      }
      SSL_free(ssl);
    } else {
      Serve(fd, nullptr);
    }
    close(fd);
  }
}

void MetricsServer::Serve(int fd, SSL* ssl) {
  // The request head, up to 8 KB within 2 s.
  std::string request;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 8192) {
    if (std::chrono::steady_clock::now() >= deadline) return;
    char buf[1024];
    const ssize_t n = ssl ? SSL_read(ssl, buf, sizeof(buf)) : recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;
    request.append(buf, static_cast<size_t>(n));
  }
  const std::string line = request.substr(0, request.find("\r\n"));
  int code = 200;
  std::string body;
  const std::string type = "text/plain; version=0.0.4; charset=utf-8";
  if (line.rfind("GET /metrics ", 0) == 0 || line == "GET /metrics") {
    auto text = render_();
    if (text.ok()) {
      body = std::move(*text);
    } else {
      code = 500;
      body = std::string(text.status().message()) + "\n";
      Logger("metrics")->error("rendering the metrics failed: {}", text.status().ToString());
    }
  } else {
    code = line.rfind("GET ", 0) == 0 ? 404 : 405;
    body = code == 404 ? "not found: try /metrics\n" : "only GET\n";
  }
  const char* reason = code == 200 ? "OK" : code == 404 ? "Not Found" : code == 405 ? "Method Not Allowed"
                                                                                     : "Internal Server Error";
  const std::string head = absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", type,
                                        "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
  const std::string response = head + body;
  for (size_t sent = 0; sent < response.size();) {
    const size_t left = response.size() - sent;
    const ssize_t n = ssl ? SSL_write(ssl, response.data() + sent, static_cast<int>(left))
                          : send(fd, response.data() + sent, left, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

}  // namespace fusor::server
