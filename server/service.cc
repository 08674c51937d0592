#include "server/service.h"

#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"
#include "proto/wire/channel.h"
#include "proto/wire/convert.h"
#include "proto/wire/grpc_status.h"
#include "server/metrics.h"
#include "server/wire_rows.h"

namespace fusor::server {
namespace {

using wire::ToGrpcStatus;

std::vector<std::string> VaryOf(const v1::Workload& workload) { return {workload.vary().begin(), workload.vary().end()}; }

// The answer the core keeps for a request's workload and target: the
// workload is parsed only when no answer is kept for its bytes.
absl::StatusOr<std::shared_ptr<Scheduler::Answer>> CachedAnswerFor(Scheduler& core, const v1::Workload& workload,
                                                                 const v1::TargetSelector& target) {
  ASSIGN_OR_RETURN(const TargetSelector selector, TargetSelectorFromProto(target));
  return core.CachedAnswer(workload.SerializeAsString(), [&] { return wire::ChainFromWorkload(workload); }, selector,
                           VaryOf(workload));
}

// Polls `ctx` while waiting on the task, so a cancelled client frees its
// handler within a second.
constexpr absl::Duration kPoll = absl::Seconds(1);

const grpc::Status kShuttingDown(grpc::StatusCode::UNAVAILABLE,
                                 "the scheduler is shutting down; its tasks resume when it restarts: ask again");

}  // namespace

grpc::Status SchedulerService::Tune(grpc::ServerContext* ctx, const v1::TuneRequest* req,
                                    grpc::ServerWriter<v1::TuneEvent>* writer) {
  Caller caller;
  if (grpc::Status st = auth_->Check(*ctx, {Role::kClient}, &caller); !st.ok()) return st;
  auto chain = wire::ChainFromWorkload(req->workload());
  if (!chain.ok()) return ToGrpcStatus(chain.status());
  auto selector = TargetSelectorFromProto(req->target());
  if (!selector.ok()) return ToGrpcStatus(selector.status());
  auto prepared = core_->Prepare(*chain, *selector, VaryOf(req->workload()));
  if (!prepared.ok()) return ToGrpcStatus(prepared.status());
  auto start = core_->StartTune(*prepared, TuneOptionsFromProto(req->options()), caller);
  if (!start.ok()) return ToGrpcStatus(start.status(), ctx);
  if (!req->options().force()) core_->NoteCacheLookup(start->cached.has_value());
  v1::TuneEvent event;
  if (start->cached) {
    *event.mutable_result() = TuneResultProto(*start->cached);
    writer->Write(event);
    return grpc::Status::OK;
  }
  *event.mutable_started() = TaskStartedProto(start->started);
  if (!writer->Write(event)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  const std::string task_id = start->started.task_id;
  int64_t version = 0;
  while (true) {
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    if (stopping_) return kShuttingDown;
    auto snap = core_->WaitForTask(task_id, version, kPoll);
    if (!snap.ok()) return ToGrpcStatus(snap.status());
    if (snap->version != version) {
      version = snap->version;
      v1::TuneEvent progress;
      *progress.mutable_progress() = TuneProgressProto(snap->progress);
      if (!snap->progress.best_schedule.empty()) {
        progress.mutable_progress()->set_best_schedule(
            core_->TranslateSchedule(snap->progress.best_schedule, *prepared));
      }
      writer->Write(progress);
    }
    if (snap->state == db::TaskState::kFailed) {
      return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat("tuning failed: ", snap->error)));
    }
    if (snap->state == db::TaskState::kDone && snap->result) {
      v1::TuneEvent done;
      *done.mutable_result() = TuneResultProto(core_->Translate(*snap->result, *prepared));
      writer->Write(done);
      return grpc::Status::OK;
    }
  }
}

grpc::ServerUnaryReactor* SchedulerService::Compile(grpc::CallbackServerContext* ctx, const v1::CompileRequest* req,
                                                    v1::CompileResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  Caller caller;
  std::shared_ptr<const PreparedRequest> to_tune;
  grpc::Status st = CompileFromCache(*ctx, *req, resp, &caller, &to_tune);
  if (to_tune == nullptr) {
    reactor->Finish(st);
    return reactor;
  }
  // A tune takes seconds to minutes: it is waited for on a thread of its
  // own, never on one of gRPC's.
  {
    std::lock_guard<std::mutex> lock(tuning_mu_);
    ++tuning_;
  }
  std::thread([this, ctx, reactor, resp, caller, options = req->options(), prepared = std::move(to_tune)] {
    reactor->Finish(CompileByTuning(ctx, *prepared, options, caller, resp));
    std::lock_guard<std::mutex> lock(tuning_mu_);
    if (--tuning_ == 0) tuning_cv_.notify_all();
  }).detach();
  return reactor;
}

grpc::Status SchedulerService::CompileFromCache(const grpc::ServerContextBase& ctx, const v1::CompileRequest& req,
                                                v1::CompileResponse* resp, Caller* caller,
                                                std::shared_ptr<const PreparedRequest>* to_tune) {
  if (grpc::Status st = auth_->Check(ctx, {Role::kClient}, caller); !st.ok()) return st;
  auto answer = CachedAnswerFor(*core_, req.workload(), req.target());
  if (!answer.ok()) return ToGrpcStatus(answer.status());
  const absl::StatusOr<TuneResult>& found = (*answer)->result;
  // A transferred schedule is a kernel only once a task has validated it.
  const bool ready = found.ok() && found->validated;
  core_->NoteCacheLookup(ready);
  if (ready) {
    const absl::StatusOr<CompileResult>& rendered = core_->CompileAnswer(**answer);
    if (!rendered.ok()) return ToGrpcStatus(rendered.status());
    *resp = CompileResponseProto(*rendered);
    return grpc::Status::OK;
  }
  if (req.cache_only()) {
    return ToGrpcStatus(found.ok() ? absl::NotFoundError(absl::StrCat(
                                         "no validated kernel for workload ", found->workload_key,
                                         ": the schedule of workload ", found->source_key,
                                         " carries over, unmeasured at these sizes (compile with transfer to "
                                         "measure it)"))
                                   : found.status());
  }
  *to_tune = (*answer)->prepared;
  return grpc::Status::OK;
}

grpc::Status SchedulerService::CompileByTuning(grpc::CallbackServerContext* ctx, const PreparedRequest& prepared,
                                               const v1::TuneOptions& options, const Caller& caller,
                                               v1::CompileResponse* resp) {
  TuneResult result;
  auto start = core_->StartTune(prepared, TuneOptionsFromProto(options), caller);
  if (!start.ok()) return ToGrpcStatus(start.status(), ctx);
  const PreparedRequest* served = &prepared;
  if (start->cached) {
    result = *start->cached;
    if (start->served) served = start->served.get();
  } else {
    int64_t version = 0;
    while (true) {
      if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
      if (stopping_) return kShuttingDown;
      auto snap = core_->WaitForTask(start->started.task_id, version, kPoll);
      if (!snap.ok()) return ToGrpcStatus(snap.status());
      version = snap->version;
      if (snap->state == db::TaskState::kFailed) {
        return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat("tuning failed: ", snap->error)));
      }
      if (snap->state == db::TaskState::kDone && snap->result) {
        result = core_->Translate(*snap->result, prepared);
        break;
      }
    }
  }
  auto compiled = core_->BuildCompileResult(*served, result);
  if (!compiled.ok()) return ToGrpcStatus(compiled.status());
  *resp = CompileResponseProto(*compiled);
  return grpc::Status::OK;
}

void SchedulerService::Drain() {
  std::unique_lock<std::mutex> lock(tuning_mu_);
  tuning_cv_.wait(lock, [this] { return tuning_ == 0; });
}

grpc::ServerUnaryReactor* SchedulerService::Lookup(grpc::CallbackServerContext* ctx, const v1::LookupRequest* req,
                                                   v1::LookupResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(LookupInCache(*ctx, *req, resp));
  return reactor;
}

grpc::Status SchedulerService::LookupInCache(const grpc::ServerContextBase& ctx, const v1::LookupRequest& req,
                                             v1::LookupResponse* resp) {
  if (grpc::Status st = auth_->Check(ctx, {Role::kClient}); !st.ok()) return st;
  auto answer = CachedAnswerFor(*core_, req.workload(), req.target());
  if (!answer.ok()) return ToGrpcStatus(answer.status());
  const absl::StatusOr<TuneResult>& found = (*answer)->result;
  core_->NoteCacheLookup(found.ok());
  const bool own = found.ok() && found->answer == AnswerKind::kTuned;
  if (req.explain() && !own) {
    auto why = core_->Explain(*(*answer)->prepared);
    if (!why.ok()) return ToGrpcStatus(why.status());
    *resp->mutable_why() = ExplanationProto(*why);
  } else if (!found.ok() && absl::IsNotFound(found.status())) {
    // The reason in one line, for a client that did not ask for it.
    auto why = core_->Explain(*(*answer)->prepared);
    if (why.ok()) return ToGrpcStatus(absl::NotFoundError(absl::StrCat(found.status().message(), "; ", why->summary)));
  }
  if (!found.ok() && !(req.explain() && absl::IsNotFound(found.status()))) return ToGrpcStatus(found.status());
  if (found.ok()) *resp->mutable_result() = TuneResultProto(*found);
  return grpc::Status::OK;
}

grpc::Status SchedulerService::ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest*,
                                           v1::ListWorkersResponse* resp) {
  if (grpc::Status st = auth_->Check(*ctx, {Role::kClient}); !st.ok()) return st;
  auto workers = core_->db().ListWorkers(NowMs() - absl::ToInt64Milliseconds(core_->options().lost_worker_retention));
  if (!workers.ok()) return ToGrpcStatus(workers.status());
  for (const db::WorkerRow& w : *workers) *resp->add_workers() = WorkerInfoProto(w, core_->TargetOf(w.target_fp));
  return grpc::Status::OK;
}

grpc::Status SchedulerService::GetTask(grpc::ServerContext* ctx, const v1::GetTaskRequest* req, v1::TaskInfo* resp) {
  if (grpc::Status st = auth_->Check(*ctx, {Role::kClient}); !st.ok()) return st;
  if (req->task_id().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "task_id is required");
  auto snapshot = core_->WaitForTask(req->task_id(), INT64_MAX, absl::ZeroDuration());
  if (!snapshot.ok()) return ToGrpcStatus(snapshot.status());
  auto row = core_->db().GetTask(req->task_id());
  if (!row.ok()) return ToGrpcStatus(row.status());
  *resp = TaskInfoProto(*snapshot, *row);
  return grpc::Status::OK;
}

grpc::Status SchedulerService::Sweep(grpc::ServerContext* ctx, const v1::SweepRequest* req,
                                     grpc::ServerWriter<v1::SweepEvent>* writer) {
  Caller caller;
  if (grpc::Status st = auth_->Check(*ctx, {Role::kClient}, &caller); !st.ok()) return st;
  auto request = SweepRequestFromProto(*req);
  if (!request.ok()) return ToGrpcStatus(request.status());
  auto started = sweeps_->Start(*request, caller);
  if (!started.ok()) return ToGrpcStatus(started.status(), ctx);
  v1::SweepEvent event;
  *event.mutable_started() = SweepStartedProto(*started);
  if (!writer->Write(event)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  if (req->detach()) return grpc::Status::OK;
  // The sweep runs in the runner; this only follows it.
  std::optional<SweepProgress> last;
  while (true) {
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    auto status = sweeps_->Progress(started->sweep_id);
    if (!status.ok()) return ToGrpcStatus(status.status());
    if (!last || !(*last == status->progress)) {
      v1::SweepEvent progress;
      *progress.mutable_progress() = SweepProgressProto(status->progress);
      if (!writer->Write(progress)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      last = status->progress;
    }
    if (status->finished) {
      auto report = sweeps_->Report(started->sweep_id);
      if (!report.ok()) return ToGrpcStatus(report.status());
      v1::SweepEvent done;
      *done.mutable_report() = SweepReportProto(*report);
      writer->Write(done);
      return grpc::Status::OK;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

grpc::Status SchedulerService::GetSweep(grpc::ServerContext* ctx, const v1::GetSweepRequest* req, v1::SweepReport* resp) {
  if (grpc::Status st = auth_->Check(*ctx, {Role::kClient}); !st.ok()) return st;
  if (req->sweep_id().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "sweep_id is required");
  auto report = sweeps_->Report(req->sweep_id());
  if (!report.ok()) return ToGrpcStatus(report.status());
  *resp = SweepReportProto(*report);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req,
                                         v1::RegisterResponse* resp) {
  if (grpc::Status st = auth_->Check(*ctx, {Role::kWorker}); !st.ok()) return st;
  if (req->target().backend() == v1::BACKEND_UNSPECIFIED) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "register: target.backend is required");
  }
  auto r = core_->Register(req->name(), wire::TargetFromProto(req->target()));
  if (!r.ok()) return ToGrpcStatus(r.status());
  resp->set_worker_id(r->credentials.worker_id);
  resp->set_worker_secret(r->credentials.secret);
  resp->set_target_fingerprint(r->target_fp);
  const SchedulerOptions& o = core_->options();
  resp->set_heartbeat_interval_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(o.heartbeat_interval)));
  resp->set_lease_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(o.lease)));
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                                          v1::HeartbeatResponse* resp) {
  if (grpc::Status st = auth_->Check(*ctx, {Role::kWorker}); !st.ok()) return st;
  auto known = core_->Heartbeat({req->worker_id(), req->worker_secret()},
                                {req->lease_ids().begin(), req->lease_ids().end()});
  if (!known.ok()) return ToGrpcStatus(known.status());
  resp->set_reregister(!*known);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Lease(grpc::ServerContext* ctx, const v1::LeaseRequest* req,
                                      v1::LeaseResponse* resp) {
  if (grpc::Status st = auth_->Check(*ctx, {Role::kWorker}); !st.ok()) return st;
  if (req->worker_id().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "worker_id is required");
  auto leased = core_->Lease({req->worker_id(), req->worker_secret()}, req->max_jobs(),
                             absl::Milliseconds(req->wait_ms()), [ctx] { return ctx->IsCancelled(); });
  if (!leased.ok()) return ToGrpcStatus(leased.status());
  for (const LeasedJob& j : *leased) *resp->add_jobs() = JobProto(j, core_->options().measure);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Report(grpc::ServerContext* ctx, const v1::ReportRequest* req,
                                       v1::ReportResponse* resp) {
  if (grpc::Status st = auth_->Check(*ctx, {Role::kWorker}); !st.ok()) return st;
  if (req->job_id().empty() || req->lease_id().empty() || req->worker_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "worker_id, job_id and lease_id are required");
  }
  auto report = JobReportFromProto(*req);
  if (!report.ok()) return ToGrpcStatus(report.status());
  auto receipt = core_->Report(*report);
  if (!receipt.ok()) return ToGrpcStatus(receipt.status());
  resp->set_duplicate(*receipt == ReportReceipt::kDuplicate);
  return grpc::Status::OK;
}

namespace {

v1::TokenInfo TokenProto(const db::TokenRow& t) {
  v1::TokenInfo info;
  info.set_id(t.id);
  info.set_name(t.name);
  info.set_role(t.role);
  info.set_created_unix_ms(t.created_ms);
  info.set_revoked_unix_ms(t.revoked_ms.value_or(0));
  return info;
}

}  // namespace

grpc::Status AdminService::CreateToken(grpc::ServerContext* ctx, const v1::CreateTokenRequest* req,
                                       v1::CreateTokenResponse* resp) {
  Caller caller;
  if (grpc::Status st = auth_->Check(*ctx, {Role::kAdmin}, &caller); !st.ok()) return st;
  auto role = ParseRole(req->role());
  if (!role.ok()) return ToGrpcStatus(role.status());
  auto created = server::CreateToken(core_->db(), *role, req->name(), NowMs());
  if (!created.ok()) return ToGrpcStatus(created.status());
  *resp->mutable_info() = TokenProto(created->first);
  resp->set_token(created->second);
  Logger("admin")->info("{} created token {} ({}, '{}')", caller.name, created->first.id, req->role(), req->name());
  return grpc::Status::OK;
}

grpc::Status AdminService::ListTokens(grpc::ServerContext* ctx, const v1::ListTokensRequest*,
                                      v1::ListTokensResponse* resp) {
  if (grpc::Status st = auth_->Check(*ctx, {Role::kAdmin}); !st.ok()) return st;
  auto tokens = core_->db().ListTokens();
  if (!tokens.ok()) return ToGrpcStatus(tokens.status());
  for (const db::TokenRow& t : *tokens) *resp->add_tokens() = TokenProto(t);
  return grpc::Status::OK;
}

grpc::Status AdminService::RevokeToken(grpc::ServerContext* ctx, const v1::RevokeTokenRequest* req,
                                       v1::RevokeTokenResponse*) {
  Caller caller;
  if (grpc::Status st = auth_->Check(*ctx, {Role::kAdmin}, &caller); !st.ok()) return st;
  if (absl::Status st = core_->db().RevokeToken(req->id(), NowMs()); !st.ok()) return ToGrpcStatus(st);
  auth_->Forget();
  Logger("admin")->info("{} revoked token {}", caller.name, req->id());
  return grpc::Status::OK;
}

grpc::Status AdminService::ExportRecords(grpc::ServerContext* ctx, const v1::ExportRecordsRequest* req,
                                         grpc::ServerWriter<v1::RecordLines>* writer) {
  if (grpc::Status st = auth_->Check(*ctx, {Role::kAdmin}); !st.ok()) return st;
  v1::RecordLines batch;
  size_t bytes = 0;
  bool gone = false;
  auto flush = [&] {
    if (batch.lines_size() > 0 && !gone) gone = !writer->Write(batch);
    batch.Clear();
    bytes = 0;
  };
  absl::Status st = core_->db().ExportRecords({req->target_fingerprint(), req->workload_key(),
                                                db::ExportOrigin(core_->options().db_path)},
                                              [&](const std::string& line) {
                                                batch.add_lines(line);
                                                bytes += line.size();
                                                if (bytes >= (256 << 10)) flush();
                                              });
  if (!st.ok()) return ToGrpcStatus(st);
  flush();
  return gone ? grpc::Status(grpc::StatusCode::CANCELLED, "client went away") : grpc::Status::OK;
}

grpc::Status AdminService::ImportRecords(grpc::ServerContext* ctx, grpc::ServerReader<v1::RecordLines>* reader,
                                         v1::ImportRecordsResponse* resp) {
  Caller caller;
  if (grpc::Status st = auth_->Check(*ctx, {Role::kAdmin}, &caller); !st.ok()) return st;
  std::vector<std::string> lines;
  int64_t bytes = 0;
  v1::RecordLines batch;
  while (reader->Read(&batch)) {
    for (std::string& line : *batch.mutable_lines()) {
      bytes += static_cast<int64_t>(line.size());
      if (bytes > kMaxImportBytes) {
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat("more than ", kMaxImportBytes >> 20,
                                         " MiB of records in one import; split the file (nothing was imported)"));
      }
      lines.push_back(std::move(line));
    }
  }
  auto stats = core_->db().ImportRecords(lines, NowMs(), core_->options().measure.max_spread);
  if (!stats.ok()) return ToGrpcStatus(stats.status());
  resp->set_records(stats->records);
  resp->set_added(stats->added);
  resp->set_duplicates(stats->duplicates);
  resp->set_best_updated(stats->best_updated);
  Logger("admin")->info("{} imported {} records ({} new measurements)", caller.name, stats->records, stats->added);
  return grpc::Status::OK;
}

grpc::Status AdminService::Backup(grpc::ServerContext* ctx, const v1::BackupRequest*,
                                  grpc::ServerWriter<v1::BackupChunk>* writer) {
  Caller caller;
  if (grpc::Status st = auth_->Check(*ctx, {Role::kAdmin}, &caller); !st.ok()) return st;
  static std::atomic<int> serial{0};
  // Next to the database: the scheduler can write there, and it is on the
  // same filesystem, so the copy needs no more space elsewhere.
  const std::string path = absl::StrCat(core_->options().db_path, ".backup-", getpid(), "-", ++serial);
  struct Remove {
    std::string path;
    ~Remove() { std::remove(path.c_str()); }
  } remove{path};
  if (absl::Status st = core_->db().BackupTo(path); !st.ok()) return ToGrpcStatus(st);
  std::ifstream in(path, std::ios::binary);
  if (!in) return grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the backup back");
  std::string buffer(512 << 10, '\0');
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    v1::BackupChunk chunk;
    chunk.set_data(buffer.data(), static_cast<size_t>(n));
    if (!writer->Write(chunk)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  }
  Logger("admin")->info("{} took a backup", caller.name);
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<SchedulerServer>> SchedulerServer::Start(
    const SchedulerOptions& options, const std::string& address,
    std::shared_ptr<grpc::ServerCredentials> credentials) {
  wire::DisableMutexDeadlockDetection();
  std::unique_ptr<SchedulerServer> s(new SchedulerServer());
  auto core = Scheduler::Create(options);
  if (!core.ok()) return core.status();
  s->core_ = std::move(*core);
  SweepOptions sweep_options;
  sweep_options.parallel = std::max(1, options.sweep_parallel);
  s->sweeps_ = std::make_unique<SweepRunner>(s->core_.get(), sweep_options);
  s->auth_ = std::make_unique<Authenticator>(options.require_tokens ? &s->core_->db() : nullptr);
  s->scheduler_service_ = std::make_unique<SchedulerService>(s->core_.get(), s->sweeps_.get(), s->auth_.get());
  s->worker_service_ = std::make_unique<WorkerServiceImpl>(s->core_.get(), s->auth_.get());
  s->admin_service_ = std::make_unique<AdminService>(s->core_.get(), s->auth_.get());
  // The standard grpc.health.v1.Health service (Kubernetes' gRPC probes), and server reflection (grpcurl and
  // the like list and call the services without their .proto files).
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // One scheduler per port: without this, gRPC's SO_REUSEPORT lets a second one share it, each answering some calls.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (!address.empty()) builder.AddListeningPort(address, credentials, &s->port_);
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  builder.experimental().SetInterceptorCreators(RpcLatencyInterceptors());
  builder.RegisterService(s->scheduler_service_.get());
  builder.RegisterService(s->worker_service_.get());
  builder.RegisterService(s->admin_service_.get());
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || (!address.empty() && s->port_ == 0)) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address,
                                               ": the port is in use (another fusor-scheduler?) or the address is "
                                               "not one of this machine's"));
  }
  if (grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService()) {
    health->SetServingStatus(true);  // the whole server ("")
    for (const char* service : {v1::Scheduler::service_full_name(), v1::WorkerService::service_full_name(),
                                v1::Admin::service_full_name()}) {
      health->SetServingStatus(service, true);
    }
  }
  return s;
}

std::shared_ptr<grpc::Channel> SchedulerServer::InProcessChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxRequestBytes * 4);
  return server_->InProcessChannel(args);
}

void SchedulerServer::Shutdown(absl::Duration drain) {
  if (server_ && server_->GetHealthCheckService()) server_->GetHealthCheckService()->SetServingStatus(false);
  if (scheduler_service_) scheduler_service_->StopWaiting();
  if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + drain));
  if (scheduler_service_) scheduler_service_->Drain();
}

void SchedulerServer::Wait() {
  if (server_) server_->Wait();
}

SchedulerServer::~SchedulerServer() {
  Shutdown();
  sweeps_.reset();
  core_.reset();
}

}  // namespace fusor::server
