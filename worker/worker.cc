#include "worker/worker.h"

#include <chrono>
#include <deque>

#include "absl/strings/str_cat.h"
#include "common/ir/parse.h"
#include "common/util/build_info.h"
#include "common/util/log.h"
#include "common/util/quiet.h"
#include "common/util/status_macros.h"
#include "proto/wire/convert.h"
#include "proto/wire/grpc_status.h"
#include "worker/backend.h"
#include "worker/validate.h"
#include "common/util/process.h"

namespace fusor::worker {
namespace {

std::shared_ptr<spdlog::logger> Log() { return Logger("worker"); }

v1::MeasurementStatus ToProto(OutcomeStatus s) {
  switch (s) {
    case OutcomeStatus::kOk: return v1::MEASUREMENT_STATUS_OK;
    case OutcomeStatus::kCompileError: return v1::MEASUREMENT_STATUS_COMPILE_ERROR;
    case OutcomeStatus::kInvalidResult: return v1::MEASUREMENT_STATUS_INVALID_RESULT;
    case OutcomeStatus::kTimeout: return v1::MEASUREMENT_STATUS_TIMEOUT;
    case OutcomeStatus::kCrash: return v1::MEASUREMENT_STATUS_CRASH;
    case OutcomeStatus::kRuntimeError: return v1::MEASUREMENT_STATUS_RUNTIME_ERROR;
    case OutcomeStatus::kNoisy: return v1::MEASUREMENT_STATUS_NOISY;
  }
  return v1::MEASUREMENT_STATUS_UNSPECIFIED;
}

}  // namespace

Worker::Worker(std::shared_ptr<grpc::Channel> channel, WorkerOptions options)
    : stub_(v1::WorkerService::NewStub(channel)), options_(std::move(options)) {}

Worker::~Worker() {
  Stop();
  if (heartbeat_.joinable()) heartbeat_.join();
  StopHolding();
}

void Worker::HoldLoop() {
  absl::StatusOr<QuietGate> gate = QuietGate::Open(options_.quiet_file);
  if (!gate.ok()) {
    Log()->warn("jobs are not held during requests: {}", std::string(gate.status().message()));
    return;
  }
  while (!stop_) {
    HoldChildren(gate->Running() > 0);
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  HoldChildren(false);
}

void Worker::StopHolding() {
  if (holder_.joinable()) holder_.join();
  HoldChildren(false);
}

std::shared_ptr<v1::WorkerService::Stub> Worker::Stub() {
  std::lock_guard<std::mutex> lock(stub_mu_);
  return stub_;
}

void Worker::Redial(std::shared_ptr<grpc::Channel> channel) {
  std::shared_ptr<v1::WorkerService::Stub> stub = v1::WorkerService::NewStub(channel);
  std::lock_guard<std::mutex> lock(stub_mu_);
  stub_ = std::move(stub);
}

void Worker::Stop() {
  stop_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (lease_ctx_ != nullptr) lease_ctx_->TryCancel();
  cv_.notify_all();
}

absl::Status Worker::Prepare() {
  if (!cache_) {
    auto dir = TempDir::Create(options_.scratch_dir, "fusor-cache-");
    if (dir.ok()) {
      cache_.emplace(std::move(*dir));
    } else {
      Log()->warn("nothing is kept across jobs (references, the precompiled preamble): {}",
                  std::string(dir.status().message()));
    }
  }
  MachineOptions machine;
  machine.compiler = options_.compiler;
  machine.scratch_dir = options_.scratch_dir;
  machine.device = options_.gpu;
  const Backend* backend = nullptr;
  if (options_.backend != "cpu") {
    auto gpu = CudaBackend().Describe(machine);
    if (gpu.ok()) {
      backend = &CudaBackend();
      target_ = *gpu;
    } else if (options_.backend == "cuda") {
      return gpu.status();
    } else {
      Log()->info("no usable GPU ({}); serving the CPU backend", std::string(gpu.status().message()));
    }
  }
  if (backend == nullptr) {
    backend = &CpuBackend();
    ASSIGN_OR_RETURN(target_, backend->Describe(machine));
  }
  if (options_.compile_ahead < 0) options_.compile_ahead = backend->DefaultCompileAhead();
  compile_during_measurement_ = backend->CompilesDuringMeasurement();
  RETURN_IF_ERROR(Calibrate());
  Log()->info("{}; compiling {} job(s) ahead of the measurement{}", backend->Summary(target_), options_.compile_ahead,
              compile_during_measurement_ ? "" : ", never while one runs");
  return absl::OkStatus();
}

absl::Status Worker::Calibrate() {
  if (options_.calibration_s <= 0) return absl::OkStatus();
  JobSpec spec;
  spec.kind = JobKind::kCalibrate;
  spec.target = target_;
  spec.device = options_.gpu;
  spec.compiler = options_.compiler;
  spec.timing.time_budget_s = options_.calibration_s;
  spec.compile_timeout_s = 120;
  spec.run_timeout_s = 60 + 4 * options_.calibration_s;
  JobOutcome out = RunJobIsolated(spec, options_.self_exe, options_.scratch_dir);
  if (out.status != OutcomeStatus::kOk) {
    return absl::InternalError(absl::StrCat("calibration failed (", OutcomeStatusName(out.status), "): ", out.error));
  }
  target_.bandwidth_bytes_per_s = out.bandwidth_bytes_per_s;
  target_.peak_flops = out.peak_flops;
  return absl::OkStatus();
}

absl::Status Worker::Register() {
  v1::RegisterRequest req;
  req.set_name(options_.name);
  *req.mutable_target() = wire::TargetToProto(target_);
  req.set_version(Build().version);
  v1::RegisterResponse resp;
  wire::GrpcRetrier retrier(options_.rpc);
  grpc::Status st = retrier.Run("register", [&](grpc::ClientContext& ctx) { return Stub()->Register(&ctx, req, &resp); });
  if (!st.ok()) return wire::FromGrpcStatus(st);
  {
    std::lock_guard<std::mutex> lock(mu_);
    worker_id_ = resp.worker_id();
    worker_secret_ = resp.worker_secret();
  }
  heartbeat_ms_ = std::max(100, resp.heartbeat_interval_ms());
  if (resp.lease_ms() > 0) lease_ms_ = resp.lease_ms();
  reregister_ = false;
  registered_ = true;
  Log()->info("[worker={}] registered as '{}' for target {}", worker_id_, options_.name, resp.target_fingerprint());
  return absl::OkStatus();
}

void Worker::HeartbeatLoop() {
  while (!stop_) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(heartbeat_ms_.load()), [this] { return stop_.load(); });
    }
    if (stop_) return;
    v1::HeartbeatRequest req;
    {
      std::lock_guard<std::mutex> lock(mu_);
      req.set_worker_id(worker_id_);
      req.set_worker_secret(worker_secret_);
      for (const std::string& lease : held_leases_) req.add_lease_ids(lease);
    }
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status st = Stub()->Heartbeat(&ctx, req, &resp);
    if (!st.ok()) {
      Log()->warn("[worker={}] heartbeat failed: {}", req.worker_id(), st.error_message());
    } else if (resp.reregister()) {
      reregister_ = true;
    }
  }
}

absl::Status Worker::Run() {
  if (absl::Status st = Register(); !st.ok()) return st;
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  if (options_.hold_during_requests && !options_.quiet_file.empty() && !holder_.joinable()) {
    holder_ = std::thread([this] { HoldLoop(); });
  }
  absl::Duration backoff = absl::Milliseconds(200);
  // Leased jobs in order; the front one is measured next. Leases of the
  // others are kept alive by the heartbeats.
  std::deque<Pending> pending;
  const size_t depth = 1 + static_cast<size_t>(std::max(0, options_.compile_ahead));
  while (!stop_) {
    if (reregister_) {
      Log()->warn("[worker={}] the scheduler no longer knows this worker; registering again", worker_id_);
      if (absl::Status st = Register(); !st.ok()) Log()->error("register failed: {}", st.ToString());
    }
    if (pending.size() < depth) {
      // Wait for work only when there is none in hand.
      const absl::Duration wait = pending.empty() ? options_.lease_wait : absl::ZeroDuration();
      v1::LeaseRequest req;
      req.set_worker_id(worker_id_);
      req.set_worker_secret(worker_secret_);
      req.set_max_jobs(static_cast<int32_t>(depth - pending.size()));
      req.set_wait_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(wait)));
      v1::LeaseResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + wait + absl::Seconds(15)));
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) break;
        lease_ctx_ = &ctx;
      }
      grpc::Status st = Stub()->Lease(&ctx, req, &resp);
      {
        std::lock_guard<std::mutex> lock(mu_);
        lease_ctx_ = nullptr;
      }
      if (stop_) {
        if (st.ok() && resp.jobs_size() > 0) {
          Log()->info("[worker={}] stopping: {} leased job(s) go back to the queue when the lease expires",
                      worker_id_, resp.jobs_size());
        }
        break;
      }
      if (!st.ok()) {
        // Unknown to the scheduler, or its registration no longer valid
        // there (e.g. made by older fusor, without a secret): register again.
        if (st.error_code() == grpc::StatusCode::NOT_FOUND ||
            st.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
          reregister_ = true;
        }
        if (pending.empty()) {
          Log()->warn("[worker={}] lease failed ({}); retrying in {}", worker_id_, st.error_message(),
                      absl::FormatDuration(backoff));
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait_for(lock, absl::ToChronoMilliseconds(backoff), [this] { return stop_.load(); });
          // At most 2 s: a scheduler that restarts has its worker back within seconds.
          backoff = std::min(backoff * 2, absl::Seconds(2));
          continue;
        }
      } else {
        backoff = absl::Milliseconds(200);
        {
          std::lock_guard<std::mutex> lock(mu_);
          for (const v1::Job& job : resp.jobs()) held_leases_.insert(job.lease_id());
        }
        for (const v1::Job& job : resp.jobs()) pending.push_back(Start(job));
      }
    }
    if (pending.empty() || stop_) continue;
    // Where compiling would disturb the timing, what compiles ahead
    // finishes before the measurement starts.
    if (!compile_during_measurement_) {
      for (Pending& p : pending) {
        if (p.compiled.valid()) p.compiled.wait();
      }
    }
    Finish(pending.front());
    pending.pop_front();
  }
  if (!pending.empty()) {
    Log()->info("[worker={}] stopping: {} job(s) compiled ahead go back to the queue when their lease expires",
                worker_id_, pending.size());
  }
  Stop();
  StopHolding();   // what is compiling goes on to its end
  pending.clear();  // waits for compiles in flight
  if (heartbeat_.joinable()) heartbeat_.join();
  return absl::OkStatus();
}

Worker::Pending Worker::Start(const v1::Job& job) {
  Pending p;
  p.job = job;
  p.worker_id = worker_id_;
  p.worker_secret = worker_secret_;
  p.context = absl::StrCat("[task=", job.task_id(), " job=", job.job_id(),
                           job.kind() == v1::JOB_KIND_BASELINE  ? " baseline"
                           : job.kind() == v1::JOB_KIND_CONFIRM ? " confirm"
                                                                : "",
                           job.has_candidate() ? absl::StrCat(" cand=", job.candidate().id()) : "", "]");
  v1::Workload workload;
  *workload.mutable_chain() = job.chain();
  auto chain = wire::ChainFromWorkload(workload);
  if (!chain.ok()) {
    p.spec = absl::InvalidArgumentError(absl::StrCat("job carries an invalid chain: ", chain.status().message()));
    return p;
  }
  JobSpec spec;
  spec.kind = job.kind() == v1::JOB_KIND_BASELINE  ? JobKind::kBaseline
              : job.kind() == v1::JOB_KIND_CONFIRM ? JobKind::kConfirm
                                                   : JobKind::kCandidate;
  spec.chain_json = ir::ChainToJson(*chain);
  spec.schedule_text = job.candidate().schedule().text();
  spec.mapping = job.candidate().mapping().text();
  spec.target = target_;
  spec.compiler = options_.compiler;
  spec.blas_dir = options_.blas_dir;
  spec.timing.warmup = job.options().warmup();
  spec.timing.min_repeats = job.options().min_repeats();
  spec.timing.max_repeats = job.options().max_repeats();
  spec.timing.time_budget_s = job.options().time_budget_s();
  if (job.options().max_spread() > 0) spec.timing.max_spread = job.options().max_spread();
  spec.timing.rotate_bytes = 2 * std::max(target_.l2_bytes * target_.compute_units, target_.l3_bytes);
  spec.timing.quiet_file = options_.quiet_file;
  spec.compile_timeout_s = std::max(1.0, job.options().timeout_s() / 2);
  spec.run_timeout_s = std::max(1.0, job.options().timeout_s() / 2);
  // A confirmation times the candidate and two baselines.
  if (spec.kind == JobKind::kConfirm) spec.run_timeout_s *= 3;
  // The validation inputs: one of the task's few sets, so that their
  // references are computed once (a candidate is timed on other inputs).
  spec.seed = TaskInputSeed(job.task_id(), job.has_candidate() ? job.candidate().id() : 0);
  if (cache_) spec.cache_dir = cache_->path();
  spec.device = options_.gpu;
  if (options_.compile_ahead > 0) {
    auto dir = TempDir::Create(options_.scratch_dir, "fusor-compiled-");
    if (dir.ok()) {
      p.artifacts.emplace(std::move(*dir));
      spec.artifact_dir = p.artifacts->path();
      JobSpec compile = spec;
      compile.phase = JobPhase::kCompile;
      Log()->debug("{} compiling {}", p.context, spec.schedule_text);
      p.compiled = std::async(std::launch::async, [compile, exe = options_.self_exe, scratch = options_.scratch_dir] {
        return RunJobIsolated(compile, exe, scratch);
      });
      spec.phase = JobPhase::kMeasure;
    } else {
      Log()->warn("{} compiling with the measurement: {}", p.context, std::string(dir.status().message()));
    }
  }
  p.spec = std::move(spec);
  return p;
}

void Worker::Finish(Pending& p) {
  const std::string& context = p.context;
  v1::Measurement m;
  if (!p.spec.ok()) {
    m.set_status(v1::MEASUREMENT_STATUS_RUNTIME_ERROR);
    m.set_error(std::string(p.spec.status().message()));
  } else {
    JobOutcome out;
    if (p.compiled.valid()) {
      JobOutcome compiled = p.compiled.get();
      if (compiled.status == OutcomeStatus::kOk) {
        Log()->debug("{} measuring", context);
        out = RunJobIsolated(*p.spec, options_.self_exe, options_.scratch_dir);
        MergeCompileRecord(compiled, out);
      } else {
        out = std::move(compiled);
      }
    } else {
      Log()->debug("{} running {}", context, p.spec->schedule_text);
      out = RunJobIsolated(*p.spec, options_.self_exe, options_.scratch_dir);
    }
    m.set_status(ToProto(out.status));
    m.set_error(out.error);
    for (double s : out.samples_s) m.add_samples_s(s);
    m.set_median_s(out.median_s);
    m.set_spread(out.spread);
    m.set_max_abs_error(out.max_abs_error);
    m.set_max_rel_error(out.max_rel_error);
    m.mutable_compile()->set_compile_s(out.compile_s);
    m.mutable_compile()->set_compiler(target_.compiler);
    m.mutable_compile()->set_flags(out.compile_flags);
    m.mutable_compile()->set_code_bytes(out.code_bytes);
    m.mutable_compile()->set_resources_json(out.resources_json);
  }
  m.set_worker_id(p.worker_id);
  m.set_measured_at_unix_ms(absl::ToUnixMillis(absl::Now()));
  if (m.status() == v1::MEASUREMENT_STATUS_OK) {
    Log()->info("{} ok: median {:.3f} ms over {} samples, spread {:.0f}% (max rel. error {:.1e})", context,
                m.median_s() * 1e3, m.samples_s_size(), 100 * m.spread(), m.max_rel_error());
  } else {
    Log()->warn("{} {}: {}", context, wire::MeasurementStatusName(m.status()), m.error().substr(0, 300));
  }

  const v1::Job& job = p.job;
  v1::ReportRequest req;
  req.set_worker_id(p.worker_id);
  req.set_worker_secret(p.worker_secret);
  req.set_job_id(job.job_id());
  req.set_lease_id(job.lease_id());
  *req.mutable_measurement() = m;
  v1::ReportResponse resp;
  // Reports are idempotent (the scheduler records a job once), so retry;
  // a scheduler that cannot store them (a full disk) is retried too, with
  // backoff, for as long as the lease can last.
  wire::RetryPolicy policy = options_.rpc;
  policy.retry_on.insert(grpc::StatusCode::RESOURCE_EXHAUSTED);
  policy.max_attempts = std::max(policy.max_attempts, 1000);
  policy.give_up_after = absl::Milliseconds(lease_ms_.load());
  wire::GrpcRetrier retrier(policy);
  grpc::Status st = retrier.Run("report", [&](grpc::ClientContext& ctx) { return Stub()->Report(&ctx, req, &resp); });
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_leases_.erase(job.lease_id());
  }
  if (!st.ok()) {
    Log()->warn("{} report not accepted: {}", context, st.error_message());
    return;
  }
  if (resp.duplicate()) Log()->info("{} the scheduler already had this result", context);
}

}  // namespace fusor::worker
