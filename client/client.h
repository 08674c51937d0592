// The fusor client library: calls a scheduler over a channel (remote, or
// the in-process channel of an embedded scheduler).
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "fusor/v1/admin.grpc.pb.h"
#include "fusor/v1/scheduler.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "proto/wire/retry.h"

namespace fusor::client {

class Client {
 public:
  explicit Client(std::shared_ptr<grpc::Channel> channel, wire::RetryPolicy retry = {});

  // Streams the tuning of one workload; `on_event` sees every event, the
  // last of which carries the result. `deadline` bounds the whole call.
  absl::StatusOr<v1::TuneResult> Tune(const v1::TuneRequest& request,
                                      const std::function<void(const v1::TuneEvent&)>& on_event,
                                      absl::Duration deadline);
  absl::StatusOr<v1::CompileResponse> Compile(const v1::CompileRequest& request, absl::Duration deadline);
  // Idempotent calls retry on UNAVAILABLE.
  // The result (and, when asked, why it is not the workload's own record);
  // NOT_FOUND on a miss unless the request asks to explain it.
  absl::StatusOr<v1::LookupResponse> Lookup(const v1::LookupRequest& request);
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers();
  absl::StatusOr<v1::TaskInfo> GetTask(const std::string& task_id);
  // The scheduler's grpc.health.v1 status (one attempt, for probes).
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Health(absl::Duration deadline);
  // Starts or resumes a sweep and follows it: `on_event` sees every event.
  // Returns the report, or (detach) the started event's sweep with an
  // empty report. The sweep goes on in the scheduler if this call ends.
  absl::StatusOr<v1::SweepReport> Sweep(const v1::SweepRequest& request,
                                        const std::function<void(const v1::SweepEvent&)>& on_event,
                                        absl::Duration deadline);

 private:
  std::unique_ptr<v1::Scheduler::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  wire::RetryPolicy retry_;
};

// The Admin service of a scheduler (admin-role token).
class AdminClient {
 public:
  explicit AdminClient(std::shared_ptr<grpc::Channel> channel) : stub_(v1::Admin::NewStub(channel)) {}
  absl::StatusOr<v1::CreateTokenResponse> CreateToken(const std::string& role, const std::string& name);
  absl::StatusOr<v1::ListTokensResponse> ListTokens();
  absl::Status RevokeToken(const std::string& id);
  // `line` sees every record line.
  absl::Status ExportRecords(const v1::ExportRecordsRequest& request,
                             const std::function<void(const std::string&)>& line);
  absl::StatusOr<v1::ImportRecordsResponse> ImportRecords(const std::vector<std::string>& lines);
  // `chunk` sees the database copy's bytes in order; false stops.
  absl::Status Backup(const std::function<bool(const std::string&)>& chunk);

 private:
  std::unique_ptr<v1::Admin::Stub> stub_;
};

// Reads a workload file (chain text, or JSON of a fusor.v1.Workload or
// Chain) into a Workload message, sending text as text so the scheduler
// reports errors with line and column.
absl::StatusOr<v1::Workload> ReadWorkloadFile(const std::string& path);

}  // namespace fusor::client
