// Elastic membership with real processes and real signals: a worker restarted by hand rejoins, a
// hung (SIGSTOPped) worker is declared lost after the heartbeat timeout while the others go on,
// and a job below cluster.min_workers pauses until a new worker comes. Every faulted run is
// compared step by step with one uninterrupted reference run: the same steps, none missing or
// doubled, and — with the deterministic reduction — the same numbers and exported weights, to the
// bit. Every process a test starts is killed when it ends, whatever happened.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::FindProcess;
using ::flashdraft::testing::FirstDifferentStep;
using ::flashdraft::testing::HttpGet;
using ::flashdraft::testing::ReadEvents;
using ::flashdraft::testing::ReadSteps;
using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::StartProcess;
using ::flashdraft::testing::TempDir;
using ::testing::HasSubstr;

const std::string kBin = FLASHDRAFT_BIN_DIR;
constexpr int kSteps = 150;

// `heartbeat_timeout` is short only where a test waits for it (the hung worker): elsewhere a
// loaded CI machine must not make a healthy worker look lost.
std::string JobYaml(const std::string& shards, int min_workers, int heartbeat_timeout) {
  return absl::StrCat(R"(
name: elastic
output_dir: unused
drafter: {num_hidden_layers: 1, block_size: 8, num_target_features: 2, max_anchors: 8}
data: {source: shards, shards_dir: )",
                      shards, R"(, max_seq_len: 64}
train: {seed: 3, learning_rate: 0.01, max_steps: )",
                      kSteps, R"(, global_batch_size: 6}
cluster: {min_workers: )",
                      min_workers, R"(, max_workers: 3, heartbeat_interval_seconds: 0.5,
  heartbeat_timeout_seconds: )",
                      heartbeat_timeout,
                      R"(, join_timeout_seconds: 60, collective_timeout_seconds: 60}
checkpoint: {every_steps: 50, keep_last: 2}
)");
}

// Processes started by a test, killed (SIGKILL, then reaped) when it ends.
class Processes {
 public:
  ~Processes() {
    for (int pid : pids_) {
      kill(pid, SIGCONT);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  int Start(const std::vector<std::string>& argv, const std::string& log,
            const std::vector<std::string>& env = {}) {
    const int pid = StartProcess(argv, log, env);
    pids_.push_back(pid);
    return pid;
  }
  // Waits for `pid` (one this test started) and returns its exit code (-signal when killed).
  int Wait(int pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    pids_.erase(std::remove(pids_.begin(), pids_.end(), pid), pids_.end());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }

 private:
  std::vector<int> pids_;
};

class ElasticTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto r = RunCommand(absl::StrCat(kBin, "/flashdraft make-shards --out ", dir_->Join("shards"),
                                     " --samples 96 --seq 64 --vocab 48 --hidden 32 --seed 4"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (int min : {1, 2}) {
      ASSERT_TRUE(WriteFileAtomically(dir_->Join(absl::StrCat("job-min", min, ".yaml")),
                                      JobYaml(dir_->Join("shards"), min, 30))
                      .ok());
    }
    ASSERT_TRUE(
        WriteFileAtomically(dir_->Join("job-hung.yaml"), JobYaml(dir_->Join("shards"), 1, 3)).ok());
    // The reference: one worker, nothing happens to it.
    r = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir_->Join("job-min1.yaml"),
                                " --workers 1 --out ", dir_->Join("reference")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    reference_ = new std::vector<nlohmann::json>(ReadSteps(dir_->Join("reference/steps.jsonl")));
    ASSERT_EQ(reference_->size(), static_cast<size_t>(kSteps));
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete dir_;
  }

  // Starts `flashdraft launch` on the job with `workers` into `out`; returns its pid once
  // `steps` steps are committed.
  int LaunchAndWait(const std::string& job, int workers, const std::string& out, size_t steps,
                    int max_restarts = 0, const std::vector<std::string>& more = {},
                    const std::vector<std::string>& env = {}) {
    std::filesystem::create_directories(out);
    std::vector<std::string> argv = {kBin + "/flashdraft",
                                     "launch",
                                     dir_->Join(job),
                                     "--workers",
                                     std::to_string(workers),
                                     "--out",
                                     out,
                                     "--max-restarts",
                                     std::to_string(max_restarts)};
    argv.insert(argv.end(), more.begin(), more.end());
    const int pid = processes_.Start(argv, out + ".log", env);
    for (int i = 0; i < 6000 && ReadSteps(out + "/steps.jsonl").size() < steps; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_GE(ReadSteps(out + "/steps.jsonl").size(), steps) << *ReadFile(out + ".log");
    return pid;
  }
  static int Port(const std::string& out) {
    int port = 0;
    std::ifstream(out + "/coordinator.port") >> port;
    return port;
  }
  static int Worker(const std::string& out, const std::string& id) {
    return FindProcess({"flashdraft-worker", absl::StrCat("127.0.0.1:", Port(out)), "--id " + id});
  }
  // The faulted run against the reference: every step to the bit, and the same drafter.
  void ExpectSameAsReference(const std::string& out) {
    const auto steps = ReadSteps(out + "/steps.jsonl");
    EXPECT_EQ(FirstDifferentStep(*reference_, steps), "") << *ReadFile(out + ".log");
    EXPECT_EQ(steps.size(), static_cast<size_t>(kSteps));
    auto a = ReadFile(dir_->Join("reference/drafter/model.safetensors"));
    auto b = ReadFile(out + "/drafter/model.safetensors");
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(*a == *b) << "the exported drafters differ";
  }
  static std::vector<int> WorldSizes(const std::string& out) {
    std::vector<int> sizes;
    for (const auto& e : ReadEvents(out + "/steps.jsonl")) sizes.push_back(e["world_size"]);
    return sizes;
  }

  static TempDir* dir_;
  static std::vector<nlohmann::json>* reference_;
  Processes processes_;
};
TempDir* ElasticTest::dir_ = nullptr;
std::vector<nlohmann::json>* ElasticTest::reference_ = nullptr;

// kill -9 one of 3 workers, then start it again by hand: it joins at a step boundary, receives
// the parameters and optimizer state from rank 0, W returns to 3 and the numbers still match.
TEST_F(ElasticTest, AKilledWorkerRestartedByHandRejoins) {
  const std::string out = dir_->Join("rejoin");
  const int launch = LaunchAndWait("job-min1.yaml", 3, out, 5);
  const int victim = Worker(out, "worker-1");
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  for (int i = 0; i < 1000 && WorldSizes(out).size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int again =
      processes_.Start({kBin + "/flashdraft-worker", "--coordinator",
                        absl::StrCat("127.0.0.1:", Port(out)), "--id", "worker-1-again"},
                       out + ".again.log");
  EXPECT_EQ(processes_.Wait(launch), 0) << *ReadFile(out + ".log");
  EXPECT_EQ(processes_.Wait(again), 0) << *ReadFile(out + ".again.log");
  ExpectSameAsReference(out);
  EXPECT_THAT(WorldSizes(out), ::testing::ElementsAre(3, 2, 3));
  EXPECT_THAT(*ReadFile(out + ".again.log"), HasSubstr("state synchronized from rank 0"));
  EXPECT_EQ(ReadSteps(out + "/steps.jsonl").back()["world_size"], 3);
}

// The same without a hand: `flashdraft launch` starts the crashed worker again after a back-off,
// and it rejoins.
TEST_F(ElasticTest, LaunchRestartsACrashedWorkerWhichRejoins) {
  const std::string out = dir_->Join("restarted");
  const int launch = LaunchAndWait("job-min1.yaml", 3, out, 5, /*max_restarts=*/1);
  const int victim = Worker(out, "worker-0");
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  EXPECT_EQ(processes_.Wait(launch), 0) << *ReadFile(out + ".log");
  ExpectSameAsReference(out);
  EXPECT_THAT(WorldSizes(out), ::testing::ElementsAre(3, 2, 3));
  const std::string log = *ReadFile(out + ".log");
  EXPECT_THAT(log, HasSubstr("worker-0 exited with code 137; starting it again in 1 s (1 of 1)"));
  EXPECT_THAT(log, HasSubstr("0 of 3 worker(s) failed, 1 restart(s)"));
}

// Killed at exact moments (FLASHDRAFT_FAULT, set for every worker, fires in the one with that
// rank): inside the gradient exchange of step 7, and in the middle of the checkpoint upload after
// step 50 (that checkpoint is skipped, the next one is written). Both finish to the same bits.
TEST_F(ElasticTest, KilledInsideTheExchangeOrTheCheckpointUpload) {
  for (const char* fault : {"reduce:step=7:rank=1", "upload:step=50:rank=0"}) {
    SCOPED_TRACE(fault);
    const std::string out = dir_->Join(absl::StrCat("fault-", std::string(fault).substr(0, 6)));
    const int launch = LaunchAndWait("job-min1.yaml", 3, out, 1, 0, {},
                                     {absl::StrCat("FLASHDRAFT_FAULT=", fault)});
    EXPECT_EQ(processes_.Wait(launch), 0) << *ReadFile(out + ".log");
    ExpectSameAsReference(out);
    const std::string log = *ReadFile(out + ".log");
    EXPECT_THAT(WorldSizes(out), ::testing::ElementsAre(3, 2)) << log;
    EXPECT_THAT(log, HasSubstr("FLASHDRAFT_FAULT: killing this worker"));
    if (std::string(fault).rfind("upload", 0) == 0) {
      EXPECT_THAT(log, HasSubstr("checkpoint skipped"));
      EXPECT_FALSE(std::filesystem::exists(out + "/checkpoints/step-00000050"));
      EXPECT_TRUE(std::filesystem::exists(out + "/checkpoints/step-00000100"));
    }
  }
}

// SIGSTOP a worker (hung, not dead): its peers block in the collective until the coordinator
// declares it lost after the heartbeat timeout and re-forms the group without it; the survivors
// abandon the blocked collective at once. After SIGCONT it finds its stream closed by the
// coordinator and its token gone: it can never ack or commit a stale step (the numbers prove it),
// and it joins again as a new worker.
TEST_F(ElasticTest, AHungWorkerIsLostAfterTheHeartbeatTimeoutAndJoinsAgainAsNew) {
  const std::string out = dir_->Join("hung");
  const int launch = LaunchAndWait("job-hung.yaml", 3, out, 5);
  const int victim = Worker(out, "worker-2");
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  for (int i = 0; i < 2000 && WorldSizes(out).size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(WorldSizes(out).size(), 2u) << "not declared lost";
  ASSERT_EQ(kill(victim, SIGCONT), 0);
  EXPECT_EQ(processes_.Wait(launch), 0) << *ReadFile(out + ".log");
  ExpectSameAsReference(out);
  const std::vector<int> sizes = WorldSizes(out);
  ASSERT_GE(sizes.size(), 2u);
  EXPECT_EQ(sizes[0], 3);
  EXPECT_EQ(sizes[1], 2);
  const std::string log = *ReadFile(out + ".log");
  EXPECT_THAT(log, HasSubstr("lost: no message for 3 s (heartbeat timeout)"));
  EXPECT_THAT(log, ::testing::ContainsRegex("worker-2 +\\] .*joining again"));
}

// min_workers 2 of 2: losing one pauses the job (Status and /metrics say what it waits for)
// instead of failing it; a new worker lets it go on, to the same numbers.
TEST_F(ElasticTest, BelowMinWorkersTheJobPausesUntilAWorkerComes) {
  const std::string out = dir_->Join("paused");
  const int launch = LaunchAndWait("job-min2.yaml", 2, out, 5);
  const int victim = Worker(out, "worker-0");
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  std::string status;
  for (int i = 0; i < 500 && status.find("state paused") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    status = RunCommand(absl::StrCat(kBin, "/flashdraft status 127.0.0.1:", Port(out))).output;
  }
  EXPECT_THAT(status, HasSubstr("state paused"));
  int metrics_port = 0;
  std::ifstream(out + "/metrics.port") >> metrics_port;
  auto scrape = HttpGet(metrics_port, "/metrics");
  ASSERT_TRUE(scrape.ok()) << scrape.status();
  EXPECT_THAT(scrape->body, HasSubstr("flashdraft_workers_missing 1\n"));
  const size_t before = ReadSteps(out + "/steps.jsonl").size();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(ReadSteps(out + "/steps.jsonl").size(), before) << "it trained while paused";
  const int replacement =
      processes_.Start({kBin + "/flashdraft-worker", "--coordinator",
                        absl::StrCat("127.0.0.1:", Port(out)), "--id", "replacement"},
                       out + ".replacement.log");
  EXPECT_EQ(processes_.Wait(launch), 0) << *ReadFile(out + ".log");
  EXPECT_EQ(processes_.Wait(replacement), 0) << *ReadFile(out + ".replacement.log");
  ExpectSameAsReference(out);
  EXPECT_THAT(WorldSizes(out), ::testing::ElementsAre(2, 2));
}

// kill -9 the coordinator under `launch --resume`: launch starts it again on the same port from its
// newest checkpoint, the workers join it again by themselves, the steps after the checkpoint are
// trained again, and the run finishes to the same bits.
TEST_F(ElasticTest, ACrashedCoordinatorIsRestartedAndItsWorkersJoinAgain) {
  const std::string out = dir_->Join("coordinator-crash");
  const int launch = LaunchAndWait("job-min1.yaml", 2, out, 60, /*max_restarts=*/1, {"--resume"});
  const int coordinator = FindProcess({"flashdraft-coordinator", out + "/job.yaml"});
  ASSERT_GT(coordinator, 0);
  ASSERT_EQ(kill(coordinator, SIGKILL), 0);
  EXPECT_EQ(processes_.Wait(launch), 0) << *ReadFile(out + ".log");
  const std::string log = *ReadFile(out + ".log");
  EXPECT_THAT(log, HasSubstr("coordinator exited with code 137; starting it again in 1 s"));
  EXPECT_THAT(log, HasSubstr("resuming from"));
  EXPECT_THAT(log, HasSubstr("joining again"));
  ExpectSameAsReference(out);
}

// SIGTERM to the coordinator: the step in flight commits, a checkpoint of it is written, every
// process exits 0. `launch --resume` with another number of workers then finishes the job to the
// same bits as the run that never stopped.
TEST_F(ElasticTest, SigtermCheckpointsAndResumeFinishesTheSameRun) {
  const std::string out = dir_->Join("stopped");
  const int launch = LaunchAndWait("job-min1.yaml", 2, out, 10);
  const int coordinator = FindProcess({"flashdraft-coordinator", out + "/job.yaml"});
  ASSERT_GT(coordinator, 0);
  ASSERT_EQ(kill(coordinator, SIGTERM), 0);
  EXPECT_EQ(processes_.Wait(launch), 0) << *ReadFile(out + ".log");
  const std::string log = *ReadFile(out + ".log");
  EXPECT_THAT(log, HasSubstr("terminated (SIGTERM): stopped after step"));
  EXPECT_THAT(log, HasSubstr("0 of 2 worker(s) failed"));
  const size_t done = ReadSteps(out + "/steps.jsonl").size();
  ASSERT_GT(done, 10u);
  ASSERT_LT(done, static_cast<size_t>(kSteps)) << "stopped too late to tell";
  EXPECT_TRUE(std::filesystem::exists(absl::StrFormat("%s/checkpoints/step-%08d", out, done)))
      << "no checkpoint of step " << done;
  EXPECT_FALSE(std::filesystem::exists(out + "/drafter")) << "exported an unfinished job";
  auto resumed = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir_->Join("job-min1.yaml"),
                                         " --workers 3 --resume --out ", out));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  ExpectSameAsReference(out);
}

}  // namespace
}  // namespace flashdraft
