#include "server/db/tuning_db.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/util/timing.h"

namespace fusor::db {
namespace {

class TuningDbTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto db = TuningDb::Open(":memory:");
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = std::move(*db);
    ASSERT_TRUE(db_->UpsertWorkload({"wk", "chain", "canon", "{}"}, 1).ok());
    ASSERT_TRUE(db_->UpsertTarget({"fp", "cpu", "{}", 1}, 1).ok());
    ASSERT_TRUE(db_->InsertWorker({"w1", "one", "fp", WorkerState::kAlive, 1, 1, 0}).ok());
    ASSERT_TRUE(db_->InsertWorker({"w2", "two", "fp", WorkerState::kAlive, 1, 1, 0}).ok());
    TaskRow t;
    t.id = "t1";
    t.workload_key = "wk";
    t.target_fp = "fp";
    t.salt = "s";
    t.state = TaskState::kRunning;
    t.budget = 4;
    t.batch_size = 2;
    t.created_ms = 1;
    ASSERT_TRUE(db_->InsertTask(t).ok());
  }

  JobRow AddCandidate(const std::string& schedule, const std::string& job_id) {
    CandidateRow c;
    c.task_id = "t1";
    c.schedule = schedule;
    c.mapping = "m";
    auto r = db_->FindOrInsertCandidate(c, job_id, 10);
    EXPECT_TRUE(r.ok()) << r.status();
    return r->second;
  }

  MeasurementRow Ok(const std::string& job, const std::string& worker) {
    MeasurementRow m;
    m.job_id = job;
    m.worker_id = worker;
    m.workload_key = "wk";
    m.status = MeasurementStatus::kOk;
    m.median_s = 0.5;
    m.samples_s = {0.4, 0.5, 0.6};
    m.measured_ms = 20;
    return m;
  }

  int lease_counter_ = 0;
  std::function<std::string()> lease_ids_ = [this] { return "l" + std::to_string(++lease_counter_); };
  std::unique_ptr<TuningDb> db_;
};

TEST_F(TuningDbTest, CandidatesAreFoundNotDuplicated) {
  JobRow a = AddCandidate("block[m=8]", "j1");
  JobRow again = AddCandidate("block[m=8]", "j-other");
  EXPECT_EQ(a.id, "j1");
  EXPECT_EQ(again.id, "j1");
  EXPECT_EQ(db_->JobsOfTask("t1")->size(), 1u);
}

TEST_F(TuningDbTest, ExpiredLeaseRequeuesTheJobForAnotherWorker) {
  AddCandidate("block[m=8]", "j1");
  auto leased = db_->LeaseJobs("w1", "fp", 4, /*now_ms=*/0, /*expires_ms=*/100, lease_ids_);
  ASSERT_EQ(leased->size(), 1u);
  EXPECT_EQ(db_->LeaseJobs("w2", "fp", 4, /*now_ms=*/0, 100, lease_ids_)->size(), 0u);  // nothing left

  EXPECT_TRUE(db_->ExpireLeases(/*now_ms=*/50, 3)->empty());  // not yet
  auto touched = db_->ExpireLeases(/*now_ms=*/150, 3);
  ASSERT_EQ(touched->size(), 1u);
  EXPECT_EQ((*touched)[0], "t1");
  EXPECT_EQ(db_->GetJob("j1")->state, JobState::kQueued);

  auto second = db_->LeaseJobs("w2", "fp", 4, /*now_ms=*/0, 300, lease_ids_);
  ASSERT_EQ(second->size(), 1u);
  EXPECT_EQ((*second)[0].attempts, 2);

  // The silent first worker comes back: its report is refused, nothing written.
  auto late = db_->RecordMeasurement((*leased)[0].lease_id, Ok("j1", "w1"));
  EXPECT_EQ(late->outcome, ReportOutcome::kStaleLease);
  EXPECT_EQ(*db_->CountMeasurements(), 0);

  auto done = db_->RecordMeasurement((*second)[0].lease_id, Ok("j1", "w2"));
  EXPECT_EQ(done->outcome, ReportOutcome::kRecorded);
  // Reported twice: recorded once.
  auto dup = db_->RecordMeasurement((*second)[0].lease_id, Ok("j1", "w2"));
  EXPECT_EQ(dup->outcome, ReportOutcome::kDuplicate);
  EXPECT_EQ(*db_->CountMeasurements(), 1);
  auto rows = db_->MeasurementsOfTask("t1");
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].samples_s, (std::vector<double>{0.4, 0.5, 0.6}));
  EXPECT_EQ(db_->GetJob("j1")->state, JobState::kDone);
}

TEST_F(TuningDbTest, HeartbeatExtendsOnlyTheLeasesTheWorkerHolds) {
  AddCandidate("block[m=8]", "j1");
  AddCandidate("block[m=16]", "j2");
  auto leased = db_->LeaseJobs("w1", "fp", 2, /*now_ms=*/0, 100, lease_ids_);
  ASSERT_EQ(leased->size(), 2u);
  // The worker received j1's lease; j2's response was lost on the way.
  const JobRow& held = (*leased)[0].id == "j1" ? (*leased)[0] : (*leased)[1];
  ASSERT_TRUE(db_->ExtendLeases("w1", {held.lease_id}, 1000).ok());
  ASSERT_TRUE(db_->ExtendLeases("w2", {held.lease_id}, 5000).ok());  // not w2's lease: no effect
  EXPECT_EQ(*db_->ExpireLeases(500, 3), std::vector<std::string>{"t1"});
  EXPECT_EQ(db_->GetJob("j1")->state, JobState::kLeased);
  EXPECT_EQ(db_->GetJob("j1")->lease_expires_ms, 1000);
  EXPECT_EQ(db_->GetJob("j2")->state, JobState::kQueued);
}

TEST_F(TuningDbTest, JobFailsAfterMaxAttempts) {
  AddCandidate("block[m=8]", "j1");
  for (int attempt = 1; attempt <= 2; ++attempt) {
    ASSERT_EQ(db_->LeaseJobs("w1", "fp", 1, /*now_ms=*/0, attempt * 100, lease_ids_)->size(), 1u);
    ASSERT_EQ(db_->ExpireLeases(attempt * 100 + 1, 2)->size(), 1u);
  }
  JobRow job = *db_->GetJob("j1");
  EXPECT_EQ(job.state, JobState::kFailed);
  auto rows = db_->MeasurementsOfTask("t1");
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].status, MeasurementStatus::kCrash);
}

// Workers are shared between clients: alice queued four jobs before bob
// queued two, yet leases alternate between them while both have work.
TEST_F(TuningDbTest, LeasesShareWorkersFairlyBetweenClients) {
  TaskRow bob = *db_->GetTask("t1");
  bob.id = "t2";
  bob.client = "bob";
  bob.created_ms = 5;
  ASSERT_TRUE(db_->InsertTask(bob).ok());
  for (int i = 0; i < 4; ++i) AddCandidate("block[m=" + std::to_string(8 << i) + "]", "a" + std::to_string(i));
  for (int i = 0; i < 2; ++i) {
    CandidateRow c;
    c.task_id = "t2";
    c.schedule = "block[n=" + std::to_string(8 << i) + "]";
    ASSERT_TRUE(db_->FindOrInsertCandidate(c, "b" + std::to_string(i), 20).ok());
  }
  // One worker, one job at a time, each reported before the next lease.
  std::string order;
  for (int64_t now = 100; now < 110; ++now) {
    auto leased = db_->LeaseJobs("w1", "fp", 1, now, now + 1000, lease_ids_);
    ASSERT_TRUE(leased.ok());
    if (leased->empty()) break;
    order += (*leased)[0].id.substr(0, 1);
    ASSERT_TRUE(db_->RecordMeasurement((*leased)[0].lease_id, Ok((*leased)[0].id, "w1")).ok());
  }
  EXPECT_EQ(order, "ababaa");
}

// A workload row written without a family (by a fusor older than
// families, sharing the file) gains one from the next upsert; a family once
// set stays.
TEST_F(TuningDbTest, AnUpsertGivesAWorkloadWithoutFamilyItsFamily) {
  EXPECT_EQ(db_->GetWorkload("wk")->family_key, "");
  ASSERT_TRUE(db_->UpsertWorkload({"wk", "chain", "canon", "{}", "fam"}, 2).ok());
  EXPECT_EQ(db_->GetWorkload("wk")->family_key, "fam");
  ASSERT_TRUE(db_->UpsertWorkload({"wk", "chain", "canon", "{}", "other"}, 3).ok());
  EXPECT_EQ(db_->GetWorkload("wk")->family_key, "fam");
}

// A schedule carried over from another workload that failed here is
// remembered, for that source only, once its task has failed.
TEST_F(TuningDbTest, AFailedTransferIsRememberedPerSource) {
  TaskRow carried = *db_->GetTask("t1");
  carried.id = "t2";
  carried.transferred_from = "wk-small";
  ASSERT_TRUE(db_->InsertTask(carried).ok());
  EXPECT_FALSE(*db_->TransferFailed("wk", "fp", "s", "wk-small"));  // still running
  ASSERT_TRUE(db_->FinishTask("t2", TaskState::kFailed, "unconfirmed", 9).ok());
  EXPECT_TRUE(*db_->TransferFailed("wk", "fp", "s", "wk-small"));
  EXPECT_FALSE(*db_->TransferFailed("wk", "fp", "s", "wk-large"));
  EXPECT_FALSE(*db_->TransferFailed("wk", "fp", "other-salt", "wk-small"));
  EXPECT_FALSE(*db_->TransferFailed("wk", "fp2", "s", "wk-small"));
}

TEST_F(TuningDbTest, OneLeaseOfManyJobsAlternatesClients) {
  TaskRow bob = *db_->GetTask("t1");
  bob.id = "t2";
  bob.client = "bob";
  ASSERT_TRUE(db_->InsertTask(bob).ok());
  for (int i = 0; i < 3; ++i) AddCandidate("block[m=" + std::to_string(8 << i) + "]", "a" + std::to_string(i));
  CandidateRow c;
  c.task_id = "t2";
  c.schedule = "block[n=8]";
  ASSERT_TRUE(db_->FindOrInsertCandidate(c, "b0", 20).ok());
  auto leased = db_->LeaseJobs("w1", "fp", 3, 100, 1000, lease_ids_);
  ASSERT_EQ(leased->size(), 3u);
  EXPECT_EQ((*leased)[0].id, "a0");
  EXPECT_EQ((*leased)[1].id, "b0");
  EXPECT_EQ((*leased)[2].id, "a1");
}

TEST_F(TuningDbTest, LeasesOnlyJobsOfTheWorkersTarget) {
  AddCandidate("block[m=8]", "j1");
  EXPECT_TRUE(db_->LeaseJobs("w1", "other-fp", 4, /*now_ms=*/0, 100, lease_ids_)->empty());
}

TEST_F(TuningDbTest, BestKeepsTheFastest) {
  JobRow j = AddCandidate("block[m=8]", "j1");
  auto leased = db_->LeaseJobs("w1", "fp", 1, /*now_ms=*/0, 100, lease_ids_);
  auto rec = db_->RecordMeasurement((*leased)[0].lease_id, Ok("j1", "w1"));
  ASSERT_TRUE(db_->OfferBest("wk", "fp", "s", {"t1", *j.candidate_id, rec->measurement_id, 0.5}, 30).ok());
  ASSERT_TRUE(db_->OfferBest("wk", "fp", "s", {"t1", *j.candidate_id, rec->measurement_id, 0.9}, 31).ok());
  EXPECT_DOUBLE_EQ((*db_->GetBest("wk", "fp", "s"))->median_s, 0.5);
  ASSERT_TRUE(db_->OfferBest("wk", "fp", "s", {"t1", *j.candidate_id, rec->measurement_id, 0.25}, 32).ok());
  EXPECT_DOUBLE_EQ((*db_->GetBest("wk", "fp", "s"))->median_s, 0.25);
  EXPECT_FALSE(db_->GetBest("wk", "fp", "other-salt")->has_value());
}

TEST_F(TuningDbTest, SilentWorkersAreMarkedLostAndRevivedByContact) {
  ASSERT_TRUE(db_->TouchWorker("w1", 100).ok());
  EXPECT_EQ(*db_->MarkLostWorkers(50), 1);  // w2 last seen at 1
  EXPECT_EQ(db_->GetWorker("w2")->state, WorkerState::kLost);
  ASSERT_TRUE(db_->TouchWorker("w2", 200).ok());
  EXPECT_EQ(db_->GetWorker("w2")->state, WorkerState::kAlive);
  EXPECT_TRUE(absl::IsNotFound(db_->TouchWorker("nobody", 1)));
}

// A sweep keeps one chain per distinct key, in the entries' order, and
// is found again by its digest only while it runs.
TEST_F(TuningDbTest, SweepsKeepDistinctChainsAndAreFoundWhileRunning) {
  ASSERT_TRUE(db_->UpsertWorkload({"wk2", "other", "canon2", "{}"}, 1).ok());
  SweepRow sweep;
  sweep.id = "s1";
  sweep.name = "zoo";
  sweep.digest = "d";
  sweep.target_fp = "fp";
  sweep.salt = "s";
  sweep.budget = 4;
  sweep.state = SweepState::kRunning;
  sweep.created_ms = 5;
  const std::vector<SweepEntryRow> entries = {{0, "a", "ffn", "layers 1-2", 2, "wk2", "{}"},
                                              {1, "a", "attention", "layers 1-2", 2, "wk", "{}"},
                                              {2, "b", "ffn", "layer 1", 1, "wk2", "{}"}};
  ASSERT_TRUE(db_->CreateSweep(sweep, entries, 5).ok());
  EXPECT_EQ(db_->SweepEntries("s1")->size(), 3u);
  auto chains = db_->SweepChains("s1");
  ASSERT_TRUE(chains.ok()) << chains.status();
  ASSERT_EQ(chains->size(), 2u);
  EXPECT_EQ((*chains)[0].workload_key, "wk2");
  EXPECT_EQ((*chains)[1].workload_key, "wk");
  EXPECT_EQ((*chains)[1].ord, 1);
  EXPECT_EQ((*chains)[0].state, SweepChainState::kPending);

  SweepChainRow c = (*chains)[1];
  c.state = SweepChainState::kTuning;
  c.task_id = "t1";
  ASSERT_TRUE(db_->UpdateSweepChain("s1", c, 6).ok());
  EXPECT_EQ((*db_->SweepChains("s1"))[1].task_id, "t1");
  auto first = db_->FirstSweepEntry("s1", "wk2");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->idx, 0);
  EXPECT_EQ(first->model, "a");
  EXPECT_TRUE(absl::IsNotFound(db_->FirstSweepEntry("s1", "none").status()));
  EXPECT_EQ(db_->SweepTunedSeconds("s1")->first, 0);
  ASSERT_TRUE(db_->FinishTask("t1", TaskState::kDone, "", 2001).ok());  // created at 1
  c.state = SweepChainState::kDone;
  ASSERT_TRUE(db_->UpdateSweepChain("s1", c, 7).ok());
  EXPECT_EQ(*db_->SweepTunedSeconds("s1"), std::make_pair(1, 2.0));
  c.workload_key = "nope";
  EXPECT_TRUE(absl::IsNotFound(db_->UpdateSweepChain("s1", c, 6)));

  ASSERT_TRUE(db_->FindRunningSweep("d")->has_value());
  EXPECT_EQ(db_->ListSweepsInState(SweepState::kRunning)->size(), 1u);
  ASSERT_TRUE(db_->FinishSweep("s1", 9).ok());
  EXPECT_FALSE(db_->FindRunningSweep("d")->has_value());
  EXPECT_EQ(db_->GetSweep("s1")->state, SweepState::kDone);
  EXPECT_EQ(*db_->GetSweep("s1")->finished_ms, 9);
  EXPECT_TRUE(absl::IsNotFound(db_->GetSweep("s2").status()));
  // An entry of an unknown workload is refused and nothing is kept.
  sweep.id = "s3";
  EXPECT_FALSE(db_->CreateSweep(sweep, {{0, "c", "ffn", "", 1, "missing", "{}"}}, 10).ok());
  EXPECT_TRUE(absl::IsNotFound(db_->GetSweep("s3").status()));
}

// A task `task` of workload "wk" on target "fp" (salt "s") whose one
// candidate (job `job`) measured `median_s` and, run again at the task's
// end, `confirmed_s` (default: the same); finished as the scheduler
// finishes it: done with the confirmation as its best where the two agree,
// else failed ("unconfirmed"), nothing cached.
void FinishedTask(TuningDb& db, const std::string& task, const std::string& job, double median_s,
                  std::optional<double> confirmed_s = std::nullopt) {
  const double again = confirmed_s.value_or(median_s);
  ASSERT_TRUE(db.UpsertWorkload({"wk", "chain", "canon", "{}"}, 1).ok());
  ASSERT_TRUE(db.UpsertTarget({"fp", "cpu", "{}", 1}, 1).ok());
  TaskRow t;
  t.id = task;
  t.workload_key = "wk";
  t.target_fp = "fp";
  t.salt = "s";
  t.state = TaskState::kRunning;
  t.created_ms = 1;
  ASSERT_TRUE(db.InsertTask(t).ok());
  CandidateRow c;
  c.task_id = task;
  c.schedule = "block[m=" + job + "]";
  auto cand = db.FindOrInsertCandidate(c, job, 2);
  ASSERT_TRUE(cand.ok());
  auto measure = [&](const std::string& job_id, double seconds) -> int64_t {
    auto leased = db.LeaseJobs("w", "fp", 1, /*now_ms=*/0, 100, [&] { return "lease-" + job_id; });
    EXPECT_EQ(leased->size(), 1u);
    MeasurementRow m;
    m.job_id = job_id;
    m.worker_id = "w";
    m.workload_key = "wk";
    m.status = MeasurementStatus::kOk;
    m.median_s = seconds;
    m.samples_s = {seconds};
    auto rec = db.RecordMeasurement("lease-" + job_id, m);
    EXPECT_TRUE(rec.ok()) << rec.status();
    return rec.ok() ? rec->measurement_id : 0;
  };
  measure(job, median_s);
  JobRow confirm;
  confirm.id = job + "-again";
  confirm.task_id = task;
  confirm.kind = JobKind::kConfirm;
  confirm.candidate_id = cand->first.id;
  confirm.target_fp = "fp";
  ASSERT_TRUE(db.InsertJob(confirm, 3).ok());
  const int64_t confirmation = measure(confirm.id, again);
  const bool agrees = std::abs(again - median_s) <= kMaxSpread * std::max(again, median_s);
  if (agrees) ASSERT_TRUE(db.OfferBest("wk", "fp", "s", {task, cand->first.id, confirmation, again}, 3).ok());
  ASSERT_TRUE(db.FinishTask(task, agrees ? TaskState::kDone : TaskState::kFailed, "", 4).ok());
}

std::vector<std::string> Exported(TuningDb& db, const std::string& origin = "host:/source.db") {
  std::vector<std::string> lines;
  EXPECT_TRUE(db.ExportRecords({"", "", origin}, [&](const std::string& l) { lines.push_back(l); }).ok());
  return lines;
}

// Merging two databases (each imports the other's records): every
// measurement once, the faster confirmed answer in both; an import again
// adds nothing; a malformed line refuses the whole file.
TEST(RecordsTest, MergingKeepsEveryMeasurementOnceAndTheBest) {
  auto a = TuningDb::Open(":memory:");
  auto b = TuningDb::Open(":memory:");
  ASSERT_TRUE(a.ok() && b.ok());
  FinishedTask(**a, "ta", "ja", 0.5);
  FinishedTask(**b, "tb", "jb", 0.25);
  const std::vector<std::string> from_a = Exported(**a, "a-host:/a.db"), from_b = Exported(**b, "b-host:/b.db");
  ASSERT_EQ(from_a.size(), 2u);  // the candidate's measurement and its confirmation
  std::vector<std::string> none;
  ASSERT_TRUE((*a)->ExportRecords({"other-target", ""}, [&](const std::string& l) { none.push_back(l); }).ok());
  EXPECT_TRUE(none.empty());

  auto into_a = (*a)->ImportRecords(from_b, 10, kMaxSpread);
  ASSERT_TRUE(into_a.ok()) << into_a.status();
  EXPECT_EQ(into_a->added, 2);
  EXPECT_EQ(into_a->best_updated, 1);
  auto into_b = (*b)->ImportRecords(from_a, 10, kMaxSpread);
  ASSERT_TRUE(into_b.ok()) << into_b.status();
  EXPECT_EQ(into_b->best_updated, 0);  // b's own kernel is the faster
  for (TuningDb* db : {a->get(), b->get()}) {
    EXPECT_EQ(*db->CountMeasurements(), 4);
    auto best = db->GetBest("wk", "fp", "s");
    ASSERT_TRUE(best->has_value());
    EXPECT_DOUBLE_EQ((*best)->median_s, 0.25);
    EXPECT_EQ((*best)->task_id, "tb");
    EXPECT_EQ(db->GetTask("ta")->state, TaskState::kDone);
  }
  // Each imported task says where it was measured; a database's own tasks say nothing.
  EXPECT_EQ((*a)->GetTask("tb")->origin, "b-host:/b.db");
  EXPECT_EQ((*a)->GetTask("ta")->origin, "");
  auto again = (*a)->ImportRecords(from_b, 11, kMaxSpread);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->added, 0);
  EXPECT_EQ(again->duplicates, 2);
  EXPECT_EQ(*(*a)->CountMeasurements(), 4);

  auto fresh = TuningDb::Open(":memory:");
  auto bad = (*fresh)->ImportRecords({from_a[0], "{\"job_id\": 3}"}, 12, kMaxSpread);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("line 2: "));
  // A target description that is not a target's JSON (wire::TargetFromJson).
  std::string unreadable = from_a[0];
  const std::string description = R"("description_json":"{}")";
  ASSERT_NE(unreadable.find(description), std::string::npos) << unreadable;
  unreadable.replace(unreadable.find(description), description.size(), R"("description_json":"[1]")");
  bad = (*fresh)->ImportRecords({unreadable}, 12, kMaxSpread);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("line 1: 'target': "));
  EXPECT_EQ(*(*fresh)->CountMeasurements(), 0);
}

// An export is read in pages, the lock released between them: every record
// comes once, in order, across page boundaries (500 rows a page), and the
// callback may use the database (it would deadlock under the lock).
TEST(RecordsTest, ExportPagesThroughEveryRecordOnce) {
  auto db = TuningDb::Open(":memory:");
  ASSERT_TRUE(db.ok());
  constexpr int kTasks = 501;  // two records each: 1002, three pages
  for (int i = 0; i < kTasks; ++i) {
    FinishedTask(**db, "t" + std::to_string(i), "j" + std::to_string(100000 + i), 0.5 + i);
  }
  std::vector<std::string> jobs;
  ASSERT_TRUE((*db)->ExportRecords({}, [&](const std::string& l) {
                     jobs.push_back(nlohmann::json::parse(l)["job_id"]);
                     EXPECT_EQ(*(*db)->CountMeasurements(), 2 * kTasks);
                   })
                  .ok());
  ASSERT_EQ(jobs.size(), static_cast<size_t>(2 * kTasks));
  for (int i = 0; i < kTasks; ++i) {
    EXPECT_EQ(jobs[2 * i], "j" + std::to_string(100000 + i));
    EXPECT_EQ(jobs[2 * i + 1], "j" + std::to_string(100000 + i) + "-again");
  }
}

// An empty directory of its own under the system's temporary one.
std::filesystem::path FreshDir(const std::string& prefix) {
  const auto dir = std::filesystem::temp_directory_path() / (prefix + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The trust rule holds across databases: a task that ended unconfirmed
// (its candidate's 20 us never came again: 0.5 s the second time) brings its
// measurements, never an answer, whether imported into an empty database,
// merged into one with answers of its own, or restored from a backup.
TEST(RecordsTest, AnImportBringsMeasurementsNotAnswers) {
  const auto dir = FreshDir("fusor-trust");
  auto source = TuningDb::Open((dir / "source.db").string());
  ASSERT_TRUE(source.ok()) << source.status();
  FinishedTask(**source, "tu", "ju", 2e-5, 0.5);
  EXPECT_EQ((*source)->GetTask("tu")->state, TaskState::kFailed);
  EXPECT_FALSE((*(*source)->GetBest("wk", "fp", "s")).has_value());
  const std::vector<std::string> records = Exported(**source);
  ASSERT_EQ(records.size(), 2u);

  auto empty = TuningDb::Open(":memory:");
  auto imported = (*empty)->ImportRecords(records, 10, kMaxSpread);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->added, 2);
  EXPECT_EQ(imported->best_updated, 0);
  EXPECT_FALSE((*(*empty)->GetBest("wk", "fp", "s")).has_value());
  EXPECT_EQ((*empty)->GetTask("tu")->origin, "host:/source.db");

  auto team = TuningDb::Open(":memory:");
  FinishedTask(**team, "tc", "jc", 7.85e-3);
  auto merged = (*team)->ImportRecords(records, 10, kMaxSpread);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->best_updated, 0);
  EXPECT_DOUBLE_EQ((*(*team)->GetBest("wk", "fp", "s"))->median_s, 7.85e-3);

  // The same records as if their task had ended done (an older fusor's
  // export, or one edited): the import finds the best itself, by the
  // confirmation rule, and a fast time the confirmation contradicts is no
  // answer. A fast time confirmed is.
  std::vector<std::string> done = records;
  for (std::string& line : done) {
    auto j = nlohmann::json::parse(line);
    j["task"]["state"] = "done";
    line = j.dump();
  }
  auto careful = TuningDb::Open(":memory:");
  auto taken = (*careful)->ImportRecords(done, 10, kMaxSpread);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->best_updated, 0);
  EXPECT_FALSE((*(*careful)->GetBest("wk", "fp", "s")).has_value());
  auto confirmed = TuningDb::Open(":memory:");
  FinishedTask(**confirmed, "tf", "jf", 2e-5);
  auto faster = (*team)->ImportRecords(Exported(**confirmed), 10, kMaxSpread);
  ASSERT_TRUE(faster.ok()) << faster.status();
  EXPECT_EQ(faster->best_updated, 1);
  EXPECT_DOUBLE_EQ((*(*team)->GetBest("wk", "fp", "s"))->median_s, 2e-5);

  ASSERT_TRUE((*source)->BackupTo((dir / "restored.db").string()).ok());
  auto restored = TuningDb::Open((dir / "restored.db").string());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*(*restored)->CountMeasurements(), 2);
  EXPECT_FALSE((*(*restored)->GetBest("wk", "fp", "s")).has_value());
  std::filesystem::remove_all(dir);
}

// A backup taken while the database is open and written to is a complete,
// consistent copy; an unwritable path is an error.
TEST(RecordsTest, OnlineBackup) {
  const auto dir = FreshDir("fusor-backup");
  auto db = TuningDb::Open((dir / "live.db").string());
  ASSERT_TRUE(db.ok()) << db.status();
  FinishedTask(**db, "t1", "j1", 0.5);
  ASSERT_TRUE((*db)->BackupTo((dir / "copy.db").string()).ok());
  FinishedTask(**db, "t2", "j2", 0.25);  // the live one goes on
  auto copy = TuningDb::Open((dir / "copy.db").string());
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(*(*copy)->CountMeasurements(), 2);
  EXPECT_DOUBLE_EQ((*(*copy)->GetBest("wk", "fp", "s"))->median_s, 0.5);
  EXPECT_FALSE((*db)->BackupTo((dir / "missing-dir" / "x.db").string()).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fusor::db
