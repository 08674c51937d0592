// The gRPC services of fusor-scheduler: thin handlers that validate,
// call the Scheduler and convert statuses once, at this boundary.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "fusor/v1/admin.grpc.pb.h"
#include "fusor/v1/scheduler.grpc.pb.h"
#include "fusor/v1/worker.grpc.pb.h"
#include "server/auth.h"
#include "server/scheduler.h"
#include "server/sweeps.h"

namespace fusor::server {

// Compile and Lookup use gRPC's callback API: a cache hit is answered on
// the thread that read the request, without a hand-off to a handler thread.
class SchedulerService final
    : public v1::Scheduler::WithCallbackMethod_Compile<v1::Scheduler::WithCallbackMethod_Lookup<v1::Scheduler::Service>> {
 public:
  SchedulerService(Scheduler* core, SweepRunner* sweeps, const Authenticator* auth)
      : core_(core), sweeps_(sweeps), auth_(auth) {}
  grpc::Status Tune(grpc::ServerContext* ctx, const v1::TuneRequest* req,
                    grpc::ServerWriter<v1::TuneEvent>* writer) override;
  grpc::ServerUnaryReactor* Compile(grpc::CallbackServerContext* ctx, const v1::CompileRequest* req,
                                    v1::CompileResponse* resp) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* ctx, const v1::LookupRequest* req,
                                   v1::LookupResponse* resp) override;
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest* req,
                           v1::ListWorkersResponse* resp) override;
  grpc::Status GetTask(grpc::ServerContext* ctx, const v1::GetTaskRequest* req, v1::TaskInfo* resp) override;
  grpc::Status Sweep(grpc::ServerContext* ctx, const v1::SweepRequest* req,
                     grpc::ServerWriter<v1::SweepEvent>* writer) override;
  grpc::Status GetSweep(grpc::ServerContext* ctx, const v1::GetSweepRequest* req, v1::SweepReport* resp) override;
  // From now on, calls waiting for a task end UNAVAILABLE within a second
  // (the task resumes when the scheduler restarts; the client asks again).
  void StopWaiting() { stopping_ = true; }
  // Waits until no Compile is waiting for a tune (after the server's
  // shutdown has cancelled their calls).
  void Drain();

 private:
  // A Compile's answer from the cache, or its refusal; or, with *to_tune
  // set, nothing yet: the workload must be tuned first.
  grpc::Status CompileFromCache(const grpc::ServerContextBase& ctx, const v1::CompileRequest& req,
                                v1::CompileResponse* resp, Caller* caller,
                                std::shared_ptr<const PreparedRequest>* to_tune);
  grpc::Status LookupInCache(const grpc::ServerContextBase& ctx, const v1::LookupRequest& req,
                             v1::LookupResponse* resp);
  // A Compile that must tune first: runs on a thread of its own.
  grpc::Status CompileByTuning(grpc::CallbackServerContext* ctx, const PreparedRequest& prepared,
                               const v1::TuneOptions& options, const Caller& caller, v1::CompileResponse* resp);

  Scheduler* core_;
  SweepRunner* sweeps_;
  const Authenticator* auth_;
  std::mutex tuning_mu_;
  std::condition_variable tuning_cv_;
  int tuning_ = 0;  // CompileByTuning threads running
  std::atomic<bool> stopping_{false};
};

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  WorkerServiceImpl(Scheduler* core, const Authenticator* auth) : core_(core), auth_(auth) {}
  grpc::Status Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req, v1::RegisterResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override;
  grpc::Status Lease(grpc::ServerContext* ctx, const v1::LeaseRequest* req, v1::LeaseResponse* resp) override;
  grpc::Status Report(grpc::ServerContext* ctx, const v1::ReportRequest* req, v1::ReportResponse* resp) override;

 private:
  Scheduler* core_;
  const Authenticator* auth_;
};

// Tokens, records and backups over the network, for admin tokens only.
class AdminService final : public v1::Admin::Service {
 public:
  AdminService(Scheduler* core, const Authenticator* auth) : core_(core), auth_(auth) {}
  grpc::Status CreateToken(grpc::ServerContext* ctx, const v1::CreateTokenRequest* req,
                           v1::CreateTokenResponse* resp) override;
  grpc::Status ListTokens(grpc::ServerContext* ctx, const v1::ListTokensRequest* req,
                          v1::ListTokensResponse* resp) override;
  grpc::Status RevokeToken(grpc::ServerContext* ctx, const v1::RevokeTokenRequest* req,
                           v1::RevokeTokenResponse* resp) override;
  grpc::Status ExportRecords(grpc::ServerContext* ctx, const v1::ExportRecordsRequest* req,
                             grpc::ServerWriter<v1::RecordLines>* writer) override;
  grpc::Status ImportRecords(grpc::ServerContext* ctx, grpc::ServerReader<v1::RecordLines>* reader,
                             v1::ImportRecordsResponse* resp) override;
  grpc::Status Backup(grpc::ServerContext* ctx, const v1::BackupRequest* req,
                      grpc::ServerWriter<v1::BackupChunk>* writer) override;

 private:
  Scheduler* core_;
  const Authenticator* auth_;
};

// Most bytes of records one ImportRecords call may send.
inline constexpr int64_t kMaxImportBytes = int64_t{512} << 20;

// A scheduler with its services on a gRPC server. Listens on `address`
// (host:port; port 0 picks one) unless it is empty, and always serves an
// in-process channel.
class SchedulerServer {
 public:
  // `credentials` secure the listening port (default: plaintext).
  static absl::StatusOr<std::unique_ptr<SchedulerServer>> Start(
      const SchedulerOptions& options, const std::string& address,
      std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials());
  ~SchedulerServer();
  int port() const { return port_; }
  std::shared_ptr<grpc::Channel> InProcessChannel();
  Scheduler& core() { return *core_; }
  // NOT_SERVING, then `drain` for the calls in flight to finish (a call
  // waiting for a task ends UNAVAILABLE at once: its client asks again,
  // and the task resumes with the next scheduler), then the rest are
  // cancelled.
  void Shutdown(absl::Duration drain = absl::Seconds(2));
  void Wait();
  // Drops the tokens checked recently: each is read from the database
  // again on its next call (a SIGHUP).
  void ForgetTokens() { auth_->Forget(); }

 private:
  SchedulerServer() = default;
  std::unique_ptr<Scheduler> core_;
  std::unique_ptr<SweepRunner> sweeps_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<SchedulerService> scheduler_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// Largest request the server accepts, in bytes.
inline constexpr int kMaxRequestBytes = 1 << 20;

}  // namespace fusor::server
