// Scheduler and worker in one process over in-process channels: a small
// GEMM chain is tuned to completion through the real services, the cache
// answers the same (renamed) chain, and a restarted scheduler resumes a
// task from its database.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "client/client.h"
#include "common/ir/canonical.h"
#include "common/ir/parse.h"
#include "common/ir/ranges.h"
#include "common/space/schedule.h"
#include "proto/wire/convert.h"
#include "proto/wire/grpc_status.h"
#include "server/metrics.h"
#include "tests/server/prometheus_text.h"
#include "server/service.h"
#include "common/util/process.h"
#include "fusor/v1/worker.grpc.pb.h"
#include "tests/test_chains.h"
#include "worker/worker.h"

namespace fusor {
namespace {

using ::testing::HasSubstr;

constexpr char kChain[] = R"(
chain small_gemm_chain
dim m=64 k=16 n=48 h=16
in A[m,k] B[k,n] D[n,h]
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
out E
)";

constexpr char kRenamed[] = R"(
chain renamed
dim rows=64 inner=16 mid=48 cols=16
in X[rows,inner] Y[inner,mid] Z[mid,cols]
T[rows,mid] = sum(inner) Y[inner,mid] * X[rows,inner]
U[rows,cols] = sum(mid) T[rows,mid] * Z[mid,cols]
out U
)";

class IntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("fusor-it-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    options_.db_path = (dir_ / "tuning.db").string();
    options_.batch_size = 2;
    // A lease whose response a stopped worker never read must expire
    // quickly for the restart test; live workers heartbeat well within it.
    options_.lease = absl::Seconds(3);
    options_.heartbeat_interval = absl::Milliseconds(300);
    options_.measure.time_budget_s = 0.02;
    options_.measure.max_repeats = 10;
    // Mechanics, on a machine the parallel tests keep busy: every
    // measurement counts (trusted_measurement_test checks the bound).
    options_.measure.max_spread = 1000;
    // The fused kernel's path through the service, whichever way a noisy
    // tiny kernel compares with its baseline (trusted_measurement_test
    // checks unfused answers).
    options_.unfused_answers = false;
  }
  void TearDown() override {
    StopWorker();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartServer() {
    auto s = server::SchedulerServer::Start(options_, "");
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }

  void StartWorker(int compile_ahead = -1) {
    worker::WorkerOptions w;
    w.compile_ahead = compile_ahead;
    w.name = "in-process";
    w.self_exe = CurrentExecutable("");
    w.calibration_s = 0.05;
    w.blas_dir = FUSOR_OPENBLAS_DIR;
    w.lease_wait = absl::Milliseconds(200);
    worker_ = std::make_unique<worker::Worker>(server_->InProcessChannel(), w);
    ASSERT_TRUE(worker_->Prepare().ok());
    worker_thread_ = std::thread([this] { EXPECT_TRUE(worker_->Run().ok()); });
    for (int i = 0; i < 200 && !worker_->registered(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(worker_->registered());
  }

  void StopWorker() {
    if (worker_) worker_->Stop();
    if (worker_thread_.joinable()) worker_thread_.join();
    worker_.reset();
  }

  v1::TuneRequest Request(const std::string& text, int budget) {
    v1::TuneRequest req;
    req.mutable_workload()->set_text(text);
    req.mutable_options()->set_budget(budget);
    return req;
  }

  std::filesystem::path dir_;
  server::SchedulerOptions options_;
  std::unique_ptr<server::SchedulerServer> server_;
  std::unique_ptr<worker::Worker> worker_;
  std::thread worker_thread_;
};

// The worker service is the core's worker protocol on the wire: a target
// without a backend is refused, an unknown worker is told to register
// again, a leased job carries its chain and the measuring options, a
// report without a status is refused, and the same report twice is
// recorded once.
TEST_F(IntegrationTest, TheWorkerServiceCarriesTheCoresWorkerProtocol) {
  StartServer();
  auto stub = v1::WorkerService::NewStub(server_->InProcessChannel());
  v1::RegisterRequest reg;
  reg.set_name("edge");
  v1::RegisterResponse registered;
  {
    grpc::ClientContext ctx;
    const grpc::Status st = stub->Register(&ctx, reg, &registered);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(st.error_message(), HasSubstr("target.backend is required"));
  }
  hw::TargetDesc target;
  target.compute_units = 1;
  *reg.mutable_target() = wire::TargetToProto(target);
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Register(&ctx, reg, &registered).ok());
  }
  EXPECT_EQ(registered.target_fingerprint(), hw::TargetFingerprint(target));
  EXPECT_EQ(registered.lease_ms(), 3000);
  EXPECT_EQ(registered.heartbeat_interval_ms(), 300);

  v1::HeartbeatRequest beat;
  beat.set_worker_id("w-unknown");
  v1::HeartbeatResponse hb;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Heartbeat(&ctx, beat, &hb).ok());
    EXPECT_TRUE(hb.reregister());
  }
  beat.set_worker_id(registered.worker_id());
  beat.set_worker_secret(registered.worker_secret());
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Heartbeat(&ctx, beat, &hb).ok());
    EXPECT_FALSE(hb.reregister());
  }

  auto prepared = server_->core().Prepare(*ir::ParseChainText(testing::kGemmChain), {});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_TRUE(server_->core().StartTune(*prepared, server::TuneOptions{1}, {"test", "test"}).ok());
  v1::LeaseRequest lease;
  lease.set_worker_id(registered.worker_id());
  lease.set_worker_secret(registered.worker_secret());
  lease.set_max_jobs(16);
  lease.set_wait_ms(5000);
  v1::LeaseResponse leased;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Lease(&ctx, lease, &leased).ok());
  }
  ASSERT_GT(leased.jobs_size(), 0);
  for (const v1::Job& job : leased.jobs()) {
    EXPECT_EQ(job.chain().ops_size(), 2);
    EXPECT_EQ(job.options().max_spread(), 1000);
    EXPECT_EQ(job.options().warmup(), 2);  // a default the scheduler filled in
    EXPECT_EQ(job.has_candidate(), job.kind() == v1::JOB_KIND_CANDIDATE);
    if (job.has_candidate()) {
      EXPECT_FALSE(job.candidate().schedule().text().empty());
    }
  }
  v1::ReportRequest report;
  report.set_worker_id(registered.worker_id());
  report.set_worker_secret(registered.worker_secret());
  report.set_job_id(leased.jobs(0).job_id());
  report.set_lease_id(leased.jobs(0).lease_id());
  v1::ReportResponse reported;
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->Report(&ctx, report, &reported).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  report.mutable_measurement()->set_status(v1::MEASUREMENT_STATUS_RUNTIME_ERROR);
  report.mutable_measurement()->set_error("the edge test's");
  for (const bool duplicate : {false, true}) {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Report(&ctx, report, &reported).ok());
    EXPECT_EQ(reported.duplicate(), duplicate);
  }
}

TEST_F(IntegrationTest, TunesToCompletionThenAnswersFromTheCache) {
  StartServer();
  StartWorker();
  client::Client client(server_->InProcessChannel());
  int progress_events = 0;
  bool started = false;
  auto result = client.Tune(
      Request(kChain, 4),
      [&](const v1::TuneEvent& e) {
        started |= e.has_started();
        progress_events += e.has_progress();
      },
      absl::Seconds(120));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(started);
  EXPECT_GE(progress_events, 2);
  EXPECT_FALSE(result->from_cache());
  EXPECT_EQ(result->candidates_measured(), 4);
  EXPECT_EQ(result->best_measurement().status(), v1::MEASUREMENT_STATUS_OK);
  EXPECT_GT(result->best_measurement().samples_s_size(), 0);
  EXPECT_GT(result->baseline_s(), 0);
  EXPECT_NEAR(result->speedup(), result->baseline_s() / result->best_measurement().median_s(), 1e-9);
  EXPECT_TRUE(space::ParseSchedule(result->best().schedule().text(), *ir::ParseChainText(kChain)).ok());
  EXPECT_GT(result->best().prediction().t_estm_s(), 0);

  // 4 candidates, the baseline (among the first candidates) and the best
  // measured again with the baseline beside it, every sample kept; on a
  // busy machine a confirmation may come out noisy, or disagree, and be
  // taken again (3 runs at most): the last is the trusted one.
  auto& db = server_->core().db();
  auto rows = db.MeasurementsOfTask(result->task_id());
  ASSERT_TRUE(rows.ok()) << rows.status();
  const int confirms = static_cast<int>(
      std::count_if(rows->begin(), rows->end(), [](const auto& m) { return m.kind == db::JobKind::kConfirm; }));
  ASSERT_TRUE(confirms >= 1 && confirms <= 3) << confirms;
  const int expected = 5 + confirms;
  EXPECT_EQ(*db.CountMeasurements(), expected);
  EXPECT_EQ(static_cast<int>(rows->size()), expected);  // the baseline and the confirmation are the task's too
  EXPECT_EQ(result->baseline().status(), v1::MEASUREMENT_STATUS_OK);
  EXPECT_FALSE(result->baseline_kind().empty());
  int confirm = 0;
  for (const auto& m : *rows) {
    const bool retried = m.kind == db::JobKind::kConfirm && ++confirm < confirms;
    if (!retried) EXPECT_EQ(m.status, db::MeasurementStatus::kOk) << m.error;
    EXPECT_FALSE(m.samples_s.empty());
  }

  // The same chain under other names: a cache hit in the requester's names.
  auto cached = client.Tune(Request(kRenamed, 4), nullptr, absl::Seconds(30));
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_TRUE(cached->from_cache());
  EXPECT_EQ(cached->workload_key(), result->workload_key());
  // In the requester's names: it parses against the renamed chain.
  EXPECT_TRUE(space::ParseSchedule(cached->best().schedule().text(), *ir::ParseChainText(kRenamed)).ok())
      << cached->best().schedule().text();
  // U is in either association order (T may have been regrouped away).
  EXPECT_THAT(cached->best().mapping().text(), HasSubstr("U=fma."));
  EXPECT_EQ(*db.CountMeasurements(), expected);

  v1::CompileRequest compile;
  compile.mutable_workload()->set_text(kRenamed);
  compile.set_cache_only(true);
  auto kernel = client.Compile(compile, absl::Seconds(30));
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_THAT(kernel->kernel_source(), HasSubstr("extern \"C\" int fusor_run"));
  EXPECT_THAT(kernel->kernel_source(), HasSubstr("g_X"));
  EXPECT_THAT(kernel->metadata_json(), HasSubstr("\"name\": \"U\""));

  auto task = client.GetTask(result->task_id());
  ASSERT_TRUE(task.ok());
  EXPECT_EQ(task->state(), "done");
  auto workers = client.ListWorkers();
  ASSERT_EQ(workers->workers_size(), 1);
  EXPECT_EQ(workers->workers(0).jobs_done(), expected);

  // Each job's wait in the queue and its lease's time are in the metrics'
  // histograms: the candidates (the baseline is one of its own), the confirmations.
  auto metrics = server::RenderMetrics(server_->core());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("# TYPE fusor_queue_wait_seconds histogram\n"));
  EXPECT_THAT(*metrics, HasSubstr("fusor_queue_wait_seconds_count{kind=\"candidate\"} 4\n"));
  EXPECT_THAT(*metrics, HasSubstr("fusor_job_duration_seconds_count{kind=\"candidate\"} 4\n"));
  EXPECT_THAT(*metrics, HasSubstr(absl::StrCat("fusor_job_duration_seconds_count{kind=\"confirm\"} ", confirms, "\n")));
  EXPECT_THAT(*metrics, HasSubstr("fusor_job_duration_seconds_bucket{kind=\"baseline\",le=\"+Inf\"} 1\n"));
  EXPECT_THAT(fusor::testing::PrometheusTextProblems(*metrics), ::testing::IsEmpty());
}

// Traffic of many lengths: a workload whose varying dims are widened to
// their range is tuned once for the range; a length inside it is covered
// by that record, one outside it is answered at once by the record's
// schedule carried over (not yet validated), then validated and timed by a
// one-candidate task; a lookup that misses says what differs. A GPU target
// takes exact sizes only.
TEST_F(IntegrationTest, ARangeOfSizesIsTunedOnceCoveredTransferredAndExplained) {
  StartServer();
  StartWorker();
  client::Client client(server_->InProcessChannel());
  auto at = [](int m) {
    return absl::StrCat("chain rows\ndim m=", m, " k=16 n=48 h=16\nin A[m,k] B[k,n] D[n,h]\n",
                        "C[m,n] = sum(k) A[m,k] * B[k,n]\nE[m,h] = sum(n) C[m,n] * D[n,h]\nout E\n");
  };
  v1::TuneRequest tune = Request(at(100), 2);
  tune.mutable_workload()->add_vary("m");
  auto tuned = client.Tune(tune, nullptr, absl::Seconds(120));
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  EXPECT_EQ(tuned->answer(), "tuned");
  EXPECT_EQ(tuned->served_dims(), "m=65..256");
  // The measurement: one call at each timed size, each size's medians recorded.
  auto measured = server_->core().db().GetMeasurement(server_->core().db().GetBest(
      tuned->workload_key(), tuned->target().fingerprint(), server_->core().Salt())->value().measurement_id);
  ASSERT_TRUE(measured.ok());
  EXPECT_THAT(measured->resources_json, HasSubstr("\"sizes\""));

  // 200 rows with m varying: the same range, the same record.
  v1::LookupRequest lookup;
  lookup.mutable_workload()->set_text(at(200));
  lookup.mutable_workload()->add_vary("m");
  auto same = client.Lookup(lookup);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->result().workload_key(), tuned->workload_key());
  // 150 rows exactly: not served by the range's kernel (its caller's buffers hold 150 rows, the kernel's
  // fusor_run runs at 256), but by its schedule carried over.
  lookup.mutable_workload()->clear_vary();
  lookup.mutable_workload()->set_text(at(150));
  auto exact = client.Lookup(lookup);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->result().answer(), "transferred");
  EXPECT_EQ(exact->result().source_key(), tuned->workload_key());
  // Rows 100 to 200, a range the user wrote: inside the record's, its kernel taking m at each call.
  lookup.mutable_workload()->set_text(absl::StrReplaceAll(at(200), {{"m=200", "m=100..200"}}));
  auto covered = client.Lookup(lookup);
  ASSERT_TRUE(covered.ok()) << covered.status();
  EXPECT_EQ(covered->result().answer(), "covered");
  EXPECT_EQ(covered->result().source_key(), tuned->workload_key());
  v1::CompileRequest compile;
  *compile.mutable_workload() = lookup.workload();
  compile.set_cache_only(true);
  auto kernel = client.Compile(compile, absl::Seconds(30));
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_THAT(kernel->kernel_source(), HasSubstr("fusor_run_dims"));
  EXPECT_THAT(kernel->metadata_json(), HasSubstr("\"min\": 65"));

  // 40 rows varying: no record of 17..64; the nearest record's schedule, at once, unvalidated...
  lookup.mutable_workload()->set_text(at(40));
  lookup.mutable_workload()->add_vary("m");
  lookup.set_explain(true);
  auto transferred = client.Lookup(lookup);
  ASSERT_TRUE(transferred.ok()) << transferred.status();
  EXPECT_EQ(transferred->result().answer(), "transferred");
  EXPECT_FALSE(transferred->result().validated());
  EXPECT_EQ(transferred->result().source_key(), tuned->workload_key());
  EXPECT_EQ(transferred->why().nearest_key(), tuned->workload_key());
  ASSERT_EQ(transferred->why().differences_size(), 1);
  EXPECT_EQ(transferred->why().differences(0).field(), "dim m");
  EXPECT_EQ(transferred->why().differences(0).wanted(), "17..64");
  EXPECT_EQ(transferred->why().differences(0).found(), "65..256");
  // ...which a compile with transfer validates and times in a task of one candidate.
  *compile.mutable_workload() = lookup.workload();
  compile.set_cache_only(false);
  compile.mutable_options()->set_transfer(true);
  auto validated = client.Compile(compile, absl::Seconds(120));
  ASSERT_TRUE(validated.ok()) << validated.status();
  EXPECT_EQ(validated->result().answer(), "transferred");
  EXPECT_TRUE(validated->result().validated());
  EXPECT_EQ(validated->result().candidates_measured(), 1);
  EXPECT_EQ(validated->result().served_dims(), "m=17..64");

  // Another dtype, explained: the same chain name, one field apart.
  lookup.mutable_workload()->set_text(absl::StrReplaceAll(at(100), {{"chain rows\n", "chain rows\ndtype f16\n"}}));
  auto why = client.Lookup(lookup);
  ASSERT_TRUE(why.ok()) << why.status();
  EXPECT_FALSE(why->has_result());
  ASSERT_GE(why->why().differences_size(), 1);
  EXPECT_EQ(why->why().differences(0).field(), "dtype");
  // Without explain, a miss is NOT_FOUND naming the nearest record.
  lookup.set_explain(false);
  auto miss = client.Lookup(lookup);
  EXPECT_EQ(miss.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(miss.status().message(), HasSubstr("nearest record"));
  // A dim that cannot vary is refused, naming it.
  tune.mutable_workload()->set_text(at(100));
  tune.mutable_workload()->clear_vary();
  tune.mutable_workload()->add_vary("q");
  auto refused = client.Tune(tune, nullptr, absl::Seconds(30));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("'q' is not a dim"));
  // A GPU takes exact sizes.
  hw::TargetDesc gpu;
  gpu.backend = hw::Backend::kCuda;
  gpu.arch = "sm_90";
  gpu.compute_units = 132;
  ASSERT_TRUE(server_->core().Register("gpu", gpu).ok());
  server::TargetSelector cuda;
  cuda.backend = hw::Backend::kCuda;
  auto on_gpu = server_->core().Prepare(*ir::ParseChainText(at(100)), cuda, {"m"});
  EXPECT_EQ(on_gpu.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(on_gpu.status().message(), HasSubstr("CPU targets only"));
}

// A workload written by fusor before families (its family key empty) gets
// one when a scheduler opens the database, so records of older fusor serve
// other sizes of their chains too.
TEST_F(IntegrationTest, WorkloadsOfOlderFusorGainTheirFamily) {
  const ir::Chain chain = *ir::ParseChainText(kChain);
  const ir::CanonicalForm canonical = ir::Canonicalize(chain);
  {
    auto db = db::TuningDb::Open(options_.db_path);
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE((*db)->UpsertWorkload({canonical.key, chain.name, canonical.text, ir::ChainToJson(canonical.chain)}, 1)
                    .ok());
    EXPECT_EQ((*db)->GetWorkload(canonical.key)->family_key, "");
  }
  StartServer();
  auto row = server_->core().db().GetWorkload(canonical.key);
  ASSERT_TRUE(row.ok()) << row.status();
  EXPECT_EQ(row->family_key, ir::CanonicalFamily(chain).key);
}

// Convolution chains go through the same machinery as GEMM chains: their
// convolutions map onto the micro-kernel (window loops outside it), every
// candidate is validated against float64 and stored.
TEST_F(IntegrationTest, ConvChainsTuneEndToEnd) {
  StartServer();
  StartWorker();
  client::Client client(server_->InProcessChannel());
  for (const char* name : {"conv1x1_chain.fusor", "conv_chain.fusor"}) {
    std::ifstream in(std::string(FUSOR_SOURCE_DIR) + "/examples/" + name);
    std::stringstream text;
    text << in.rdbuf();
    auto result = client.Tune(Request(text.str(), 3), nullptr, absl::Seconds(300));
    ASSERT_TRUE(result.ok()) << name << ": " << result.status();
    EXPECT_EQ(result->candidates_measured(), 3) << name;
    EXPECT_EQ(result->candidates_failed(), 0) << name;
    EXPECT_LT(result->best_measurement().max_rel_error(), 1e-4) << name;
    EXPECT_GT(result->speedup(), 0) << name;
    EXPECT_THAT(result->best().mapping().text(), HasSubstr("T=fma.")) << name;
    auto rows = server_->core().db().MeasurementsOfTask(result->task_id());
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_FALSE(rows->empty()) << name;
    for (const auto& m : *rows) {
      EXPECT_EQ(m.status, db::MeasurementStatus::kOk) << name << ": " << m.error;
    }
  }
}

TEST_F(IntegrationTest, CacheOnlyMissIsNotFoundAndBadInputIsInvalid) {
  StartServer();
  StartWorker();
  client::Client client(server_->InProcessChannel());
  v1::CompileRequest compile;
  compile.mutable_workload()->set_text(kChain);
  compile.set_cache_only(true);
  EXPECT_TRUE(absl::IsNotFound(client.Compile(compile, absl::Seconds(10)).status()));
  auto bad = client.Tune(Request("dim m=4\nin A[m]\nB[m] = A[m] +\nout B", 4), nullptr, absl::Seconds(10));
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("line 3, column 14"));
  // An error that would echo a long input (an 18 KB name) says what it is,
  // cut short: past 16 KiB a client would see RESOURCE_EXHAUSTED instead.
  const std::string name(18000, 'x');
  for (const std::string& text : {"dim m=4\nin " + name + "-[m]\nB[m] = A[m]\nout B",
                                   "dim m=4\nin " + name + "[m]\nB[m] = " + name + "[m]\nout B"}) {
    auto long_name = client.Tune(Request(text, 4), nullptr, absl::Seconds(10));
    EXPECT_TRUE(absl::IsInvalidArgument(long_name.status())) << long_name.status().ToString().substr(0, 300);
    EXPECT_LT(long_name.status().message().size(), 600u);
  }
  // Past the workload limit, and past the server's message limit.
  std::string padded = std::string(kChain) + "#" + std::string(100 * 1024, 'x') + "\n";
  auto big = client.Tune(Request(padded, 4), nullptr, absl::Seconds(10));
  EXPECT_TRUE(absl::IsInvalidArgument(big.status())) << big.status().ToString().substr(0, 300);
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("bytes; the limit is 65536"));
  padded += "#" + std::string(2 * 1024 * 1024, 'y') + "\n";
  EXPECT_TRUE(absl::IsResourceExhausted(client.Tune(Request(padded, 4), nullptr, absl::Seconds(10)).status()));
  std::string huge(3000, 'e');
  auto cut = wire::FromGrpcStatus(wire::ToGrpcStatus(absl::InvalidArgumentError(huge + std::string(40000, 'f'))));
  EXPECT_TRUE(absl::IsInvalidArgument(cut));
  EXPECT_LT(cut.message().size(), 2100u);
  EXPECT_THAT(std::string(cut.message()), HasSubstr("... (43000 bytes)"));
  EXPECT_EQ(*server_->core().db().CountMeasurements(), 0);
}

TEST_F(IntegrationTest, RestartedSchedulerResumesItsTask) {
  StartServer();
  StartWorker();
  // Let the first task get going, then take everything down mid-task. (The in-process channel dies with its
  // server: this client must not ask again.)
  wire::RetryPolicy once;
  once.max_attempts = 1;
  client::Client client(server_->InProcessChannel(), once);
  std::string task_id;
  std::thread tuner([&] {
    (void)client.Tune(
        Request(kChain, 6),
        [&](const v1::TuneEvent& e) {
          if (e.has_started()) task_id = e.started().task_id();
        },
        absl::Seconds(5));
  });
  for (int i = 0; i < 500; ++i) {
    auto count = server_->core().db().CountMeasurements();
    if (count.ok() && *count >= 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  StopWorker();
  server_.reset();
  tuner.join();
  ASSERT_FALSE(task_id.empty());

  StartServer();
  const int64_t before = *server_->core().db().CountMeasurements();
  EXPECT_LT(before, 9);  // not finished
  StartWorker();
  client::Client again(server_->InProcessChannel());
  for (int i = 0; i < 1500; ++i) {
    auto task = again.GetTask(task_id);
    ASSERT_TRUE(task.ok()) << task.status();
    if (task->state() != "running") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto task = again.GetTask(task_id);
  EXPECT_EQ(task->state(), "done") << task->error();
  // Six candidates, the baseline and the confirmation, each job measured
  // exactly once. A confirmation measured noisy (or disagreeing) on a busy
  // machine is asked for again, in a job of its own, 3 runs at most.
  auto rows = server_->core().db().MeasurementsOfTask(task_id);
  int candidates = 0, baselines = 0, confirms = 0, noisy_confirms = 0;
  std::set<std::string> jobs;
  for (const auto& m : *rows) {
    jobs.insert(m.job_id);
    candidates += m.kind == db::JobKind::kCandidate;
    baselines += m.kind == db::JobKind::kBaseline;
    if (m.kind == db::JobKind::kConfirm) {
      ++confirms;
      noisy_confirms += m.status == db::MeasurementStatus::kNoisy;
    }
  }
  EXPECT_EQ(candidates, 6);
  EXPECT_EQ(baselines, 1);
  EXPECT_GE(confirms, 1 + std::min(2, noisy_confirms));
  EXPECT_LE(confirms, 3);
  EXPECT_EQ(jobs.size(), rows->size());
}

// A second scheduler on the same database file (another embedded CLI, or
// fusor-scheduler) is refused until the first is gone: both would resume
// the same tasks and sweeps.
// Per-client quotas: a client over its running tasks or its candidates
// still to measure is refused with RESOURCE_EXHAUSTED and a retry hint
// (through the wire too), others are not, joining a running task is always
// allowed; chains past the complexity limits are refused outright.
TEST_F(IntegrationTest, QuotasPerClientWithARetryHintAndComplexityLimits) {
  options_.max_tasks_per_client = 2;
  options_.max_candidates_per_client = 10;
  options_.max_tensor_elements = 1 << 20;
  options_.max_sweeps_per_client = 1;
  StartServer();
  server::Scheduler& core = server_->core();
  hw::TargetDesc idle;  // a target, with no worker measuring for it
  idle.compute_units = 1;
  ASSERT_TRUE(core.Register("idle", idle).ok());
  auto prepare = [&](int m) {
    auto p = core.Prepare(*ir::ParseChainText("dim m=" + std::to_string(m) +
                                              " k=16 n=32\nin A[m,k] B[k,n]\nC[m,n] = sum(k) A[m,k] * B[k,n]\n"
                                              "D[m,n] = relu(C[m,n])\nout D\n"),
                          server::TargetSelector());
    EXPECT_TRUE(p.ok()) << p.status();
    return *p;
  };
  auto budget = [](int n) { return server::TuneOptions{n}; };
  const server::Caller alice{"tok-a", "alice"}, bob{"tok-b", "bob"};
  auto first = core.StartTune(prepare(16), budget(4), alice);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(core.StartTune(prepare(32), budget(4), alice).ok());
  auto third = core.StartTune(prepare(48), budget(1), alice);
  ASSERT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  EXPECT_THAT(std::string(third.status().message()), HasSubstr("client 'alice' has 2 tasks running (at most 2)"));
  ASSERT_TRUE(wire::RetryAfter(third.status()).has_value());
  EXPECT_EQ(*wire::RetryAfter(third.status()), absl::Seconds(30));  // no measurement yet to judge the pace by

  auto joined = core.StartTune(prepare(16), budget(4), bob);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->started.task_id, first->started.task_id);
  ASSERT_TRUE(core.StartTune(prepare(48), budget(8), bob).ok());
  auto over = core.StartTune(prepare(64), budget(4), bob);
  ASSERT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("8 candidates still to measure"));
  // A sweep's task is admitted with its sweep.
  EXPECT_TRUE(core.StartTune(prepare(64), budget(4), bob, /*counted=*/false).ok());

  // Over the wire: the in-process caller starts one task (its call gives
  // up waiting), then a second that would pass its candidates: refused,
  // with the hint in the trailing metadata.
  client::Client client(server_->InProcessChannel());
  auto waited = client.Tune(Request("dim m=80 k=16 n=32\nin A[m,k] B[k,n]\nC[m,n] = sum(k) A[m,k] * B[k,n]\nout C\n", 4),
                            nullptr, absl::Seconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(waited.status())) << waited.status();
  auto refused = client.Tune(Request("dim m=96 k=16 n=32\nin A[m,k] B[k,n]\nC[m,n] = sum(k) A[m,k] * B[k,n]\nout C\n", 8),
                             nullptr, absl::Seconds(10));
  ASSERT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  ASSERT_TRUE(wire::RetryAfter(refused.status()).has_value());
  EXPECT_GE(*wire::RetryAfter(refused.status()), absl::Seconds(1));
  auto metrics = server::RenderMetrics(core);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("fusor_quota_refusals_total{limit=\"tasks\"} 1\n"));
  EXPECT_THAT(*metrics, HasSubstr("fusor_quota_refusals_total{limit=\"candidates\"} 2\n"));

  // Complexity: a tensor past --max-tensor-elements, even one whose extents'
  // product overflows 64 bits, is refused before anything is stored.
  const size_t tasks = core.db().ListTasksInState(db::TaskState::kRunning)->size();
  auto big = client.Tune(Request("dim m=2048 n=1024\nin A[m,n]\nB[m,n] = relu(A[m,n])\nout B\n", 1), nullptr,
                         absl::Seconds(10));
  ASSERT_TRUE(absl::IsInvalidArgument(big.status())) << big.status();
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("elements; this scheduler takes at most 1048576"));
  auto huge = client.Tune(
      Request("dim m=999999999999 n=999999999999\nin A[m,n]\nB[m,n] = relu(A[m,n])\nout B\n", 1), nullptr,
      absl::Seconds(10));
  EXPECT_TRUE(absl::IsInvalidArgument(huge.status())) << huge.status();
  EXPECT_EQ(core.db().ListTasksInState(db::TaskState::kRunning)->size(), tasks);

  // Sweeps: one running per client here; a second is refused, asking for
  // the running one again joins it.
  auto sweep = [&](const std::string& name) {
    v1::SweepRequest req;
    req.set_name(name);
    req.set_detach(true);
    v1::SweepEntry* e = req.add_entries();
    e->set_model(name);
    e->set_instances(1);
    *e->mutable_chain() = wire::ChainToProto(
        *ir::ParseChainText("dim m=112 k=16 n=32\nin A[m,k] B[k,n]\nC[m,n] = sum(k) A[m,k] * B[k,n]\nout C\n"));
    return client.Sweep(req, nullptr, absl::Seconds(10));
  };
  ASSERT_TRUE(sweep("zoo-a").ok());
  auto second = sweep("zoo-b");
  ASSERT_TRUE(absl::IsResourceExhausted(second.status())) << second.status();
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("has 1 sweep running (at most 1)"));
  EXPECT_EQ(wire::RetryAfter(second.status()), std::optional<absl::Duration>(absl::Minutes(1)));
  EXPECT_TRUE(sweep("zoo-a").ok());
}

TEST_F(IntegrationTest, OneSchedulerPerDatabaseFile) {
  StartServer();
  auto second = server::Scheduler::Create(options_);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  EXPECT_THAT(std::string(second.status().message()),
              ::testing::HasSubstr("is in use by another fusor scheduler (process " + std::to_string(getpid())));
  server_.reset();
  auto third = server::Scheduler::Create(options_);
  EXPECT_TRUE(third.ok()) << third.status();
}

// Jobs compiled in their own children while another is measured (what a
// GPU worker does by default) are each measured once, with their compile
// record, and the task completes as it would one job at a time.
TEST_F(IntegrationTest, CompilingAheadMeasuresEveryJobOnce) {
  options_.batch_size = 4;
  StartServer();
  StartWorker(/*compile_ahead=*/2);
  client::Client client(server_->InProcessChannel());
  // While the task runs, count the jobs the one worker holds at once: more
  // than one only if it leases ahead to compile.
  std::atomic<bool> done{false};
  std::atomic<size_t> most_held{0};
  std::mutex mu;
  std::string task_id;
  std::thread watcher([&] {
    for (int i = 0; i < 12000 && !done; ++i) {
      std::string id;
      {
        std::lock_guard<std::mutex> lock(mu);
        id = task_id;
      }
      if (!id.empty()) {
        auto jobs = server_->core().db().JobsOfTask(id);
        size_t held = 0;
        if (jobs.ok()) {
          for (const auto& j : *jobs) held += j.state == db::JobState::kLeased;
        }
        most_held = std::max<size_t>(most_held, held);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  auto result = client.Tune(
      Request(kChain, 6),
      [&](const v1::TuneEvent& e) {
        if (!e.has_started()) return;
        std::lock_guard<std::mutex> lock(mu);
        task_id = e.started().task_id();
      },
      absl::Seconds(120));
  done = true;
  watcher.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->candidates_measured(), 6);
  EXPECT_GE(most_held.load(), 2u);
  auto rows = server_->core().db().MeasurementsOfTask(result->task_id());
  ASSERT_TRUE(rows.ok()) << rows.status();
  // Six candidates, the baseline and the confirmation; a confirmation measured noisy on a busy machine is
  // asked for again (3 runs at most).
  int noisy_confirms = 0;
  for (const auto& m : *rows) noisy_confirms += m.kind == db::JobKind::kConfirm && m.status == db::MeasurementStatus::kNoisy;
  EXPECT_EQ(rows->size(), 8u + std::min(2, noisy_confirms));
  std::set<std::string> jobs;
  for (const auto& m : *rows) {
    jobs.insert(m.job_id);
    if (m.kind != db::JobKind::kConfirm || m.status != db::MeasurementStatus::kNoisy) {
      EXPECT_EQ(m.status, db::MeasurementStatus::kOk) << m.error;
    }
    EXPECT_FALSE(m.samples_s.empty());
    // A confirmation's kernel was compiled by its candidate's job: the
    // worker copies it (0 s) with its record.
    if (m.kind == db::JobKind::kConfirm) {
      EXPECT_EQ(m.compile_s, 0);
    } else {
      EXPECT_GT(m.compile_s, 0);
    }
    EXPECT_GT(m.code_bytes, 0);
    EXPECT_THAT(m.compile_flags, HasSubstr("-O"));
  }
  EXPECT_EQ(jobs.size(), rows->size());
}

}  // namespace
}  // namespace fusor
