// End to end with the real binaries on 127.0.0.1: a scheduler, two CPU
// workers and the CLI. One worker is killed (SIGKILL) while it holds a
// lease; the task still completes on the other with nothing lost or
// duplicated. A repeated request is a cache hit with no new measurement;
// a malformed and an oversized request get clear errors and change nothing.
// Fault injection: a worker stopped mid-lease, the scheduler killed mid-task,
// a worker whose candidates all crash, many concurrent clients. Sweeps over
// a small zoo are interrupted (client, then scheduler killed) and resumed,
// every distinct chain tuned exactly once.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fusor/v1/worker.grpc.pb.h"
#include "proto/wire/channel.h"
#include "server/db/sqlite.h"

extern char** environ;

namespace fusor {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

const std::string kBin = FUSOR_BINARY_DIR;

// A background process with its output in a log file.
class Daemon {
 public:
  Daemon(std::vector<std::string> argv, std::string log) : log_(std::move(log)) {
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    EXPECT_EQ(rc, 0) << "cannot start " << argv[0];
  }
  ~Daemon() {
    if (running()) {
      Signal(SIGKILL);
      Wait(std::chrono::seconds(10));
    }
  }
  void Signal(int sig) { kill(pid_, sig); }
  bool running() const { return pid_ > 0 && !exited_; }
  // Exit code, or -signal; nullopt if still running at the deadline.
  std::optional<int> Wait(Clock::duration timeout) {
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::nullopt;
  }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool exited_ = false;
};

// Waits (bounded) until `pred` holds.
bool WaitFor(const std::function<bool()>& pred, Clock::duration timeout) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

class E2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("fusor-e2e-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    db_path_ = (dir_ / "tuning.db").string();
    StartScheduler();
  }

  // A scheduler on the test's database, on `listen` (default: a free port);
  // without tokens unless `tokens`; `extra` flags appended.
  void StartScheduler(const std::string& listen = "127.0.0.1:0", bool tokens = false,
                      const std::vector<std::string>& extra = {}) {
    static int n = 0;
    std::vector<std::string> argv = {kBin + "/server/fusor-scheduler", "--listen", listen, "--db", db_path_,
                                     "--lease-seconds", "2", "--heartbeat-seconds", "0.3", "--worker-timeout-seconds",
                                     "3", "--batch-size", "2", "--time-budget", "0.05", "--job-timeout", "120",
                                     // Mechanics, on a machine the parallel tests keep busy: every
                                     // measurement counts (trusted_measurement_test checks the bound).
                                     "--max-spread", "1e9"};
    if (!tokens) argv.push_back("--insecure");
    argv.insert(argv.end(), extra.begin(), extra.end());
    scheduler_ = std::make_unique<Daemon>(argv, (dir_ / ("scheduler" + std::to_string(++n) + ".log")).string());
    std::smatch match;
    std::regex port_re("listening on port (\\d+)");
    ASSERT_TRUE(WaitFor(
        [&] {
          std::string log = scheduler_->Log();
          if (!std::regex_search(log, match, port_re)) return false;
          address_ = "127.0.0.1:" + match[1].str();
          return true;
        },
        std::chrono::seconds(30)))
        << scheduler_->Log();
  }

  void TearDown() override {
    for (auto* d : {worker_a_.get(), worker_b_.get(), scheduler_.get()}) {
      if (d && d->running()) d->Signal(SIGTERM);
    }
    for (auto* d : {worker_a_.get(), worker_b_.get(), scheduler_.get()}) {
      if (d && d->running()) {
        EXPECT_TRUE(d->Wait(std::chrono::seconds(20)).has_value());
      }
    }
    if (HasFailure()) {
      std::cerr << "--- scheduler log ---\n" << scheduler_->Log();
      if (worker_a_) std::cerr << "--- worker A log ---\n" << worker_a_->Log();
      if (worker_b_) std::cerr << "--- worker B log ---\n" << worker_b_->Log();
    }
    std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<Daemon> StartWorker(const std::string& name, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {kBin + "/worker/fusor-worker", "--scheduler", address_, "--name", name,
                                     "--calibration-seconds", "0.05"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Daemon>(argv, (dir_ / (name + ".log")).string());
  }

  void ClientAndWorkerOutliveARestart(int signal);

  // A new token of `role` on the test's database.
  std::string CreateToken(const std::string& role, const std::string& name) {
    auto [rc, out] = Cli({"--db", db_path_, "admin", "token", "create", "--role", role, "--name", name});
    EXPECT_EQ(rc, 0) << out;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(out, m, std::regex("fusor_[0-9a-f]{40}"))) << out;
    return m.empty() ? std::string() : m[0].str();
  }

  // Runs a command through /bin/sh (bounded); exit code and output.
  std::pair<int, std::string> Shell(const std::string& command) {
    static int n = 0;
    Daemon sh({"/bin/sh", "-c", command}, (dir_ / ("sh" + std::to_string(++n) + ".log")).string());
    std::optional<int> rc = sh.Wait(std::chrono::seconds(60));
    EXPECT_TRUE(rc.has_value()) << command;
    return {rc.value_or(-1), sh.Log()};
  }

  // The CLI in the background: against the scheduler, or (args starting
  // with --db) with an embedded one.
  std::unique_ptr<Daemon> StartCli(std::vector<std::string> args) {
    static int n = 0;
    std::vector<std::string> argv = {kBin + "/client/fusor"};
    if (args.empty() || args[0] != "--db") argv.insert(argv.end(), {"--server", address_});
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<Daemon>(argv, (dir_ / ("cli" + std::to_string(++n) + ".log")).string());
  }

  // Runs the CLI to completion (bounded); returns exit code and output.
  std::pair<int, std::string> Cli(std::vector<std::string> args, Clock::duration timeout = std::chrono::seconds(180)) {
    std::unique_ptr<Daemon> cli = StartCli(std::move(args));
    std::optional<int> rc = cli->Wait(timeout);
    EXPECT_TRUE(rc.has_value()) << "the CLI did not finish in time";
    return {rc.value_or(-1), cli->Log()};
  }

  // The first column of the first row, as text; nullopt when the query
  // fails (e.g. a table that does not exist yet) or returns nothing.
  std::optional<std::string> TryQuery(const std::string& sql) {
    auto db = db::Database::Open(db_path_);
    if (!db.ok()) return std::nullopt;
    auto stmt = (*db)->Prepare(sql);
    if (!stmt.ok()) return std::nullopt;
    auto row = stmt->Step();
    if (!row.ok() || !*row) return std::nullopt;
    return stmt->Text(0);
  }

  int64_t Query(const std::string& sql) {
    std::optional<std::string> v = TryQuery(sql);
    EXPECT_TRUE(v.has_value()) << sql;
    return v ? std::stoll(*v) : -1;
  }

  std::map<std::string, int64_t> TableCounts() {
    std::map<std::string, int64_t> counts;
    for (const char* t : {"workloads", "targets", "workers", "tasks", "candidates", "jobs", "measurements", "best",
                          "baselines"}) {
      counts[t] = Query(std::string("SELECT COUNT(*) FROM ") + t);
    }
    return counts;
  }

  std::string WriteFile(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  std::filesystem::path dir_;
  std::string db_path_, address_;
  std::unique_ptr<Daemon> scheduler_, worker_a_, worker_b_;
};

constexpr char kChain[] = R"(chain e2e_attention
dim b=4 m=96 n=96 k=32 h=32
in Q[b,m,k] K[b,n,k] V[b,n,h]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.17
P[b,m,n] = softmax(n) S[b,m,n]
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)";

TEST_F(E2eTest, SurvivesAKilledWorkerAndServesTheCache) {
  worker_a_ = StartWorker("A");
  worker_b_ = StartWorker("B");
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT COUNT(*) FROM workers WHERE state = 'alive'") == 2; },
                      std::chrono::seconds(60)))
      << worker_a_->Log() << worker_b_->Log();
  const std::string spec = WriteFile("attention.fusor", kChain);

  // Tune in the background; kill worker A the moment it holds a lease.
  std::pair<int, std::string> tuned;
  std::thread tuner([&] { tuned = Cli({"tune", spec, "--budget", "4"}); });
  const std::string a_holds =
      "SELECT COUNT(*) FROM jobs j JOIN workers w ON j.worker_id = w.id WHERE w.name = 'A' AND j.state = 'leased'";
  bool killed = WaitFor(
      [&] {
        if (Query(a_holds) == 0) return false;
        worker_a_->Signal(SIGKILL);
        return true;
      },
      std::chrono::seconds(120));
  tuner.join();
  ASSERT_TRUE(killed) << "worker A never held a lease";
  EXPECT_EQ(worker_a_->Wait(std::chrono::seconds(10)), std::optional<int>(-SIGKILL));
  ASSERT_EQ(tuned.first, 0) << tuned.second;
  EXPECT_THAT(tuned.second, HasSubstr("tuned now"));
  // A speedup, or the unfused chain as the answer where it measured faster.
  EXPECT_THAT(tuned.second, AnyOf(HasSubstr("speedup"), HasSubstr("unfused wins")));

  // Every job done once; the job A held was leased again and finished by B.
  EXPECT_EQ(Query("SELECT COUNT(*) FROM tasks WHERE state = 'done'"), 1);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements WHERE kind = 'candidate'"), 4);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements WHERE kind = 'baseline'"), 1);  // measured within the task
  EXPECT_EQ(Query("SELECT COUNT(*) FROM jobs WHERE state <> 'done'"), 0);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements"), Query("SELECT COUNT(DISTINCT job_id) FROM measurements"));
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements WHERE status <> 'ok'"), 0);
  EXPECT_GE(Query("SELECT COUNT(*) FROM jobs WHERE attempts >= 2"), 1);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements WHERE samples_json = '[]'"), 0);

  // The same request again: answered from the cache, nothing measured.
  auto before = TableCounts();
  auto again = Cli({"tune", spec});
  ASSERT_EQ(again.first, 0) << again.second;
  EXPECT_THAT(again.second, HasSubstr("from the cache"));
  EXPECT_EQ(TableCounts(), before);

  // A malformed spec: a clear, located error; the database is unchanged.
  auto bad = Cli({"tune", WriteFile("bad.fusor", "dim m=4\nin A[m]\nB[m] = A[m] *\nout B\n")});
  EXPECT_EQ(bad.first, 1);
  EXPECT_THAT(bad.second, HasSubstr("line 3, column 14"));
  EXPECT_THAT(bad.second, HasSubstr("INVALID_ARGUMENT"));
  // Oversized: past the workload limit, refused by the CLI before it reads
  // on (the scheduler's own refusals: IntegrationTest).
  std::string padded = kChain;
  padded += "#" + std::string(100 * 1024, 'x') + "\n";
  for (const std::string& name : {"big.fusor", "huge.fusor"}) {
    auto big = Cli({"tune", WriteFile(name, padded)});
    EXPECT_EQ(big.first, 1);
    EXPECT_THAT(big.second, HasSubstr("is larger than 65536 bytes (the limit)"));
    padded += "#" + std::string(2 * 1024 * 1024, 'y') + "\n";
  }
  // An index nested 9,000 deep (18 KB) once overflowed the scheduler's stack.
  const std::string deep = std::string(9000, '(') + "m" + std::string(9000, ')');
  auto nested = Cli({"compile", WriteFile("deep.fusor", "dim m=4\nin A[m]\nB[m] = A[" + deep + "]\nout B\n")});
  EXPECT_EQ(nested.first, 1);
  EXPECT_THAT(nested.second, HasSubstr("nests deeper than 64 levels"));
  EXPECT_EQ(Cli({"workers"}).first, 0);  // the scheduler is still there
  EXPECT_EQ(TableCounts(), before);

  // The CLI's other commands against the live scheduler.
  auto lookup = Cli({"lookup", spec});
  EXPECT_EQ(lookup.first, 0);
  EXPECT_THAT(lookup.second, HasSubstr("from the cache"));
  auto compiled = Cli({"compile", spec, "--cache-only", "-o", (dir_ / "out").string()});
  EXPECT_EQ(compiled.first, 0) << compiled.second;
  EXPECT_TRUE(std::filesystem::exists(dir_ / "out" / "attention.cc"));
  EXPECT_TRUE(std::filesystem::exists(dir_ / "out" / "attention.json"));
  auto workers = Cli({"workers"});
  EXPECT_THAT(workers.second, HasSubstr("B"));
  EXPECT_EQ(TableCounts(), before);
}

// Fault injection. A worker stopped (SIGSTOP) while it holds a lease
// loses the job to the other worker when the lease runs out; resumed, its
// late report changes nothing, and it serves again.
TEST_F(E2eTest, StoppedWorkerLosesItsLeaseAndItsLateReportIsRefused) {
  worker_a_ = StartWorker("A");
  worker_b_ = StartWorker("B");
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT COUNT(*) FROM workers WHERE state = 'alive'") == 2; },
                      std::chrono::seconds(60)));
  const std::string spec = WriteFile("attention.fusor", kChain);
  std::pair<int, std::string> tuned;
  std::thread tuner([&] { tuned = Cli({"tune", spec, "--budget", "4"}); });
  std::string held;
  const bool stopped = WaitFor(
      [&] {
        auto job = TryQuery("SELECT j.id FROM jobs j JOIN workers w ON j.worker_id = w.id WHERE w.name = 'A' AND "
                            "j.state = 'leased' LIMIT 1");
        if (!job) return false;
        worker_a_->Signal(SIGSTOP);
        held = *job;
        return true;
      },
      std::chrono::seconds(120));
  tuner.join();
  worker_a_->Signal(SIGCONT);
  ASSERT_TRUE(stopped) << "worker A never held a lease";
  ASSERT_EQ(tuned.first, 0) << tuned.second;
  // The job A held was leased again and measured by B, once.
  EXPECT_GE(Query("SELECT attempts FROM jobs WHERE id = '" + held + "'"), 2);
  EXPECT_EQ(TryQuery("SELECT w.name FROM measurements m JOIN workers w ON m.worker_id = w.id WHERE m.job_id = '" +
                     held + "'"),
            std::optional<std::string>("B"));
  const int64_t measurements = Query("SELECT COUNT(*) FROM measurements");
  // A's report comes too late: refused as a stale lease, or (B finished the
  // job first) ignored as a duplicate; either way nothing is recorded.
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string log = worker_a_->Log();
        return log.find("is no longer valid") != std::string::npos ||
               log.find("the scheduler already had this result") != std::string::npos;
      },
      std::chrono::seconds(120)))
      << worker_a_->Log();
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements"), measurements);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements"), Query("SELECT COUNT(DISTINCT job_id) FROM measurements"));
  // A is back and keeps serving: with B stopped, a new task needs A.
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT COUNT(*) FROM workers WHERE state = 'alive'") == 2; },
                      std::chrono::seconds(30)));
  worker_b_->Signal(SIGSTOP);
  auto next = Cli({"tune", WriteFile("gemm.fusor", "dim m=64 k=32 n=48 h=16\nin A[m,k] B[k,n] D[n,h]\n"
                                                   "C[m,n] = sum(k) A[m,k] * B[k,n]\nE[m,h] = sum(n) C[m,n] * D[n,h]\n"
                                                   "out E\n"),
                   "--budget", "2"});
  worker_b_->Signal(SIGCONT);
  ASSERT_EQ(next.first, 0) << next.second << worker_a_->Log();
  EXPECT_EQ(Query("SELECT COUNT(*) FROM tasks WHERE state = 'done'"), 2);
}

// The scheduler stopped in the middle of a task (`signal`: SIGKILL, a
// crash; SIGTERM, a drained shutdown) and restarted on the same port and
// database: the worker reconnects within seconds, the client in the tune
// asks again (UNAVAILABLE is retried with backoff) and joins the resumed
// task, and every job is measured exactly once.
void E2eTest::ClientAndWorkerOutliveARestart(int signal) {
  worker_a_ = StartWorker("A");
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT COUNT(*) FROM workers WHERE state = 'alive'") == 1; },
                      std::chrono::seconds(60)));
  const std::string spec = WriteFile("attention.fusor", kChain);
  std::unique_ptr<Daemon> client = StartCli({"tune", spec, "--budget", "6"});
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT COUNT(*) FROM measurements") >= 2; }, std::chrono::seconds(120)));
  scheduler_->Signal(signal);
  // SIGTERM drains and exits 0; SIGKILL kills.
  ASSERT_EQ(scheduler_->Wait(std::chrono::seconds(20)), std::optional<int>(signal == SIGTERM ? 0 : -SIGKILL));
  if (signal == SIGTERM) EXPECT_THAT(scheduler_->Log(), HasSubstr("shutting down"));
  ASSERT_LT(Query("SELECT COUNT(*) FROM measurements WHERE kind = 'candidate'"), 6);
  const std::string task = TryQuery("SELECT id FROM tasks").value_or("");
  StartScheduler(address_);
  const auto back = std::chrono::steady_clock::now();
  // The worker is back within seconds of the scheduler: its channel redials and its lease loop retries at
  // least every 2 s (4 s at worst; the bound leaves room for a busy machine). (The scheduler is down only
  // for seconds here, too short for gRPC's default backoff, which grows to 120 s, to show.)
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT COUNT(*) FROM workers WHERE state = 'alive'") == 1; },
                      std::chrono::seconds(30)));
  EXPECT_LT(std::chrono::steady_clock::now() - back, std::chrono::seconds(15)) << worker_a_->Log();

  std::optional<int> rc = client->Wait(std::chrono::seconds(180));
  ASSERT_EQ(rc, std::optional<int>(0)) << client->Log() << scheduler_->Log();
  EXPECT_THAT(client->Log(), HasSubstr("tuned now by task " + task));
  EXPECT_EQ(Query("SELECT COUNT(*) FROM tasks"), 1);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements WHERE kind = 'candidate'"), 6);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements WHERE kind = 'baseline'"), 1);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements"), Query("SELECT COUNT(DISTINCT job_id) FROM measurements"));
  EXPECT_EQ(TryQuery("PRAGMA integrity_check"), std::optional<std::string>("ok"));
}

TEST_F(E2eTest, SchedulerKilledMidTaskResumesOnRestart) { ClientAndWorkerOutliveARestart(SIGKILL); }

TEST_F(E2eTest, SchedulerStoppedMidTaskDrainsAndResumesOnRestart) { ClientAndWorkerOutliveARestart(SIGTERM); }

// A worker whose candidates all crash (FUSOR_INJECT_CANDIDATE_CRASH makes
// its job runners die of SIGSEGV) fails each task with the cause and keeps
// serving: it stays registered, takes the next task's jobs and measures
// their baselines.
TEST_F(E2eTest, WorkerWhoseCandidatesCrashKeepsServing) {
  setenv("FUSOR_INJECT_CANDIDATE_CRASH", "1", 1);
  worker_a_ = StartWorker("A");
  unsetenv("FUSOR_INJECT_CANDIDATE_CRASH");
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT COUNT(*) FROM workers WHERE state = 'alive'") == 1; },
                      std::chrono::seconds(60)));
  const std::vector<std::string> chains = {
      kChain, "dim m=64 k=32 n=48\nin A[m,k] B[k,n]\nC[m,n] = sum(k) A[m,k] * B[k,n]\nD[m,n] = relu(C[m,n])\nout D\n"};
  for (size_t i = 0; i < chains.size(); ++i) {
    auto failed = Cli({"tune", WriteFile("chain" + std::to_string(i) + ".fusor", chains[i]), "--budget", "2"});
    EXPECT_EQ(failed.first, 1) << failed.second;
    EXPECT_THAT(failed.second, HasSubstr("all 2 candidates failed; the first: crash: runner died of signal 11"));
    EXPECT_TRUE(worker_a_->running()) << worker_a_->Log();
  }
  EXPECT_EQ(Query("SELECT COUNT(*) FROM tasks WHERE state = 'failed'"), 2);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements WHERE kind = 'candidate' AND status = 'crash'"), 4);
  // One baseline per task, measured among the first candidates (noisy
  // where the machine is busy: measured all the same).
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements WHERE kind = 'baseline' AND status IN ('ok', 'noisy')"), 2);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM workers WHERE state = 'alive'"), 1);
}

// Tokens and roles: without a token, or with one of the wrong role, a call
// is refused and changes nothing; a client token tunes but cannot report
// measurements; a revoked token is refused; an admin token is a client too.
TEST_F(E2eTest, TokensGateEveryCallByRole) {
  scheduler_->Signal(SIGTERM);
  ASSERT_TRUE(scheduler_->Wait(std::chrono::seconds(20)).has_value());
  StartScheduler("127.0.0.1:0", /*tokens=*/true);
  const std::string worker_token = CreateToken("worker", "worker-1"), client_token = CreateToken("client", "client-1"),
                    admin_token = CreateToken("admin", "admin-1");
  EXPECT_THAT(scheduler_->Log(), HasSubstr("tokens required"));

  setenv("FUSOR_TOKEN", worker_token.c_str(), 1);
  worker_a_ = StartWorker("A");
  unsetenv("FUSOR_TOKEN");
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT COUNT(*) FROM workers WHERE state = 'alive'") == 1; },
                      std::chrono::seconds(60)))
      << worker_a_->Log();
  const std::string spec = WriteFile("attention.fusor", kChain);
  const auto before = TableCounts();
  auto none = Cli({"tune", spec});
  EXPECT_EQ(none.first, 1);
  EXPECT_THAT(none.second, HasSubstr("UNAUTHENTICATED"));
  auto wrong = Cli({"--token", worker_token, "tune", spec});
  EXPECT_EQ(wrong.first, 1);
  EXPECT_THAT(wrong.second, HasSubstr("has role worker; this call needs client [PERMISSION_DENIED]"));
  EXPECT_EQ(TableCounts(), before);

  auto tuned = Cli({"--token", client_token, "tune", spec, "--budget", "2"});
  ASSERT_EQ(tuned.first, 0) << tuned.second;
  // A client can never report a measurement, even for a job it names.
  const auto after = TableCounts();
  auto stub = v1::WorkerService::NewStub(*wire::Dial(address_, client_token));
  grpc::ClientContext ctx;
  v1::ReportRequest report;
  report.set_worker_id(TryQuery("SELECT id FROM workers").value_or("w"));
  report.set_job_id(TryQuery("SELECT id FROM jobs LIMIT 1").value_or("j"));
  report.set_lease_id(TryQuery("SELECT lease_id FROM jobs LIMIT 1").value_or("l"));
  report.mutable_measurement()->set_status(v1::MEASUREMENT_STATUS_OK);
  report.mutable_measurement()->add_samples_s(1e-9);
  report.mutable_measurement()->set_median_s(1e-9);
  v1::ReportResponse response;
  EXPECT_EQ(stub->Report(&ctx, report, &response).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(TableCounts(), after);

  auto revoke = Cli({"--db", db_path_, "admin", "token", "revoke",
                     TryQuery("SELECT id FROM tokens WHERE role = 'client'").value_or("?")});
  ASSERT_EQ(revoke.first, 0) << revoke.second;
  // Revoked in the database file directly: refused once the scheduler
  // checks the token again (Authenticator::kTokenRecheck, a second).
  std::pair<int, std::string> revoked;
  for (int i = 0; i < 40; ++i) {
    revoked = Cli({"--token", client_token, "lookup", spec});
    if (revoked.first != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(revoked.first, 1);
  EXPECT_THAT(revoked.second, HasSubstr("unknown or revoked token"));
  auto admin = Cli({"--token", admin_token, "lookup", spec});
  EXPECT_EQ(admin.first, 0) << admin.second;
  auto list = Cli({"--db", db_path_, "admin", "token", "list"});
  EXPECT_THAT(list.second, HasSubstr("revoked"));
  EXPECT_EQ(list.second.find(client_token), std::string::npos);  // only hashes are kept
  EXPECT_EQ(Query("SELECT COUNT(*) FROM tokens WHERE hash LIKE 'fusor_%'"), 0);

  // Administration over the network, for admin tokens only.
  const std::string bob = CreateToken("client", "bob");
  auto refused = Cli({"--token", bob, "admin", "token", "create", "--role", "admin", "--name", "mallory"});
  EXPECT_EQ(refused.first, 1);
  EXPECT_THAT(refused.second, HasSubstr("has role client; this call needs admin [PERMISSION_DENIED]"));
  EXPECT_EQ(Cli({"--token", bob, "records", "export"}).first, 1);
  auto remote = Cli({"--token", admin_token, "admin", "token", "create", "--role", "client", "--name", "carol"});
  ASSERT_EQ(remote.first, 0) << remote.second;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(remote.second, m, std::regex("fusor_[0-9a-f]{40}")));
  const std::string carol = m[0].str();
  EXPECT_EQ(Cli({"--token", carol, "lookup", spec}).first, 0);
  auto listed = Cli({"--token", admin_token, "admin", "token", "list"});
  EXPECT_THAT(listed.second, HasSubstr("carol"));
  ASSERT_EQ(Cli({"--token", admin_token, "admin", "token", "revoke",
                 TryQuery("SELECT id FROM tokens WHERE name = 'carol'").value_or("?")})
                .first,
            0);
  EXPECT_THAT(Cli({"--token", carol, "lookup", spec}).second, HasSubstr("unknown or revoked token"));

  const std::string records = (dir_ / "records.jsonl").string(), copy = (dir_ / "copy.db").string();
  auto exported = Cli({"--token", admin_token, "records", "export", "-o", records});
  ASSERT_EQ(exported.first, 0) << exported.second;
  const int64_t measurements = Query("SELECT COUNT(*) FROM measurements");
  EXPECT_THAT(exported.second, HasSubstr("exported " + std::to_string(measurements) + " measurement records"));
  auto imported = Cli({"--token", admin_token, "records", "import", records});
  ASSERT_EQ(imported.first, 0) << imported.second;
  EXPECT_THAT(imported.second, HasSubstr("0 new measurements, " + std::to_string(measurements) + " already here"));
  // Into another database: the confirmed answer comes with where it was measured.
  const std::string other = (dir_ / "other.db").string();
  auto into_other = Cli({"--db", other, "records", "import", records});
  ASSERT_EQ(into_other.first, 0) << into_other.second;
  EXPECT_THAT(into_other.second, HasSubstr("1 best records changed"));
  auto answered = Cli({"--db", other, "lookup", spec});
  ASSERT_EQ(answered.first, 0) << answered.second;
  EXPECT_THAT(answered.second,
              HasSubstr(":" + std::filesystem::absolute(db_path_).string() + ", no new measurement"));
  EXPECT_THAT(answered.second, HasSubstr("imported from "));
  auto backup = Cli({"--token", admin_token, "db", "backup", copy});
  ASSERT_EQ(backup.first, 0) << backup.second;
  EXPECT_THAT(backup.second, HasSubstr("(" + std::to_string(measurements) + " measurements"));
  EXPECT_THAT(backup.second, HasSubstr("integrity checked"));
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements"), measurements);
}

// The conventions operators expect of every binary: --version (version,
// commit, compiler) exits 0, a usage error exits 2 naming it; a second
// scheduler on the port this one holds exits 1 saying why (it never shares
// the port); the CLI takes its scheduler from $FUSOR_SERVER.
TEST_F(E2eTest, EveryBinaryKeepsTheCommandLineConventions) {
  for (const std::string program : {"fusor", "fusor-scheduler", "fusor-worker"}) {
    const std::string path = kBin + (program == "fusor" ? "/client/" : program == "fusor-worker" ? "/worker/" : "/server/") +
                             program;
    auto version = Shell(path + " --version");
    EXPECT_EQ(version.first, 0) << version.second;
    EXPECT_THAT(version.second, HasSubstr(program + " "));
    EXPECT_THAT(version.second, HasSubstr(" (commit "));
    auto bad = Shell(path + (program == "fusor" ? " workers" : "") + " --no-such-flag");
    EXPECT_EQ(bad.first, 2) << bad.second;
    EXPECT_THAT(bad.second, HasSubstr("--no-such-flag"));
  }
  auto second = Shell(kBin + "/server/fusor-scheduler --insecure --db " + (dir_ / "second.db").string() +
                      " --listen " + address_);
  EXPECT_EQ(second.first, 1) << second.second;
  EXPECT_THAT(second.second, HasSubstr("the port is in use"));
  auto through_env = Shell("FUSOR_SERVER=" + address_ + " " + kBin + "/client/fusor health");
  EXPECT_EQ(through_env.first, 0) << through_env.second;
  EXPECT_THAT(through_env.second, HasSubstr("SERVING"));
  // Shell completion, as bash runs it: commands at each level, options, then files.
  const std::string complete = "bash -c 'source <(" + kBin +
                               "/client/fusor completion bash) && COMP_WORDS=($0) && COMP_CWORD=$((${#COMP_WORDS[@]} - "
                               "1)) && _fusor && echo \"[${COMPREPLY[*]}]\"' ";
  EXPECT_EQ(Shell(complete + "'fusor --server h:1 admin token re'").second, "[revoke]\n");
  EXPECT_EQ(Shell(complete + "'fusor lookup --wh'").second, "[--why]\n");
  EXPECT_EQ(Shell(complete + "'fusor records'").second, "[records]\n");
  WriteFile("completed.fusor", kChain);
  EXPECT_EQ(Shell("cd " + dir_.string() + " && " + complete + "'fusor tune comple'").second, "[completed.fusor]\n");
  auto zsh = Shell(kBin + "/client/fusor completion zsh");
  EXPECT_THAT(zsh.second, HasSubstr("bashcompinit"));
  EXPECT_EQ(Shell(kBin + "/client/fusor completion fish").first, 2);
}

// Mutual TLS with tokens on the gRPC and the metrics port: only callers
// that trust the scheduler's CA and present a certificate signed by the
// client CA get through, and refusals change nothing.
TEST_F(E2eTest, MutualTlsOnEveryPort) {
  const std::string certs = (dir_ / "certs").string(), rogue = (dir_ / "rogue").string();
  const std::string make = std::string(FUSOR_SOURCE_DIR) + "/deploy/make-certs.sh ";
  ASSERT_EQ(Shell(make + certs).first, 0);
  ASSERT_EQ(Shell(make + rogue).first, 0);
  scheduler_->Signal(SIGTERM);
  ASSERT_TRUE(scheduler_->Wait(std::chrono::seconds(20)).has_value());

  // A key that is not the certificate's is refused at start, clearly.
  Daemon mismatched({kBin + "/server/fusor-scheduler", "--listen", "127.0.0.1:0", "--db", db_path_, "--tls-cert",
                     certs + "/scheduler.pem", "--tls-key", rogue + "/scheduler.key"},
                    (dir_ / "mismatched.log").string());
  EXPECT_EQ(mismatched.Wait(std::chrono::seconds(30)), std::optional<int>(2));
  EXPECT_THAT(mismatched.Log(), HasSubstr("does not belong to --tls-cert"));

  StartScheduler("127.0.0.1:0", /*tokens=*/true,
                 {"--tls-cert", certs + "/scheduler.pem", "--tls-key", certs + "/scheduler.key", "--tls-client-ca",
                  certs + "/ca.pem", "--metrics-listen", "127.0.0.1:0"});
  EXPECT_THAT(scheduler_->Log(), HasSubstr("client certificates required (mutual TLS)"));
  std::smatch m;
  const std::string log = scheduler_->Log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("metrics on port (\\d+)"))) << log;
  const std::string metrics_url = "https://127.0.0.1:" + m[1].str() + "/metrics";
  const std::string worker_token = CreateToken("worker", "gpu-pool"), client_token = CreateToken("client", "alice");
  const std::vector<std::string> good = {"--tls-ca", certs + "/ca.pem", "--tls-cert", certs + "/client.pem",
                                         "--tls-key", certs + "/client.key"};
  worker_a_ = StartWorker("A", [&] {
    auto args = good;
    args.insert(args.end(), {"--token", worker_token});
    return args;
  }());
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT COUNT(*) FROM workers WHERE state = 'alive'") == 1; },
                      std::chrono::seconds(60)))
      << worker_a_->Log();

  const std::string spec = WriteFile("attention.fusor", kChain);
  const auto before = TableCounts();
  auto with = [&](std::vector<std::string> tls) {
    tls.insert(tls.end(), {"--token", client_token, "tune", spec, "--budget", "2"});
    return Cli(tls);
  };
  auto plaintext = with({});
  EXPECT_EQ(plaintext.first, 1);
  EXPECT_THAT(plaintext.second, HasSubstr("A scheduler serving TLS needs --tls-ca"));
  auto no_client_cert = with({"--tls-ca", certs + "/ca.pem"});
  EXPECT_EQ(no_client_cert.first, 1);
  EXPECT_THAT(no_client_cert.second, HasSubstr("UNAVAILABLE"));
  auto foreign_client_cert =
      with({"--tls-ca", certs + "/ca.pem", "--tls-cert", rogue + "/client.pem", "--tls-key", rogue + "/client.key"});
  EXPECT_EQ(foreign_client_cert.first, 1);
  auto untrusted_server =
      with({"--tls-ca", rogue + "/ca.pem", "--tls-cert", certs + "/client.pem", "--tls-key", certs + "/client.key"});
  EXPECT_EQ(untrusted_server.first, 1);
  auto half = with({"--tls-ca", certs + "/ca.pem", "--tls-cert", certs + "/client.pem"});
  EXPECT_EQ(half.first, 1);
  EXPECT_THAT(half.second, HasSubstr("needs both --tls-cert and --tls-key"));
  EXPECT_EQ(TableCounts(), before);

  auto tuned = with(good);
  ASSERT_EQ(tuned.first, 0) << tuned.second;
  EXPECT_EQ(Query("SELECT COUNT(*) FROM tasks WHERE state = 'done'"), 1);
  auto probe = good;
  probe.push_back("health");
  auto healthy = Cli(probe);
  EXPECT_EQ(healthy.first, 0) << healthy.second;
  EXPECT_THAT(healthy.second, HasSubstr("SERVING"));

  // The metrics port: HTTPS, and only with a client certificate.
  auto scraped = Shell("curl -sS --max-time 10 --cacert " + certs + "/ca.pem --cert " + certs + "/client.pem --key " +
                       certs + "/client.key " + metrics_url);
  EXPECT_EQ(scraped.first, 0) << scraped.second;
  EXPECT_THAT(scraped.second, HasSubstr("fusor_tasks{state=\"done\"} 1"));
  EXPECT_NE(Shell("curl -sS --max-time 10 --cacert " + certs + "/ca.pem " + metrics_url).first, 0);
  EXPECT_NE(Shell("curl -sS --max-time 10 http://" + metrics_url.substr(8)).first, 0);
}

// A deployment's operations: the scheduler configured by a YAML file
// (flags override it) logging JSON; SIGHUP makes it serve certificates
// replaced on disk (a bad replacement is refused and the old ones stay),
// and makes a worker dial again with its token file read anew; the CLI's
// -o json answers a line of JSON per answer.
TEST_F(E2eTest, ConfigFileAndReloadOnSighup) {
  const std::string certs = (dir_ / "certs").string(), rotated = (dir_ / "rotated").string(),
                    live = (dir_ / "live").string(), worker_live = (dir_ / "worker-live").string();
  const std::string make = std::string(FUSOR_SOURCE_DIR) + "/deploy/make-certs.sh ";
  ASSERT_EQ(Shell(make + certs).first, 0);
  ASSERT_EQ(Shell(make + rotated).first, 0);
  ASSERT_EQ(Shell("mkdir -p " + live + " " + worker_live + " && cp " + certs + "/* " + live + " && cp " + certs +
                  "/* " + worker_live)
                .first,
            0);
  scheduler_->Signal(SIGTERM);
  ASSERT_TRUE(scheduler_->Wait(std::chrono::seconds(20)).has_value());
  const std::string config =
      WriteFile("scheduler.yaml", "# what the unit's file would say\nlisten: 127.0.0.1:1\ntls-cert: " + live +
                                      "/scheduler.pem\ntls-key: " + live + "/scheduler.key\ntls-client-ca: " + live +
                                      "/ca.pem\nmetrics-listen: 127.0.0.1:0\nlog-format: json\n");
  StartScheduler("127.0.0.1:0", /*tokens=*/true, {"--config", config});  // --listen overrides the file's
  std::smatch m;
  std::string log = scheduler_->Log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("metrics on port (\\d+)"))) << log;
  const std::string metrics_url = "https://127.0.0.1:" + m[1].str() + "/metrics";
  EXPECT_THAT(log, HasSubstr("\"logger\":\"scheduler\",\"message\":\"TLS on, client certificates required"));

  const auto tls = [](const std::string& d) {
    return std::vector<std::string>{"--tls-ca", d + "/ca.pem", "--tls-cert", d + "/client.pem", "--tls-key",
                                    d + "/client.key"};
  };
  const std::string client_token = CreateToken("client", "alice");
  const auto cli = [&](const std::string& d, std::vector<std::string> args) {
    std::vector<std::string> argv = tls(d);
    argv.insert(argv.end(), {"--token", client_token});
    argv.insert(argv.end(), args.begin(), args.end());
    return Cli(argv);
  };
  const auto healthy = [&](const std::string& d) { return cli(d, {"--timeout", "3", "health"}).first == 0; };
  const std::string token_file = WriteFile("worker.token", CreateToken("worker", "pool") + "\n");
  worker_a_ = StartWorker("A", [&] {
    auto args = tls(worker_live);
    args.insert(args.end(), {"--token-file", token_file, "--log-format", "json"});
    return args;
  }());
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT COUNT(*) FROM workers WHERE state = 'alive'") == 1; },
                      std::chrono::seconds(60)))
      << worker_a_->Log();
  EXPECT_TRUE(healthy(certs));
  EXPECT_FALSE(healthy(rotated));

  // New files on disk are not served before the SIGHUP, then they are.
  ASSERT_EQ(Shell("cp " + rotated + "/* " + live).first, 0);
  EXPECT_TRUE(healthy(certs));
  scheduler_->Signal(SIGHUP);
  ASSERT_TRUE(WaitFor([&] { return scheduler_->Log().find("certificates reloaded") != std::string::npos; },
                      std::chrono::seconds(10)))
      << scheduler_->Log();
  EXPECT_TRUE(WaitFor([&] { return healthy(rotated); }, std::chrono::seconds(20)));
  EXPECT_FALSE(healthy(certs));
  const std::string curl = "curl -sS --max-time 10 --cacert " + rotated + "/ca.pem --cert " + rotated +
                           "/client.pem --key " + rotated + "/client.key " + metrics_url;
  auto scraped = Shell(curl);
  EXPECT_EQ(scraped.first, 0) << scraped.second;
  EXPECT_THAT(scraped.second, HasSubstr("# TYPE fusor_queue_wait_seconds histogram"));

  // A key that is not the certificate's: refused, the served pair stays.
  ASSERT_EQ(Shell("cp " + certs + "/scheduler.key " + live).first, 0);
  scheduler_->Signal(SIGHUP);
  ASSERT_TRUE(WaitFor([&] { return scheduler_->Log().find("certificates kept") != std::string::npos; },
                      std::chrono::seconds(10)))
      << scheduler_->Log();
  EXPECT_THAT(scheduler_->Log(), HasSubstr("does not belong to --tls-cert"));
  std::this_thread::sleep_for(std::chrono::seconds(2));  // past the watcher's next read
  EXPECT_TRUE(healthy(rotated));
  EXPECT_EQ(Shell(curl).first, 0);

  // The worker's token revoked, a new one in its file and the new CA and
  // client certificate in its TLS files: after its SIGHUP it works under
  // the new ones.
  ASSERT_EQ(Cli({"--db", db_path_, "admin", "token", "revoke",
                 TryQuery("SELECT id FROM tokens WHERE name = 'pool'").value_or("?")})
                .first,
            0);
  std::ofstream(token_file) << CreateToken("worker", "pool-2") << "\n";
  ASSERT_EQ(Shell("cp " + rotated + "/* " + worker_live).first, 0);
  worker_a_->Signal(SIGHUP);
  ASSERT_TRUE(WaitFor([&] { return worker_a_->Log().find("dialled") != std::string::npos; }, std::chrono::seconds(10)))
      << worker_a_->Log();
  const std::string spec = WriteFile("attention.fusor", kChain);
  auto tuned = cli(rotated, {"tune", spec, "--budget", "2", "-o", "json"});
  ASSERT_EQ(tuned.first, 0) << tuned.second << worker_a_->Log();
  // -o json: one line of JSON per answer, the file named; the progress on stderr.
  std::string line;
  for (std::istringstream lines(tuned.second); std::getline(lines, line);) {
    if (!line.empty() && line[0] == '{') break;
  }
  EXPECT_THAT(line, HasSubstr("\"file\":\"" + spec + "\""));
  EXPECT_THAT(line, HasSubstr("\"best_measurement\":{"));
  auto looked = cli(rotated, {"lookup", spec, "-o", "json"});
  EXPECT_EQ(looked.first, 0) << looked.second;
  EXPECT_THAT(looked.second, HasSubstr("\"answer\":\"tuned\""));
  const std::string missing = WriteFile("other.fusor", "dim m=48 k=16 n=32\nin A[m,k] B[k,n]\nC[m,n] = sum(k) "
                                                       "A[m,k] * B[k,n]\nout C\n");
  auto missed = cli(rotated, {"lookup", missing, "-o", "json"});
  EXPECT_EQ(missed.first, 3) << missed.second;
  EXPECT_THAT(missed.second, Not(HasSubstr("\"result\"")));
  auto workers = cli(rotated, {"workers", "-o", "json"});
  EXPECT_EQ(workers.first, 0) << workers.second;
  EXPECT_THAT(workers.second, HasSubstr("\"name\":\"A\""));
  auto health = cli(rotated, {"health", "-o", "json"});
  EXPECT_THAT(health.second, HasSubstr("{\"status\":\"SERVING\"}"));
  auto task = cli(rotated, {"task", "no-such-task", "-o", "json"});
  EXPECT_EQ(task.first, 3) << task.second;
  EXPECT_THAT(task.second, HasSubstr("{\"error\":{\"code\":\"NOT_FOUND\""));
}

// Many clients at once, with tokens, cache hits and new tasks mixed: every
// one succeeds but the designed refusal: a client over its quota of running
// tasks (1 here) gets RESOURCE_EXHAUSTED with a retry hint (exit 4) while
// another client's same request goes through.
TEST_F(E2eTest, ConcurrentClientsMixingCacheHitsAndNewTasks) {
  scheduler_->Signal(SIGTERM);
  ASSERT_TRUE(scheduler_->Wait(std::chrono::seconds(20)).has_value());
  StartScheduler("127.0.0.1:0", /*tokens=*/true, {"--max-tasks-per-client", "1"});
  const std::string worker_token = CreateToken("worker", "pool");
  const std::vector<std::string> users = {CreateToken("client", "alice"), CreateToken("client", "bob"),
                                          CreateToken("client", "carol")};
  worker_a_ = StartWorker("A", {"--token", worker_token});
  worker_b_ = StartWorker("B", {"--token", worker_token});
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT COUNT(*) FROM workers WHERE state = 'alive'") == 2; },
                      std::chrono::seconds(60)));
  auto as = [&](int user, std::vector<std::string> args) {
    args.insert(args.begin(), {"--token", users[user]});
    return args;
  };
  auto chain = [&](int i) {
    return WriteFile("new" + std::to_string(i) + ".fusor",
                     "dim m=" + std::to_string(32 * (i + 1)) +
                         " k=16 n=32\nin A[m,k] B[k,n]\nC[m,n] = sum(k) A[m,k] * B[k,n]\nD[m,n] = relu(C[m,n])\n"
                         "out D\n");
  };
  const std::string cached = WriteFile("attention.fusor", kChain);
  ASSERT_EQ(Cli(as(0, {"tune", cached, "--budget", "2"})).first, 0);
  std::vector<std::unique_ptr<Daemon>> clients;
  for (int i = 0; i < 6; ++i) clients.push_back(StartCli(as(i % 3, {i % 2 == 0 ? "tune" : "lookup", cached})));
  // Each user asks for a new chain from two clients at once: they share one task.
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 2; ++j) clients.push_back(StartCli(as(i, {"tune", chain(i), "--budget", "2"})));
  }
  for (auto& c : clients) {
    EXPECT_EQ(c->Wait(std::chrono::seconds(240)), std::optional<int>(0)) << c->Log();
  }
  EXPECT_EQ(Query("SELECT COUNT(*) FROM tasks WHERE state = 'done'"), 4);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM tasks"), 4);
  EXPECT_EQ(Query("SELECT COUNT(DISTINCT client) FROM tasks"), 3);

  // The quota: with the workers stopped, alice's new task stays running, so
  // her next one is refused; bob's identical request is not.
  worker_a_->Signal(SIGSTOP);
  worker_b_->Signal(SIGSTOP);
  std::unique_ptr<Daemon> running = StartCli(as(0, {"tune", chain(3), "--budget", "2"}));
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT COUNT(*) FROM tasks WHERE state = 'running'") == 1; },
                      std::chrono::seconds(60)));
  auto refused = Cli(as(0, {"tune", chain(4), "--budget", "2"}));
  EXPECT_EQ(refused.first, 4) << refused.second;
  EXPECT_THAT(refused.second, HasSubstr("client 'alice' has 1 task running (at most 1); retry in about"));
  EXPECT_THAT(refused.second, HasSubstr("[RESOURCE_EXHAUSTED]"));
  std::unique_ptr<Daemon> other = StartCli(as(1, {"tune", chain(4), "--budget", "2"}));
  worker_a_->Signal(SIGCONT);
  worker_b_->Signal(SIGCONT);
  EXPECT_EQ(running->Wait(std::chrono::seconds(240)), std::optional<int>(0)) << running->Log();
  EXPECT_EQ(other->Wait(std::chrono::seconds(240)), std::optional<int>(0)) << other->Log();
  EXPECT_EQ(Query("SELECT COUNT(*) FROM tasks"), 6);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements"), Query("SELECT COUNT(DISTINCT job_id) FROM measurements"));
}

// A small zoo: an encoder at two sequence lengths and a decoder whose FFN
// is the encoder's at 32 tokens: 6 chains, 5 distinct.
class SweepE2eTest : public E2eTest {
 protected:
  std::string WriteZoo() {
    std::filesystem::create_directories(dir_ / "models");
    WriteFile("models/enc.json", R"({"model": "enc", "architecture": "encoder", "hidden": 64, "heads": 2,
      "ffn": 128, "layers": 2, "activation": "gelu", "mask": "padding", "seq": 32, "batch": 1, "dtype": "f32"})");
    WriteFile("models/dec.json", R"({"model": "dec", "architecture": "decoder", "hidden": 64, "heads": 2,
      "ffn": 128, "layers": 2, "activation": "gelu", "mask": "causal", "seq": 32, "batch": 1, "dtype": "f32"})");
    return WriteFile("zoo.yaml", "name: tiny-zoo\nbudget: 2\nmodels:\n"
                                 "  - description: models/enc.json\n    seq: [16, 32]\n"
                                 "  - description: models/dec.json\n");
  }

  int64_t ChainsDone() {
    std::optional<std::string> v = TryQuery("SELECT COUNT(*) FROM sweep_chains WHERE state = 'done'");
    return v ? std::stoll(*v) : 0;
  }

  // Kills `cli` once the sweep has finished a chain, with chains left.
  void KillAfterTheFirstChain(Daemon& cli) {
    ASSERT_TRUE(WaitFor([&] { return ChainsDone() >= 1 || !cli.running(); }, std::chrono::seconds(150)))
        << cli.Log();
    cli.Signal(SIGKILL);
    cli.Wait(std::chrono::seconds(10));
    ASSERT_LT(ChainsDone(), 5) << "the sweep finished before it could be interrupted";
  }

  // Every distinct chain was tuned by exactly one task, which finished,
  // and measured at most its budget of candidates (the unfused chain,
  // measured as the baseline, may be a candidate besides).
  void ExpectEachChainTunedOnce() {
    EXPECT_EQ(Query("SELECT COUNT(*) FROM sweep_chains WHERE state = 'done' AND from_cache = 0"), 5);
    EXPECT_EQ(Query("SELECT COUNT(*) FROM tasks"), 5);
    EXPECT_EQ(Query("SELECT COUNT(DISTINCT workload_key) FROM tasks WHERE state = 'done'"), 5);
    EXPECT_EQ(Query("SELECT COUNT(*) FROM (SELECT task_id FROM candidates WHERE schedule NOT LIKE 'unfused %' "
                    "GROUP BY task_id HAVING COUNT(*) > 2)"),
              0);
    EXPECT_EQ(Query("SELECT COUNT(*) FROM (SELECT job_id FROM measurements GROUP BY job_id HAVING COUNT(*) > 1)"), 0);
    EXPECT_EQ(TryQuery("PRAGMA integrity_check").value_or(""), "ok");
  }

  // The report's CSV rows' results (the "result" column).
  std::vector<std::string> CsvResults(const std::string& dir) {
    std::ifstream in(dir + "/report.csv");
    std::string line;
    std::vector<std::string> results;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      for (const char* r : {",tuned,", ",cache,", ",failed,"}) {
        if (line.find(r) != std::string::npos) results.push_back(std::string(r).substr(1, strlen(r) - 2));
      }
    }
    return results;
  }
};

// The README's way: an embedded scheduler, killed with its client halfway,
// resumed by the same command; run again, the cache answers everything.
TEST_F(SweepE2eTest, EmbeddedSweepResumesAfterAKillAndThenComesFromTheCache) {
  db_path_ = (dir_ / "embedded.db").string();  // not the fixture's scheduler's
  const std::string zoo = WriteZoo();
  const std::string out = (dir_ / "report").string();
  const std::vector<std::string> args = {"--db",        db_path_, "--calibration-seconds", "0.05", "--max-spread",
                                         "1e9",         "sweep",  zoo,                     "-o",   out};
  std::unique_ptr<Daemon> first = StartCli(args);
  KillAfterTheFirstChain(*first);

  auto [rc, log] = Cli(args, std::chrono::seconds(300));
  ASSERT_EQ(rc, 0) << log;
  EXPECT_THAT(log, HasSubstr("resumed"));
  EXPECT_THAT(log, HasSubstr("sweep tiny-zoo: 3 models, 6 chains, 5 distinct"));
  EXPECT_EQ(Query("SELECT COUNT(*) FROM sweeps"), 1);
  ExpectEachChainTunedOnce();
  EXPECT_THAT(CsvResults(out), ::testing::ElementsAre("tuned", "tuned", "tuned", "tuned", "tuned", "tuned"));
  for (const char* f : {"report.md", "report.json", "speedups.svg"}) {
    EXPECT_TRUE(std::filesystem::exists(dir_ / "report" / f)) << f;
  }

  const int64_t measurements = Query("SELECT COUNT(*) FROM measurements");
  auto again = Cli(args);
  ASSERT_EQ(again.first, 0) << again.second;
  EXPECT_THAT(again.second, HasSubstr("(6 from the cache, 0 tuned, 0 failed)"));
  EXPECT_EQ(Query("SELECT COUNT(*) FROM sweeps"), 2);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM tasks"), 5);
  EXPECT_EQ(Query("SELECT COUNT(*) FROM measurements"), measurements);
  EXPECT_THAT(CsvResults(out), ::testing::Each("cache"));
}

// A manifest of ONNX exports (tests/common/zoo/exports): BERT from the
// TorchScript and the dynamo exporter, whose chains have the same keys, so
// each distinct chain is tuned once; the models are named by their files.
TEST_F(SweepE2eTest, EmbeddedSweepOverOnnxExports) {
  db_path_ = (dir_ / "embedded.db").string();
  const std::string exports = std::string(FUSOR_SOURCE_DIR) + "/tests/common/zoo/exports/";
  const std::string zoo = WriteFile("exports.yaml", "name: bert-exports\nbudget: 1\nmodels:\n"
                                                    "  - onnx: " + exports + "bert_torchscript_eager.onnx\n"
                                                    "    dims: {batch: 1, seq: 16}\n"
                                                    "  - onnx: " + exports + "bert_dynamo_eager.onnx\n"
                                                    "    dims: {batch: 1, seq: 16}\n");
  const std::string out = (dir_ / "report").string();
  auto [rc, log] = Cli({"--db", db_path_, "--calibration-seconds", "0.05", "--max-spread", "1e9", "sweep", zoo, "-o",
                        out},
                       std::chrono::seconds(300));
  ASSERT_EQ(rc, 0) << log;
  EXPECT_THAT(log, HasSubstr("sweep bert-exports: 2 models, 4 chains, 2 distinct"));
  EXPECT_THAT(log, HasSubstr("bert_torchscript_eager (batch=1, seq=16)"));
  EXPECT_THAT(log, HasSubstr("bert_dynamo_eager (batch=1, seq=16)"));
  EXPECT_EQ(Query("SELECT COUNT(*) FROM tasks WHERE state = 'done'"), 2);
  EXPECT_THAT(CsvResults(out), ::testing::ElementsAre("tuned", "tuned", "tuned", "tuned"));
}

// Against a remote scheduler: the sweep goes on without its client; the
// scheduler is then killed (-9) and restarted, and the same command
// resumes the sweep and completes it.
TEST_F(SweepE2eTest, RemoteSweepOutlivesItsClientAndARestartedScheduler) {
  const std::string zoo = WriteZoo();
  worker_a_ = StartWorker("A");
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT COUNT(*) FROM workers WHERE state = 'alive'") == 1; },
                      std::chrono::seconds(60)))
      << worker_a_->Log();
  const std::vector<std::string> args = {"sweep", zoo, "-o", (dir_ / "report").string()};
  std::unique_ptr<Daemon> client = StartCli(args);
  KillAfterTheFirstChain(*client);
  const int64_t done_at_kill = ChainsDone();
  ASSERT_TRUE(WaitFor([&] { return ChainsDone() > done_at_kill; }, std::chrono::seconds(120)))
      << "the sweep stopped with its client\n" << scheduler_->Log();

  scheduler_->Signal(SIGKILL);
  scheduler_->Wait(std::chrono::seconds(10));
  worker_a_->Signal(SIGKILL);
  worker_a_->Wait(std::chrono::seconds(10));
  ASSERT_LT(ChainsDone(), 5) << "the sweep finished before the scheduler could be killed";
  StartScheduler();
  worker_b_ = StartWorker("B");

  auto [rc, log] = Cli(args, std::chrono::seconds(300));
  ASSERT_EQ(rc, 0) << log;
  EXPECT_THAT(log, HasSubstr("resumed"));
  EXPECT_EQ(Query("SELECT COUNT(*) FROM sweeps"), 1);
  ExpectEachChainTunedOnce();
  EXPECT_THAT(CsvResults((dir_ / "report").string()), ::testing::Each("tuned"));
}

}  // namespace
}  // namespace fusor
