#include "client/client.h"

#include <fstream>
#include <optional>
#include <sstream>

#include <google/protobuf/util/json_util.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/ir/spec.h"
#include "common/util/files.h"
#include "common/util/status_macros.h"
#include "proto/wire/grpc_status.h"

namespace fusor::client {

Client::Client(std::shared_ptr<grpc::Channel> channel, wire::RetryPolicy retry)
    : stub_(v1::Scheduler::NewStub(channel)), health_(grpc::health::v1::Health::NewStub(channel)),
      retry_(std::move(retry)) {}

absl::StatusOr<v1::TuneResult> Client::Tune(const v1::TuneRequest& request,
                                            const std::function<void(const v1::TuneEvent&)>& on_event,
                                            absl::Duration deadline) {
  // A scheduler that restarts resumes its tasks from the database, and a tune asked again joins its task: an
  // UNAVAILABLE scheduler (shutting down, restarting) is asked again, with backoff, for up to a minute.
  const absl::Time end = absl::Now() + deadline;
  wire::RetryPolicy policy = retry_;
  if (policy.max_attempts > 1) {  // (a client built not to retry does not)
    policy.max_attempts = 20;  // with backoff doubling from 0.2 s to at most 5 s, the minute runs out first
    policy.give_up_after = absl::Seconds(60);
  }
  std::optional<v1::TuneResult> result;
  absl::Status failed;
  grpc::Status st = wire::GrpcRetrier(policy).Run("tune", [&](grpc::ClientContext& ctx) {
    ctx.set_deadline(absl::ToChronoTime(end));
    std::unique_ptr<grpc::ClientReader<v1::TuneEvent>> reader = stub_->Tune(&ctx, request);
    v1::TuneEvent event;
    while (reader->Read(&event)) {
      if (on_event) on_event(event);
      if (event.has_result()) result = event.result();
    }
    grpc::Status finished = reader->Finish();
    if (!finished.ok()) failed = wire::FromGrpcStatus(finished, ctx);
    return finished;
  });
  if (!st.ok()) return failed;
  if (!result) return absl::InternalError("the scheduler ended the stream without a result");
  return *result;
}

absl::StatusOr<v1::CompileResponse> Client::Compile(const v1::CompileRequest& request, absl::Duration deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  v1::CompileResponse resp;
  grpc::Status st = stub_->Compile(&ctx, request, &resp);
  if (!st.ok()) return wire::FromGrpcStatus(st, ctx);
  return resp;
}

absl::StatusOr<v1::LookupResponse> Client::Lookup(const v1::LookupRequest& request) {
  v1::LookupResponse resp;
  grpc::Status st = wire::GrpcRetrier(retry_).Run(
      "lookup", [&](grpc::ClientContext& ctx) { return stub_->Lookup(&ctx, request, &resp); });
  if (!st.ok()) return wire::FromGrpcStatus(st);
  return resp;
}

absl::StatusOr<v1::ListWorkersResponse> Client::ListWorkers() {
  v1::ListWorkersResponse resp;
  grpc::Status st = wire::GrpcRetrier(retry_).Run("list workers", [&](grpc::ClientContext& ctx) {
    return stub_->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp);
  });
  if (!st.ok()) return wire::FromGrpcStatus(st);
  return resp;
}

absl::StatusOr<v1::TaskInfo> Client::GetTask(const std::string& task_id) {
  v1::GetTaskRequest req;
  req.set_task_id(task_id);
  v1::TaskInfo resp;
  grpc::Status st = wire::GrpcRetrier(retry_).Run(
      "get task", [&](grpc::ClientContext& ctx) { return stub_->GetTask(&ctx, req, &resp); });
  if (!st.ok()) return wire::FromGrpcStatus(st);
  return resp;
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Client::Health(absl::Duration deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status st = health_->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
  if (!st.ok()) return wire::FromGrpcStatus(st);
  return resp.status();
}

absl::StatusOr<v1::SweepReport> Client::Sweep(const v1::SweepRequest& request,
                                              const std::function<void(const v1::SweepEvent&)>& on_event,
                                              absl::Duration deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  std::unique_ptr<grpc::ClientReader<v1::SweepEvent>> reader = stub_->Sweep(&ctx, request);
  v1::SweepEvent event;
  std::optional<v1::SweepReport> report;
  while (reader->Read(&event)) {
    if (on_event) on_event(event);
    if (event.has_started() && request.detach()) {
      report.emplace();
      report->set_sweep_id(event.started().sweep_id());
      report->set_state("running");
    }
    if (event.has_report()) report = event.report();
  }
  grpc::Status st = reader->Finish();
  if (!st.ok()) return wire::FromGrpcStatus(st, ctx);
  if (!report) return absl::InternalError("the scheduler ended the sweep's stream without a report");
  return *report;
}

absl::StatusOr<v1::Workload> ReadWorkloadFile(const std::string& path) {
  // The scheduler's limits, applied before anything is parsed.
  auto read = ReadFile(path, static_cast<int64_t>(ir::Limits().max_spec_bytes));
  if (absl::IsNotFound(read.status())) {
    return absl::NotFoundError(absl::StrCat("cannot read workload file '", path, "'"));
  }
  if (!read.ok()) return absl::InvalidArgumentError(absl::StrCat("workload file ", read.status().message()));
  const std::string& text = *read;
  v1::Workload workload;
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] != '{') {
    workload.set_text(text);
    return workload;
  }
  RETURN_IF_ERROR(CheckJsonDepth(text, path));
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not chain text and not a JSON object"));
  }
  // A Workload wraps a chain or chain text; anything else must be a Chain.
  const bool is_workload = json.contains("chain") || json.contains("text");
  google::protobuf::Message* target = workload.mutable_chain();
  if (is_workload) target = &workload;
  auto st = google::protobuf::util::JsonStringToMessage(text, target, google::protobuf::util::JsonParseOptions());
  if (!st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid fusor.v1.", is_workload ? "Workload" : "Chain",
                                                   ": ", st.message().as_string()));
  }
  return workload;
}

namespace {

// Token calls are quick; moving records or a database may take a while.
constexpr absl::Duration kAdminCall = absl::Seconds(30);
constexpr absl::Duration kAdminTransfer = absl::Hours(1);

void SetDeadline(grpc::ClientContext& ctx, absl::Duration d) { ctx.set_deadline(absl::ToChronoTime(absl::Now() + d)); }

}  // namespace

absl::StatusOr<v1::CreateTokenResponse> AdminClient::CreateToken(const std::string& role, const std::string& name) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, kAdminCall);
  v1::CreateTokenRequest req;
  req.set_role(role);
  req.set_name(name);
  v1::CreateTokenResponse resp;
  grpc::Status st = stub_->CreateToken(&ctx, req, &resp);
  if (!st.ok()) return wire::FromGrpcStatus(st);
  return resp;
}

absl::StatusOr<v1::ListTokensResponse> AdminClient::ListTokens() {
  grpc::ClientContext ctx;
  SetDeadline(ctx, kAdminCall);
  v1::ListTokensResponse resp;
  grpc::Status st = stub_->ListTokens(&ctx, v1::ListTokensRequest(), &resp);
  if (!st.ok()) return wire::FromGrpcStatus(st);
  return resp;
}

absl::Status AdminClient::RevokeToken(const std::string& id) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, kAdminCall);
  v1::RevokeTokenRequest req;
  req.set_id(id);
  v1::RevokeTokenResponse resp;
  return wire::FromGrpcStatus(stub_->RevokeToken(&ctx, req, &resp));
}

absl::Status AdminClient::ExportRecords(const v1::ExportRecordsRequest& request,
                                        const std::function<void(const std::string&)>& line) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, kAdminTransfer);
  auto reader = stub_->ExportRecords(&ctx, request);
  v1::RecordLines batch;
  while (reader->Read(&batch)) {
    for (const std::string& l : batch.lines()) line(l);
  }
  return wire::FromGrpcStatus(reader->Finish());
}

absl::StatusOr<v1::ImportRecordsResponse> AdminClient::ImportRecords(const std::vector<std::string>& lines) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, kAdminTransfer);
  v1::ImportRecordsResponse resp;
  auto writer = stub_->ImportRecords(&ctx, &resp);
  v1::RecordLines batch;
  size_t bytes = 0;
  bool open = true;
  for (size_t i = 0; i < lines.size() && open; ++i) {
    batch.add_lines(lines[i]);
    bytes += lines[i].size();
    if (bytes >= (256 << 10) || i + 1 == lines.size()) {
      open = writer->Write(batch);
      batch.Clear();
      bytes = 0;
    }
  }
  writer->WritesDone();
  grpc::Status st = writer->Finish();
  if (!st.ok()) return wire::FromGrpcStatus(st);
  return resp;
}

absl::Status AdminClient::Backup(const std::function<bool(const std::string&)>& chunk) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, kAdminTransfer);
  auto reader = stub_->Backup(&ctx, v1::BackupRequest());
  v1::BackupChunk c;
  while (reader->Read(&c)) {
    if (!chunk(c.data())) {
      ctx.TryCancel();
      break;
    }
  }
  return wire::FromGrpcStatus(reader->Finish());
}

}  // namespace fusor::client
