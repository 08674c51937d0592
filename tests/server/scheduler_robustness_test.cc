// What an outside tester tried against the scheduler: reports forged under
// another worker's registration or lease, and a database that cannot be
// written. Each gets a clear status and leaves the database unchanged. The
// scheduler is driven directly, as a worker would drive it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>
#include <functional>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/codegen/cuda/nvrtc.h"
#include "common/hw/devices.h"
#include "common/ir/parse.h"
#include "proto/wire/convert.h"
#include "server/scheduler.h"
#include "server/wire_rows.h"
#include "tests/test_chains.h"
#include "tests/test_targets.h"

namespace fusor::server {
namespace {

using ::testing::HasSubstr;

class SchedulerRobustnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("fusor-robustness-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    Open();
  }
  void TearDown() override {
    scheduler_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Open(absl::Duration worker_timeout = absl::Seconds(20)) {
    scheduler_.reset();
    SchedulerOptions o;
    o.db_path = (dir_ / "tuning.db").string();
    o.batch_size = 4;
    o.worker_timeout = worker_timeout;
    auto s = Scheduler::Create(o);
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(*s);
  }

  static hw::TargetDesc CpuTarget() { return testing::Avx2Target(); }

  WorkerCredentials RegisterWorker(const std::string& name, const hw::TargetDesc& t = CpuTarget()) {
    auto r = scheduler_->Register(name, t);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->credentials : WorkerCredentials();
  }

  std::string StartTask(bool force = false, const TargetSelector& target = {}, int budget = 4) {
    auto req = scheduler_->Prepare(*ir::ParseChainText(testing::kGemmChain), target);
    EXPECT_TRUE(req.ok()) << req.status();
    auto start = scheduler_->StartTune(*req, TuneOptions{budget, force}, {"test", "test"});
    EXPECT_TRUE(start.ok()) << start.status();
    return start->started.task_id;
  }

  // The answer kept for the GEMM chain's text on `target`.
  absl::StatusOr<std::shared_ptr<Scheduler::Answer>> CachedAnswer(const TargetSelector& target = {}) {
    return scheduler_->CachedAnswer(
        testing::kGemmChain, [] { return ir::ParseChainText(testing::kGemmChain); }, target);
  }

  std::vector<LeasedJob> Lease(const WorkerCredentials& w) {
    auto jobs = scheduler_->Lease(w, 16, absl::ZeroDuration(), nullptr);
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    return jobs.value_or(std::vector<LeasedJob>());
  }

  static JobReport Report(const std::string& worker_id, const std::string& secret, const LeasedJob& leased,
                          double median_s) {
    JobReport report{{worker_id, secret}, leased.job.id, leased.job.lease_id, {}};
    report.measurement.status = db::MeasurementStatus::kOk;
    report.measurement.samples_s.assign(10, median_s);
    report.measurement.median_s = median_s;
    return report;
  }

  // Measures every job of `task` as taking `median_s` until it is done.
  void Finish(const std::string& task, const WorkerCredentials& w, double median_s) {
    for (int round = 0; round < 20; ++round) {
      for (const LeasedJob& job : Lease(w)) {
        EXPECT_TRUE(scheduler_->Report(Report(w.worker_id, w.secret, job, median_s)).ok());
      }
      auto snap = scheduler_->WaitForTask(task, 0, absl::ZeroDuration());
      if (snap.ok() && snap->state != db::TaskState::kRunning) break;
    }
    EXPECT_EQ(scheduler_->WaitForTask(task, 0, absl::ZeroDuration())->state, db::TaskState::kDone);
  }

  int64_t Measurements() { return scheduler_->db().CountMeasurements().value_or(-1); }

  // A fresh database and scheduler.
  void Reset() {
    scheduler_.reset();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    Open();
  }

  // The schedules a task of budget 12 proposes, in the order proposed
  // (of the candidates' ids), each measured as a time that depends on its
  // schedule. With `recalibrated`, after the first batch the worker
  // registers again with those W and P, as a worker restarted and
  // calibrated anew would, and the scheduler restarts.
  std::vector<std::string> Proposed(const hw::TargetDesc& target, const hw::TargetDesc* recalibrated) {
    WorkerCredentials w = RegisterWorker("w", target);
    const std::string task = StartTask(false, {}, 12);
    std::map<int64_t, std::string> proposed;
    for (int round = 0; round < 20; ++round) {
      for (const LeasedJob& job : Lease(w)) {
        const std::string schedule = job.candidate ? job.candidate->schedule : "";
        if (job.job.kind == db::JobKind::kCandidate) proposed[job.candidate->id] = schedule;
        const double median_s = 1e-3 * (1 + static_cast<double>(std::hash<std::string>()(schedule) % 97) / 97);
        EXPECT_TRUE(scheduler_->Report(Report(w.worker_id, w.secret, job, median_s)).ok());
      }
      if (round == 0 && recalibrated != nullptr) {
        RegisterWorker("w", *recalibrated);
        Open();
        w = RegisterWorker("w", *recalibrated);
      }
      auto snap = scheduler_->WaitForTask(task, 0, absl::ZeroDuration());
      if (snap.ok() && snap->state != db::TaskState::kRunning) break;
    }
    std::vector<std::string> in_order;
    for (const auto& [id, schedule] : proposed) in_order.push_back(schedule);
    return in_order;
  }

  std::filesystem::path dir_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(SchedulerRobustnessTest, ReportsAreBoundToTheWorkerThatLeasedTheJob) {
  const WorkerCredentials honest = RegisterWorker("honest");
  const WorkerCredentials impostor = RegisterWorker("impostor");  // holds the same worker token
  ASSERT_FALSE(honest.secret.empty());
  ASSERT_NE(honest.secret, impostor.secret);
  StartTask();
  const std::vector<LeasedJob> jobs = Lease(honest);
  ASSERT_FALSE(jobs.empty());
  const LeasedJob& job = jobs[0];
  const int64_t before = Measurements();

  // The honest worker's id and lease, without its secret.
  for (const std::string& secret : {impostor.secret, std::string()}) {
    auto forged = scheduler_->Report(Report(honest.worker_id, secret, job, 1e-9));
    EXPECT_TRUE(absl::IsPermissionDenied(forged.status())) << forged.status();
    EXPECT_THAT(std::string(forged.status().message()),
                HasSubstr("worker secret does not match the registration of worker " + honest.worker_id));
  }
  // The impostor's own registration, the honest worker's lease.
  auto own_id = scheduler_->Report(Report(impostor.worker_id, impostor.secret, job, 1e-9));
  EXPECT_TRUE(absl::IsPermissionDenied(own_id.status())) << own_id.status();
  EXPECT_THAT(std::string(own_id.status().message()),
              HasSubstr("is held by worker " + honest.worker_id + ", not by worker " + impostor.worker_id));
  // Nor can it lease or keep leases alive as the honest worker.
  const WorkerCredentials forged{honest.worker_id, impostor.secret};
  EXPECT_TRUE(absl::IsPermissionDenied(scheduler_->Lease(forged, 1, absl::ZeroDuration(), nullptr).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(scheduler_->Heartbeat(forged, {}).status()));

  EXPECT_EQ(Measurements(), before);
  auto row = scheduler_->db().GetJob(job.job.id);
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->state, db::JobState::kLeased);
  EXPECT_EQ(row->worker_id, honest.worker_id);

  // The honest report is recorded, not dropped as a duplicate.
  auto honest_report = scheduler_->Report(Report(honest.worker_id, honest.secret, job, 2e-3));
  ASSERT_TRUE(honest_report.ok()) << honest_report.status();
  EXPECT_EQ(*honest_report, ReportReceipt::kRecorded);
  EXPECT_EQ(Measurements(), before + 1);

  // Once the job is done, a report under a made-up lease (by anyone) is
  // refused, not taken for a repeat; the same report again is.
  LeasedJob made_up = job;
  made_up.job.lease_id = "l-made-up";
  for (const WorkerCredentials& w : {impostor, honest}) {
    auto late = scheduler_->Report(Report(w.worker_id, w.secret, made_up, 1e-3));
    EXPECT_TRUE(absl::IsFailedPrecondition(late.status())) << late.status();
    EXPECT_THAT(std::string(late.status().message()), HasSubstr("finished under another lease"));
  }
  auto repeated = scheduler_->Report(Report(honest.worker_id, honest.secret, job, 2e-3));
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  EXPECT_EQ(*repeated, ReportReceipt::kDuplicate);
  EXPECT_EQ(Measurements(), before + 1);
}

// What a worker says of itself is listed and logged: its name has a
// length limit and a character set, its target's texts are printable and
// bounded, and lost workers leave the list (issue 36, findings 6 and 7).
TEST_F(SchedulerRobustnessTest, WorkerNamesAreBoundedAndLostWorkersLeaveTheList) {
  hw::TargetDesc escaped = CpuTarget();
  escaped.device_name = "cpu\x1b[2J";
  for (const auto& [name, target] :
       {std::pair{std::string("w\n2026-12-05 12:00:00.000 info [scheduler] a fake line"), CpuTarget()},
        {std::string(900 << 10, 'w'), CpuTarget()}, {std::string("w"), escaped}}) {
    auto r = scheduler_->Register(name, target);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status().ToString().substr(0, 200);
    EXPECT_LT(r.status().message().size(), 300u);
    EXPECT_EQ(r.status().message().find('\n'), absl::string_view::npos);
  }
  const WorkerCredentials gone = RegisterWorker("gone"), back = RegisterWorker("back");
  ASSERT_TRUE(scheduler_->db().MarkLostWorkers(NowMs() + 1).ok());
  ASSERT_TRUE(scheduler_->Heartbeat(back, {}).ok());  // alive again
  auto listed = scheduler_->db().ListWorkers(0);  // lost ones kept for ever
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 2u);
  listed = scheduler_->db().ListWorkers(NowMs() + 1000);  // lost ones silent since before then go
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].name, "back");
}

// A worker that keeps calling while the database refuses writes (as on a
// full or read-only disk) is not marked lost once the database takes writes
// again (issue 36, finding 4).
TEST_F(SchedulerRobustnessTest, AWorkerWaitingOutAStorageErrorIsNotMarkedLost) {
  Open(absl::Seconds(1));
  const WorkerCredentials w = RegisterWorker("patient");
  ASSERT_TRUE(scheduler_->db().SetQueryOnly(true).ok());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < until) {  // longer than the worker timeout
    const absl::Status st = scheduler_->Heartbeat(w, {}).status();
    EXPECT_TRUE(absl::IsUnavailable(st)) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr((dir_ / "tuning.db").string()));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(scheduler_->db().SetQueryOnly(false).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // reaper passes, within the timeout
  auto row = scheduler_->db().GetWorker(w.worker_id);
  ASSERT_TRUE(row.ok()) << row.status();
  EXPECT_EQ(row->state, db::WorkerState::kAlive);
}

TEST_F(SchedulerRobustnessTest, AnExpiredLeaseSaysSo) {
  const WorkerCredentials w = RegisterWorker("w");
  StartTask();
  std::vector<LeasedJob> jobs = Lease(w);
  ASSERT_FALSE(jobs.empty());
  LeasedJob stale = jobs[0];
  stale.job.lease_id = "l-not-this-one";
  auto r = scheduler_->Report(Report(w.worker_id, w.secret, stale, 1e-3));
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("nothing was recorded"));
}

TEST_F(SchedulerRobustnessTest, WorkersKeepWorkingAcrossASchedulerRestart) {
  const WorkerCredentials w = RegisterWorker("w");
  StartTask();
  std::vector<LeasedJob> jobs = Lease(w);
  ASSERT_GE(jobs.size(), 2u);
  Open();  // the same database, a new scheduler
  std::vector<std::string> leases;
  for (const LeasedJob& j : jobs) leases.push_back(j.job.lease_id);
  auto hb = scheduler_->Heartbeat(w, leases);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_TRUE(*hb);  // known: no need to register again
  const int64_t before = Measurements();
  for (const LeasedJob& j : jobs) {
    auto r = scheduler_->Report(Report(w.worker_id, w.secret, j, 1e-3));
    EXPECT_TRUE(r.ok()) << r.status();
  }
  EXPECT_EQ(Measurements(), before + static_cast<int64_t>(jobs.size()));
  // A worker that registers again gets a new registration that works too.
  const WorkerCredentials again = RegisterWorker("w");
  EXPECT_NE(again.worker_id, w.worker_id);
  Lease(again);
}

TEST_F(SchedulerRobustnessTest, AResumedTaskRanksWithTheWAndPItStartedWith) {
  hw::TargetDesc t = CpuTarget();
  t.bandwidth_bytes_per_s = 20e9;
  t.peak_flops = 100e9;
  hw::TargetDesc other = t;  // compute now looks 100x cheaper against memory
  other.peak_flops = 10e12;
  other.bandwidth_bytes_per_s = 2e9;
  const std::vector<std::string> straight = Proposed(t, nullptr);
  ASSERT_GE(straight.size(), 8u);
  Reset();
  EXPECT_EQ(Proposed(t, &other), straight);
}

TEST_F(SchedulerRobustnessTest, AFullDiskIsReportedAsSuchAndTheReportCanBeRetried) {
  const WorkerCredentials w = RegisterWorker("w");
  StartTask();
  std::vector<LeasedJob> jobs = Lease(w);
  ASSERT_FALSE(jobs.empty());
  const int64_t before = Measurements();
  const int64_t failures = db::StorageFailures(db::StorageFailure::kFull);
  ASSERT_TRUE(scheduler_->db().SetMaxBytes(1).ok());  // no room to grow, as on a full disk
  // Enough samples that the row needs new pages.
  JobReport report = Report(w.worker_id, w.secret, jobs[0], 1e-3);
  report.measurement.samples_s.resize(20000, 1e-3);
  auto refused = scheduler_->Report(report);
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("is out of space"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("nothing was recorded"));
  EXPECT_THAT(std::string(refused.status().message()), ::testing::Not(HasSubstr("INSERT")));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr((dir_ / "tuning.db").string()));  // not "(in memory)"
  EXPECT_GT(db::StorageFailures(db::StorageFailure::kFull), failures);
  EXPECT_EQ(Measurements(), before);
  EXPECT_EQ(scheduler_->db().GetJob(jobs[0].job.id)->state, db::JobState::kLeased);

  // Space again: the same report (as the worker retries it) is recorded.
  ASSERT_TRUE(scheduler_->db().SetMaxBytes(int64_t{1} << 30).ok());
  auto accepted = scheduler_->Report(report);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ(Measurements(), before + 1);
}

TEST_F(SchedulerRobustnessTest, CacheAnswersAreKeptUntilABetterRecordLands) {
  const WorkerCredentials w = RegisterWorker("w");
  auto miss = CachedAnswer();
  ASSERT_TRUE(miss.ok()) << miss.status();
  EXPECT_TRUE(absl::IsNotFound((*miss)->result.status()));

  Finish(StartTask(), w, 2e-3);
  auto first = CachedAnswer();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->result.ok()) << (*first)->result.status();
  EXPECT_DOUBLE_EQ((*first)->result->measured.median_s, 2e-3);
  const auto& compiled = scheduler_->CompileAnswer(**first);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  EXPECT_FALSE(compiled->kernel.source.empty());
  // The same request again: the same answer, not parsed or rendered again.
  EXPECT_EQ(CachedAnswer()->get(), first->get());
  EXPECT_EQ(&scheduler_->CompileAnswer(**first), &compiled);

  Finish(StartTask(/*force=*/true), w, 1e-3);  // a better record
  auto second = CachedAnswer();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->get(), first->get());
  ASSERT_TRUE((*second)->result.ok());
  EXPECT_DOUBLE_EQ((*second)->result->measured.median_s, 1e-3);
}

TEST_F(SchedulerRobustnessTest, CompileAnswersInTheLanguageOfTheTargetsBackend) {
  const WorkerCredentials cpu = RegisterWorker("cpu");
  const std::optional<hw::TargetDesc> h100 = hw::LookupDevice("h100");
  ASSERT_TRUE(h100.has_value());
  const WorkerCredentials gpu = RegisterWorker("gpu", *h100);
  const TargetSelector cuda{std::nullopt, hw::TargetFingerprint(*h100)};
  const TargetSelector host{std::nullopt, hw::TargetFingerprint(CpuTarget())};
  Finish(StartTask(false, host), cpu, 2e-3);
  Finish(StartTask(false, cuda), gpu, 1e-4);

  auto on_cpu = CachedAnswer(host);
  ASSERT_TRUE(on_cpu.ok() && (*on_cpu)->result.ok());
  const auto& cpu_compiled = scheduler_->CompileAnswer(**on_cpu);
  ASSERT_TRUE(cpu_compiled.ok()) << cpu_compiled.status();
  const v1::CompileResponse cpu_answer = CompileResponseProto(*cpu_compiled);  // as the client gets it
  EXPECT_EQ(cpu_answer.language(), "c++");
  EXPECT_EQ(cpu_answer.entry_point(), "fusor_run");
  EXPECT_THAT(cpu_answer.kernel_source(), HasSubstr("extern \"C\" int fusor_run"));
  EXPECT_TRUE(cpu_answer.binary().empty());

  auto on_gpu = CachedAnswer(cuda);
  ASSERT_TRUE(on_gpu.ok() && (*on_gpu)->result.ok());
  const auto& gpu_compiled = scheduler_->CompileAnswer(**on_gpu);
  ASSERT_TRUE(gpu_compiled.ok()) << gpu_compiled.status();
  const v1::CompileResponse gpu_answer = CompileResponseProto(*gpu_compiled);
  EXPECT_EQ(gpu_answer.language(), "cuda");
  EXPECT_EQ(gpu_answer.entry_point(), "fusor_fused");
  EXPECT_THAT(gpu_answer.kernel_source(), HasSubstr("__global__"));
  EXPECT_THAT(gpu_answer.kernel_source(), HasSubstr("mma.sync"));  // the device header, inlined
  EXPECT_THAT(gpu_answer.kernel_source(), ::testing::Not(HasSubstr("#include \"fusor_device.h\"")));
  const nlohmann::json meta = nlohmann::json::parse(gpu_answer.metadata_json());
  EXPECT_GE(meta.at("launch").at("grid").at(0).get<int64_t>(), 1);
  EXPECT_EQ(meta.at("launch").at("block").at(0).get<int>(), meta.at("threads").get<int>());
  if (codegen::Nvrtc::Get() != nullptr) {
    EXPECT_EQ(gpu_answer.binary_format(), "cubin");
    EXPECT_EQ(gpu_answer.binary().substr(0, 4), "\x7f" "ELF");
    EXPECT_EQ(meta.at("binary").at("arch").get<std::string>(), h100->arch);
  } else {
    EXPECT_TRUE(gpu_answer.binary().empty());
    EXPECT_THAT(meta.at("binary").at("missing").get<std::string>(), HasSubstr("NVRTC"));
  }
}

TEST(SchedulerStartTest, AnUnusableDatabaseDirectoryIsNamedAsSuch) {
  SchedulerOptions o;
  o.db_path = "/dev/null/tuning.db";  // its directory is not a directory
  auto s = Scheduler::Create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("cannot be created or locked"));
  EXPECT_THAT(std::string(s.status().message()), ::testing::Not(HasSubstr("in use by another")));
  if (geteuid() != 0) {  // root writes anywhere
    const auto dir = std::filesystem::temp_directory_path() / ("fusor-readonly-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    std::filesystem::permissions(dir, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    o.db_path = (dir / "tuning.db").string();
    s = Scheduler::Create(o);
    EXPECT_TRUE(absl::IsPermissionDenied(s.status())) << s.status();
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("directory this user can write"));
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all);
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace fusor::server
