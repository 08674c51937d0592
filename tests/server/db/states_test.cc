#include "server/db/states.h"

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "proto/wire/convert.h"
#include "server/db/tuning_db.h"
#include "server/wire_rows.h"

namespace fusor::db {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Every value's Name, in the order of its k...s array, and Parse of it.
template <typename T, size_t N>
std::vector<std::string> NamesRoundTrip(const T (&all)[N]) {
  std::vector<std::string> names;
  for (T value : all) {
    names.emplace_back(Name(value));
    absl::StatusOr<T> back = Parse<T>(Name(value));
    EXPECT_TRUE(back.ok()) << back.status();
    if (back.ok()) {
      EXPECT_EQ(*back, value) << names.back();
    }
  }
  return names;
}

// The texts are the database's: these lists are what databases hold.
TEST(StatesTest, NamesAreTheDatabaseTextsAndParseBack) {
  using V = std::vector<std::string>;
  EXPECT_EQ(NamesRoundTrip(kTaskStates), (V{"running", "done", "failed"}));
  EXPECT_EQ(NamesRoundTrip(kJobStates), (V{"queued", "leased", "done", "failed"}));
  EXPECT_EQ(NamesRoundTrip(kWorkerStates), (V{"alive", "lost"}));
  EXPECT_EQ(NamesRoundTrip(kSweepStates), (V{"running", "done"}));
  EXPECT_EQ(NamesRoundTrip(kSweepChainStates), (V{"pending", "tuning", "done", "failed"}));
  EXPECT_EQ(NamesRoundTrip(kJobKinds), (V{"candidate", "baseline", "confirm"}));
  EXPECT_EQ(NamesRoundTrip(kMeasurementStatuses),
            (V{"ok", "compile_error", "invalid_result", "timeout", "crash", "runtime_error", "noisy"}));
}

template <typename T>
void ExpectRefused(absl::string_view text, const char* column) {
  absl::StatusOr<T> parsed = Parse<T>(text);
  ASSERT_FALSE(parsed.ok()) << text;
  EXPECT_TRUE(absl::IsDataLoss(parsed.status())) << parsed.status();
  EXPECT_THAT(std::string(parsed.status().message()),
              AllOf(HasSubstr(column), HasSubstr(absl::StrCat("'", text, "'"))));
}

TEST(StatesTest, ParseRefusesUnknownTextNamingColumnAndText) {
  ExpectRefused<TaskState>("paused", "tasks.state");
  ExpectRefused<JobState>("", "jobs.state");
  ExpectRefused<WorkerState>("Alive", "workers.state");
  ExpectRefused<SweepState>("failed", "sweeps.state");
  ExpectRefused<SweepChainState>("running", "sweep_chains.state");
  ExpectRefused<JobKind>("calibrate", "jobs.kind");
  ExpectRefused<MeasurementStatus>("unspecified", "measurements.status");
}

// A measurement status's text is its proto name as the wire layer writes
// it, and converts to the proto enum and back.
TEST(StatesTest, MeasurementStatusesMatchTheProto) {
  for (MeasurementStatus s : kMeasurementStatuses) {
    EXPECT_EQ(wire::MeasurementStatusName(server::ToProto(s)), Name(s));
    EXPECT_EQ(server::MeasurementStatusFromProto(server::ToProto(s)), s) << Name(s);
  }
  EXPECT_EQ(server::MeasurementStatusFromProto(v1::MEASUREMENT_STATUS_UNSPECIFIED), std::nullopt);
  EXPECT_EQ(server::MeasurementStatusFromProto(static_cast<v1::MeasurementStatus>(99)), std::nullopt);
  EXPECT_EQ(server::ToProto(JobKind::kCandidate), v1::JOB_KIND_CANDIDATE);
  EXPECT_EQ(server::ToProto(JobKind::kBaseline), v1::JOB_KIND_BASELINE);
  EXPECT_EQ(server::ToProto(JobKind::kConfirm), v1::JOB_KIND_CONFIRM);
}

// The worker protocol's edge: what a worker measured reads back as it was
// sent, a report without a status is refused, and a leased job carries its
// candidate and the measuring options.
TEST(StatesTest, ReportsAndJobsCrossTheWireIntact) {
  MeasurementRow m;
  m.status = MeasurementStatus::kNoisy;
  m.error = "spread";
  m.samples_s = {1e-3, 2e-3, 4e-3};
  m.median_s = 2e-3;
  m.max_abs_error = 1e-6;
  m.max_rel_error = 2e-6;
  m.compile_s = 0.4;
  m.compile_flags = "-O3";
  m.compiler = "g++ 12";
  m.code_bytes = 4096;
  m.resources_json = R"({"regs":64})";
  v1::ReportRequest request;
  request.set_worker_id("w-1");
  request.set_worker_secret("s");
  request.set_job_id("j-1");
  request.set_lease_id("l-1");
  *request.mutable_measurement() = server::MeasurementProto(m);
  absl::StatusOr<server::JobReport> report = server::JobReportFromProto(request);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->worker.worker_id, "w-1");
  EXPECT_EQ(report->worker.secret, "s");
  EXPECT_EQ(report->lease_id, "l-1");
  const MeasurementRow& back = report->measurement;
  EXPECT_EQ(back.status, m.status);
  EXPECT_EQ(back.error, m.error);
  EXPECT_EQ(back.samples_s, m.samples_s);
  EXPECT_EQ(back.median_s, m.median_s);
  EXPECT_EQ(back.max_rel_error, m.max_rel_error);
  EXPECT_EQ(back.compile_flags, m.compile_flags);
  EXPECT_EQ(back.compiler, m.compiler);
  EXPECT_EQ(back.code_bytes, m.code_bytes);
  EXPECT_EQ(back.resources_json, m.resources_json);
  request.mutable_measurement()->set_status(v1::MEASUREMENT_STATUS_UNSPECIFIED);
  EXPECT_TRUE(absl::IsInvalidArgument(server::JobReportFromProto(request).status()));

  server::LeasedJob leased;
  leased.job.id = "j-2";
  leased.job.lease_id = "l-2";
  leased.job.kind = JobKind::kConfirm;
  leased.chain.name = "c";
  leased.candidate = CandidateRow{};
  leased.candidate->id = 7;
  leased.candidate->schedule = "m=8 / - / -";
  server::MeasureOptions measure;
  measure.max_spread = 0.25;
  const v1::Job job = server::JobProto(leased, measure);
  EXPECT_EQ(job.job_id(), "j-2");
  EXPECT_EQ(job.lease_id(), "l-2");
  EXPECT_EQ(job.kind(), v1::JOB_KIND_CONFIRM);
  EXPECT_EQ(job.chain().name(), "c");
  EXPECT_EQ(job.candidate().id(), 7);
  EXPECT_EQ(job.candidate().schedule().text(), "m=8 / - / -");
  EXPECT_EQ(job.options().max_spread(), 0.25);
  leased.candidate.reset();
  EXPECT_FALSE(server::JobProto(leased, measure).has_candidate());
}

// A database file with a worker, a task whose candidate job was measured,
// and a sweep.
std::unique_ptr<TuningDb> Populated(const std::string& path) {
  auto opened = TuningDb::Open(path);
  EXPECT_TRUE(opened.ok()) << opened.status();
  if (!opened.ok()) return nullptr;
  TuningDb& db = **opened;
  EXPECT_TRUE(db.UpsertWorkload({"wk", "chain", "canon", "{}"}, 1).ok());
  EXPECT_TRUE(db.UpsertTarget({"fp", "cpu", "{}", 1}, 1).ok());
  WorkerRow w;
  w.id = "w1";
  w.target_fp = "fp";
  EXPECT_TRUE(db.InsertWorker(w).ok());
  TaskRow t;
  t.id = "t1";
  t.workload_key = "wk";
  t.target_fp = "fp";
  t.salt = "s";
  t.created_ms = 1;
  EXPECT_TRUE(db.InsertTask(t).ok());
  CandidateRow c;
  c.task_id = "t1";
  c.schedule = "block[m=1]";
  EXPECT_TRUE(db.FindOrInsertCandidate(c, "j1", 2).ok());
  EXPECT_EQ(db.LeaseJobs("w1", "fp", 1, 3, 100, [] { return std::string("l1"); })->size(), 1u);
  MeasurementRow m;
  m.job_id = "j1";
  m.worker_id = "w1";
  m.workload_key = "wk";
  m.median_s = 0.5;
  m.samples_s = {0.5};
  EXPECT_EQ(db.RecordMeasurement("l1", m)->outcome, ReportOutcome::kRecorded);
  SweepRow sweep;
  sweep.id = "s1";
  sweep.digest = "d";
  sweep.target_fp = "fp";
  EXPECT_TRUE(db.CreateSweep(sweep, {{0, "model", "ffn", "", 1, "wk", "{}"}}, 4).ok());
  return std::move(*opened);
}

// A row with text this fusor does not know (written by a newer fusor, or
// by hand) is an error naming the column and the text where it is read,
// not a crash; the metrics leave it out.
TEST(StatesTest, UnknownTextInARowIsAnError) {
  const auto dir = std::filesystem::temp_directory_path() / ("fusor-states-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  struct Case {
    const char* sql;
    const char* column;
    std::function<absl::Status(TuningDb&)> read;
  };
  const std::vector<Case> cases = {
      {"UPDATE workers SET state = 'retired'", "workers.state",
       [](TuningDb& db) { return db.GetWorker("w1").status(); }},
      {"UPDATE workers SET state = 'retired'", "workers.state", [](TuningDb& db) { return db.ListWorkers().status(); }},
      {"UPDATE tasks SET state = 'paused'", "tasks.state", [](TuningDb& db) { return db.GetTask("t1").status(); }},
      {"UPDATE jobs SET state = 'paused'", "jobs.state", [](TuningDb& db) { return db.JobsOfTask("t1").status(); }},
      {"UPDATE jobs SET kind = 'calibrate'", "jobs.kind", [](TuningDb& db) { return db.GetJob("j1").status(); }},
      {"UPDATE measurements SET status = 'flaky'", "measurements.status",
       [](TuningDb& db) { return db.MeasurementsOfTask("t1").status(); }},
      {"UPDATE measurements SET kind = 'calibrate'", "measurements.kind",
       [](TuningDb& db) { return db.GetMeasurement(1).status(); }},
      {"UPDATE sweeps SET state = 'paused'", "sweeps.state", [](TuningDb& db) { return db.GetSweep("s1").status(); }},
      {"UPDATE sweep_chains SET state = 'stalled'", "sweep_chains.state",
       [](TuningDb& db) { return db.SweepChains("s1").status(); }},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].sql);
    const std::string path = (dir / ("t" + std::to_string(i) + ".db")).string();
    std::unique_ptr<TuningDb> db = Populated(path);
    ASSERT_NE(db, nullptr);
    ASSERT_TRUE(cases[i].read(*db).ok());
    auto raw = Database::Open(path);
    ASSERT_TRUE(raw.ok()) << raw.status();
    ASSERT_TRUE((*raw)->Exec(cases[i].sql).ok());
    const absl::Status read = cases[i].read(*db);
    EXPECT_TRUE(absl::IsDataLoss(read)) << read;
    EXPECT_THAT(std::string(read.message()), HasSubstr(cases[i].column));
    const std::string text = cases[i].sql;
    EXPECT_THAT(std::string(read.message()), HasSubstr(text.substr(text.find('\''))));
    auto metrics = db->Metrics();
    EXPECT_TRUE(metrics.ok()) << metrics.status();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fusor::db
