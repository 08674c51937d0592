// Observability: the Prometheus text on /metrics over real HTTP, and the
// standard gRPC health service.
#include "server/metrics.h"
#include "tests/server/prometheus_text.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/generic/generic_stub.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/util/build_info.h"
#include "server/service.h"

namespace fusor::server {
namespace {

using ::testing::HasSubstr;

// A connected socket to 127.0.0.1:port.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// One HTTP exchange with 127.0.0.1:port; the whole response.
std::string Http(int port, const std::string& request) {
  const int fd = Connect(port);
  EXPECT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// A second scheduler on a port one holds fails to start, saying why, as
// the metrics port does; it never shares the port.
TEST(MetricsTest, OneSchedulerPerPort) {
  SchedulerOptions options;
  options.db_path = ":memory:";
  auto first = SchedulerServer::Start(options, "127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = SchedulerServer::Start(options, taken);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("cannot listen on " + taken + ": the port is in use"));
  auto metrics = MetricsServer::Start("127.0.0.1:0", [] { return std::string(); });
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  auto again = MetricsServer::Start("127.0.0.1:" + std::to_string((*metrics)->port()), [] { return std::string(); });
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("Address already in use"));
}

TEST(MetricsTest, ServesPrometheusTextAndHealth) {
  SchedulerOptions options;
  options.db_path = ":memory:";
  auto server = SchedulerServer::Start(options, "");
  ASSERT_TRUE(server.ok()) << server.status();
  Scheduler& core = (*server)->core();
  core.NoteCacheLookup(true);
  core.NoteCacheLookup(true);
  core.NoteCacheLookup(false);
  auto metrics = MetricsServer::Start("127.0.0.1:0", [&] { return RenderMetrics(core); });
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const int port = (*metrics)->port();
  ASSERT_GT(port, 0);

  const std::string ok = Http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_THAT(ok, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(ok, HasSubstr("# TYPE fusor_jobs gauge\nfusor_jobs{state=\"queued\"} 0\n"));
  EXPECT_THAT(ok, HasSubstr("fusor_build_info{version=\"" + Build().version + "\",commit=\""));
  EXPECT_THAT(ok, HasSubstr("fusor_tasks{state=\"running\"} 0\n"));
  EXPECT_THAT(ok, HasSubstr("fusor_cache_lookups_total{result=\"hit\"} 2\n"));
  EXPECT_THAT(ok, HasSubstr("fusor_cache_hit_ratio 0.666667\n"));
  EXPECT_THAT(ok, HasSubstr("fusor_measurements_total{kind=\"candidate\",status=\"crash\"} 0\n"));
  EXPECT_THAT(ok, HasSubstr("fusor_measurements_total{kind=\"confirm\",status=\"noisy\"} 0\n"));
  EXPECT_THAT(ok, HasSubstr("# TYPE fusor_measurement_spread gauge\n"));
  EXPECT_THAT(ok, HasSubstr("# TYPE fusor_rpc_duration_seconds histogram\n"));
  EXPECT_THAT(ok, HasSubstr("# TYPE fusor_task_duration_seconds histogram\n"));
  EXPECT_THAT(ok, HasSubstr("\nprocess_cpu_seconds_total "));
  EXPECT_THAT(ok, HasSubstr("\nprocess_resident_memory_bytes "));
  const size_t body = ok.find("\r\n\r\n") + 4;
  EXPECT_THAT(ok, HasSubstr("Content-Length: " + std::to_string(ok.size() - body) + "\r\n"));
  EXPECT_THAT(fusor::testing::PrometheusTextProblems(ok.substr(body)), ::testing::IsEmpty());

  EXPECT_EQ(Http(port, "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(Http(port, "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  // A client that sends nothing is dropped after its 2 s, then the next is served.
  const int idle = Connect(port);
  EXPECT_EQ(Http(port, "GET /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  close(idle);
  EXPECT_FALSE(MetricsServer::Start("no-port", [] { return std::string(); }).ok());

  // grpc.health.v1.Health/Check for the whole server: SERVING (field 1 = 1).
  grpc::GenericStub stub((*server)->InProcessChannel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::ByteBuffer request, response;
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = s;
                   done = true;
                   cv.notify_all();
                 });
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return done; }));
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  // That call is in the latency histogram of its method.
  lock.unlock();
  EXPECT_THAT(Http(port, "GET /metrics HTTP/1.1\r\n\r\n"),
              HasSubstr("fusor_rpc_duration_seconds_count{method=\"/grpc.health.v1.Health/Check\"} 1\n"));
}

// The format check itself finds what a scraper would refuse.
TEST(MetricsTest, TheFormatCheckFindsBrokenPages) {
  using fusor::testing::PrometheusTextProblems;
  EXPECT_THAT(PrometheusTextProblems("# TYPE a_total counter\na_total 1\n# TYPE h histogram\n"
                                     "h_bucket{x=\"1\",le=\"1\"} 1\nh_bucket{x=\"1\",le=\"+Inf\"} 2\n"
                                     "h_sum{x=\"1\"} 3\nh_count{x=\"1\"} 2\n"),
              ::testing::IsEmpty());
  for (const char* broken : {
           "a 1\n",                                             // no TYPE
           "# TYPE a counter\na 1\n",                          // a counter not ending in _total
           "# TYPE a gauge\na{b=\"x} 1\n",                     // an unterminated label value
           "# TYPE a gauge\na one\n",                          // not a number
           "# TYPE a gauge\na 1\na 2\n",                      // a series twice
           "# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na{x=\"1\"} 1\n",  // a family split
           "# TYPE h histogram\nh_bucket{le=\"2\"} 3\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 2\n",
           "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",  // no +Inf
       }) {
    EXPECT_THAT(PrometheusTextProblems(broken), ::testing::Not(::testing::IsEmpty())) << broken;
  }
}

// A histogram's buckets are cumulative and its counts only grow.
TEST(MetricsTest, HistogramsInSeconds) {
  Histogram h({1, 2});
  for (double s : {0.5, 1.5, 5.0}) h.Observe("a", s);
  std::string out;
  h.Render(out, "t", "k");
  EXPECT_EQ(out,
            "t_bucket{k=\"a\",le=\"1\"} 1\nt_bucket{k=\"a\",le=\"2\"} 2\nt_bucket{k=\"a\",le=\"+Inf\"} 3\n"
            "t_sum{k=\"a\"} 7\nt_count{k=\"a\"} 3\n");
}

}  // namespace
}  // namespace fusor::server
