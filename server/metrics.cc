#include "server/metrics.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

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

// The process's own metrics, as Prometheus' client libraries name them (Linux: /proc).
void RenderProcess(std::string& out) {
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  // The fields after the command name (which may hold spaces) in parentheses; field 3 is the first.
  std::vector<std::string> fields;
  if (const size_t close = stat.rfind(')'); close != std::string::npos) {
    std::istringstream rest(stat.substr(close + 2));
    for (std::string f; rest >> f;) fields.push_back(f);
  }
  auto field = [&](size_t n) { return n - 3 < fields.size() ? std::strtod(fields[n - 3].c_str(), nullptr) : 0.0; };
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  static const double boot_s = [] {  // the machine's boot time: read once
    std::ifstream proc_stat("/proc/stat");
    for (std::string line; std::getline(proc_stat, line);) {
      if (line.rfind("btime ", 0) == 0) return std::strtod(line.c_str() + 6, nullptr);
    }
    return 0.0;
  }();
  int open_fds = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != std::filesystem::end(it);
       it.increment(ec)) {
    ++open_fds;
  }
  rlimit fds{};
  getrlimit(RLIMIT_NOFILE, &fds);
  Family(out, "process_cpu_seconds_total", "counter", "User and system CPU time spent, in seconds.");
  absl::StrAppend(&out, "process_cpu_seconds_total ", absl::StrFormat("%.2f", (field(14) + field(15)) / ticks), "\n");
  Family(out, "process_start_time_seconds", "gauge", "Start time of the process since the Unix epoch, in seconds.");
  absl::StrAppend(&out, "process_start_time_seconds ", absl::StrFormat("%.2f", boot_s + field(22) / ticks), "\n");
  Family(out, "process_virtual_memory_bytes", "gauge", "Virtual memory size, in bytes.");
  absl::StrAppend(&out, "process_virtual_memory_bytes ", absl::StrFormat("%.0f", field(23)), "\n");
  Family(out, "process_resident_memory_bytes", "gauge", "Resident memory size, in bytes.");
  absl::StrAppend(&out, "process_resident_memory_bytes ",
                  absl::StrFormat("%.0f", field(24) * static_cast<double>(sysconf(_SC_PAGESIZE))), "\n");
  Family(out, "process_open_fds", "gauge", "Open file descriptors.");
  absl::StrAppend(&out, "process_open_fds ", open_fds, "\n");
  Family(out, "process_max_fds", "gauge", "The most file descriptors the process may open.");
  absl::StrAppend(&out, "process_max_fds ", static_cast<int64_t>(fds.rlim_cur), "\n");
}

// Records each call's time from its start (the interceptor's creation) to its status.
class LatencyInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit LatencyInterceptor(grpc::experimental::ServerRpcInfo* info)
      : method_(info->method() ? info->method() : "?"), start_(std::chrono::steady_clock::now()) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      RpcLatency().Observe(method_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  const std::chrono::steady_clock::time_point start_;
};

class LatencyInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new LatencyInterceptor(info);
  }
};

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

}  // namespace

void Histogram::Observe(const std::string& label, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  Series& s = series_[label];
  if (s.counts.empty()) s.counts.assign(bounds_.size() + 1, 0);
  ++s.counts[std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin()];
  s.sum += seconds;
}

void Histogram::Render(std::string& out, const std::string& name, const std::string& label) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [value, s] : series_) {
    const std::string labels = absl::StrCat(label, "=\"", Label(value), "\"");
    int64_t cumulative = 0;
    for (size_t i = 0; i <= bounds_.size(); ++i) {
      cumulative += s.counts[i];
      absl::StrAppend(&out, name, "_bucket{", labels, ",le=\"",
                      i < bounds_.size() ? absl::StrFormat("%g", bounds_[i]) : std::string("+Inf"), "\"} ",
                      cumulative, "\n");
    }
    absl::StrAppend(&out, name, "_sum{", labels, "} ", absl::StrFormat("%.6g", s.sum), "\n");
    absl::StrAppend(&out, name, "_count{", labels, "} ", cumulative, "\n");
  }
}

Histogram& RpcLatency() {
  static auto* latency = new Histogram({0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10, 60, 300, 1800});
  return *latency;
}

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> RpcLatencyInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<LatencyInterceptorFactory>());
  return creators;
}

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
         "Measurements recorded, by kind (candidate, baseline, confirm) and status (failures by cause: "
         "compile_error, invalid_result, timeout, crash, runtime_error, noisy).");
  for (db::JobKind kind : db::kJobKinds) {
    for (db::MeasurementStatus status : db::kMeasurementStatuses) {
      absl::StrAppend(&out, "fusor_measurements_total{kind=\"", db::Name(kind), "\",status=\"", db::Name(status),
                      "\"} ", m.measurements[{kind, status}], "\n");
    }
  }
  Family(out, "fusor_workers", "gauge", "Workers by target fingerprint and state.");
  for (const auto& [key, n] : m.workers) {
    absl::StrAppend(&out, "fusor_workers{target=\"", Label(key.first), "\",state=\"", db::Name(key.second), "\"} ", n,
                    "\n");
  }
  // Quantiles of a window, not a summary: its sum and count would fall as the window moves.
  Family(out, "fusor_measurement_spread", "gauge",
         "(max - min) / median of the timing samples of the latest 200 ok measurements: its quantiles.");
  for (double q : {0.5, 0.9, 0.99}) {
    absl::StrAppend(&out, "fusor_measurement_spread{quantile=\"", q, "\"} ",
                    absl::StrFormat("%.6g", Quantile(m.spreads, q)), "\n");
  }
  Family(out, "fusor_rpc_duration_seconds", "histogram",
         "Time of each gRPC call served since the scheduler started, from its start to its status, by method.");
  RpcLatency().Render(out, "fusor_rpc_duration_seconds", "method");
  Family(out, "fusor_task_duration_seconds", "histogram",
         "Time from start to end of each finished tuning task in the database, by final state.");
  Histogram tasks({1, 5, 15, 60, 300, 900, 3600});
  for (const auto& [state, seconds] : m.task_seconds) tasks.Observe(std::string(db::Name(state)), seconds);
  tasks.Render(out, "fusor_task_duration_seconds", "state");
  Family(out, "fusor_queue_wait_seconds", "histogram",
         "Time from a job's queueing to its first lease, by job kind, since the scheduler started.");
  core.queue_wait().Render(out, "fusor_queue_wait_seconds", "kind");
  Family(out, "fusor_job_duration_seconds", "histogram",
         "Time from a lease's start to its accepted report (the worker compiling, validating and timing), by job "
         "kind, since the scheduler started.");
  core.job_duration().Render(out, "fusor_job_duration_seconds", "kind");
  RenderProcess(out);
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

absl::Status MetricsServer::ReloadTls(const ServerTls& tls) {
  if (!tls.enabled()) return absl::OkStatus();
  ASSIGN_OR_RETURN(SslCtxPtr ctx, MakeSslContext(tls));
  std::lock_guard<std::mutex> lock(ssl_mu_);
  ssl_ctx_.swap(ctx);
  return absl::OkStatus();
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
    SSL* ssl = nullptr;
    {
      std::lock_guard<std::mutex> lock(ssl_mu_);
      if (ssl_ctx_) ssl = SSL_new(ssl_ctx_.get());  // holds its own reference to the context
    }
    if (ssl) {
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
