// The scheduler's learned cost models: trained on its database's
// measurements once there are enough, adopted when they rank held-out
// workloads better, kept across restarts, and used by the tasks that
// start with them (and by those tasks when they resume). The scheduler is
// driven directly, as a worker would drive it, with times that follow a
// pattern the analytical model does not see.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "common/ir/parse.h"
#include "common/model/learned_model.h"
#include "common/space/split.h"
#include "server/db/sqlite.h"
#include "server/scheduler.h"
#include "tests/test_chains.h"

namespace fusor::server {
namespace {

constexpr char kAttention[] = R"(
chain attn
dim m=64 n=96 k=32 h=32
in Q[m,k] K[n,k] V[n,h]
S[m,n] = sum(k) Q[m,k] * K[n,k]
P[m,n] = softmax(n) S[m,n]
O[m,h] = sum(n) P[m,n] * V[n,h]
out O
)";

constexpr char kWideGemmChain[] = R"(
chain wide
dim m=96 n=128 k=64 h=48
in A[m,k] B[k,n] D[n,h]
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
out E
)";

class LearnedModelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("fusor-learned-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    target_.compute_units = 2;
    target_.isa_features = {"avx2", "fma"};
    target_.vector_lanes_f32 = 8;
    target_.bandwidth_bytes_per_s = 1e10;
    target_.peak_flops = 1e11;
  }
  void TearDown() override {
    scheduler_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Open(bool learn = true) {
    scheduler_.reset();
    SchedulerOptions o;
    o.db_path = (dir_ / "tuning.db").string();
    o.batch_size = 4;
    o.learn.enabled = learn;
    o.reaper_interval = absl::Hours(1);  // the test trains when it says
    auto s = Scheduler::Create(o);
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler_ = std::move(*s);
    auto r = scheduler_->Register("w", target_);
    ASSERT_TRUE(r.ok()) << r.status();
    worker_ = r->credentials;
    fp_ = r->target_fp;
  }

  // Starts a task for `text`; its id and the learned model it ranks with.
  std::pair<std::string, int64_t> Start(const char* text, int budget) {
    auto req = scheduler_->Prepare(*ir::ParseChainText(text), {});
    EXPECT_TRUE(req.ok()) << req.status();
    auto start = scheduler_->StartTune(*req, TuneOptions{budget, true}, {"test", "test"});
    EXPECT_TRUE(start.ok()) << start.status();
    const std::string id = start->started.task_id;
    return {id, scheduler_->db().GetTask(id)->cost_model_id};
  }

  // Measures every job of `task`: a candidate takes its analytical
  // prediction times e^(own loops), which the analytical model misses (a
  // split, twice its prediction).
  void Finish(const std::string& task) {
    for (int round = 0; round < 40; ++round) {
      auto jobs = scheduler_->Lease(worker_, 16, absl::ZeroDuration(), nullptr);
      ASSERT_TRUE(jobs.ok()) << jobs.status();
      for (const LeasedJob& job : *jobs) {
        double median_s = 1e-3;
        if (job.candidate && space::IsSplitText(job.candidate->schedule)) {
          median_s = 2 * job.candidate->t_estm_s;  // two kernels: no sample of one nest to learn from
        } else if (job.candidate) {
          auto s = model::MakeSample(job.chain, job.candidate->schedule, target_, 1, "");
          ASSERT_TRUE(s.ok()) << s.status();
          median_s = s->analytical_s * std::exp(s->features[17]);
        }
        JobReport report{worker_, job.job.id, job.job.lease_id, {}};
        report.measurement.status = db::MeasurementStatus::kOk;
        report.measurement.samples_s.assign(10, median_s);
        report.measurement.median_s = median_s;
        ASSERT_TRUE(scheduler_->Report(report).ok());
      }
      auto snap = scheduler_->WaitForTask(task, 0, absl::ZeroDuration());
      if (snap.ok() && snap->state != db::TaskState::kRunning) return;
    }
    FAIL() << "task " << task << " did not finish";
  }

  std::filesystem::path dir_;
  hw::TargetDesc target_;
  std::unique_ptr<Scheduler> scheduler_;
  WorkerCredentials worker_;
  std::string fp_;
};

TEST_F(LearnedModelsTest, LearnsFromTheDatabaseAndKeepsTheModelAcrossRestarts) {
  Open();
  // One workload is not enough data: tasks keep the analytical model.
  auto [first, first_model] = Start(testing::kGemmChain, 24);
  EXPECT_EQ(first_model, 0);
  Finish(first);
  scheduler_->TrainCostModels();
  EXPECT_EQ(scheduler_->cost_models().Current(fp_)->first, 0);
  for (const char* text : {testing::kConvChain, kAttention, kWideGemmChain}) {
    auto [task, model] = Start(text, 24);
    EXPECT_EQ(model, 0);
    Finish(task);
  }
  ASSERT_GE(*scheduler_->db().CountTrainingRows(fp_), 48);
  scheduler_->TrainCostModels();
  auto current = scheduler_->cost_models().Current(fp_);
  ASSERT_TRUE(current.ok()) << current.status();
  const int64_t id = current->first;
  ASSERT_GT(id, 0) << "the learned model was not adopted";
  auto row = scheduler_->db().GetCostModel(id);
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->workloads, 4);
  EXPECT_GT(row->spearman_learned, row->spearman_analytical + 0.3);
  // No new measurements: no new model.
  scheduler_->TrainCostModels();
  EXPECT_EQ(scheduler_->cost_models().Current(fp_)->first, id);

  // A new task ranks with it, and after a restart, new and resumed tasks
  // rank with the stored model without training again.
  auto [running, running_model] = Start(testing::kGemmChain, 8);
  EXPECT_EQ(running_model, id);
  Open();
  EXPECT_EQ(scheduler_->cost_models().Current(fp_)->first, id);
  auto [again, again_model] = Start(kAttention, 8);
  EXPECT_EQ(again_model, id);
  Finish(running);
  Finish(again);
  EXPECT_EQ(scheduler_->db().GetTask(running)->cost_model_id, id);

  // A stored model this build cannot read (trained on other features, say)
  // is not used: the scheduler trains a new one from the measurements, and
  // tasks tune with it.
  scheduler_.reset();
  {
    auto raw = db::Database::Open((dir_ / "tuning.db").string());
    ASSERT_TRUE(raw.ok()) << raw.status();
    ASSERT_TRUE((*raw)->Exec("UPDATE cost_models SET model_json = '{\"kind\": \"ridge\", \"features\": []}'").ok());
  }
  Open();
  const int64_t retrained = scheduler_->cost_models().Current(fp_)->first;
  EXPECT_GT(retrained, id);
  auto [after, after_model] = Start(testing::kGemmChain, 8);
  EXPECT_EQ(after_model, retrained);
  Finish(after);
}

TEST_F(LearnedModelsTest, CanBeTurnedOff) {
  Open(/*learn=*/false);
  for (const char* text : {testing::kGemmChain, testing::kConvChain, kAttention, kWideGemmChain}) {
    auto [task, model] = Start(text, 24);
    EXPECT_EQ(model, 0);
    Finish(task);
  }
  scheduler_->TrainCostModels();
  EXPECT_EQ(scheduler_->cost_models().Current(fp_)->first, 0);
  EXPECT_FALSE(scheduler_->db().LatestCostModel(fp_)->has_value());
}

}  // namespace
}  // namespace fusor::server
