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
#include <unistd.h>

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
using ::flashdraft::testing::WaitForPortFile;
using ::testing::HasSubstr;

const std::string kBin = FLASHDRAFT_BIN_DIR;
constexpr int kSteps = 150;

// `heartbeat_timeout` is short only where a test waits for it (the hung worker): elsewhere a
// loaded CI machine must not make a healthy worker look lost. `cluster` adds cluster settings.
std::string JobYaml(const std::string& shards, int min_workers, int heartbeat_timeout,
                    const std::string& cluster = "", const std::string& output_dir = "unused") {
  ::flashdraft::testing::SmallJob job;
  job.name = "elastic";
  job.output_dir = output_dir;
  job.shards_dir = shards;
  job.max_steps = kSteps;
  job.seed = 3;
  job.learning_rate = 0.01;
  job.extra = absl::StrCat("cluster: {min_workers: ", min_workers,
                           ", max_workers: 3, heartbeat_interval_seconds: 0.5, "
                           "heartbeat_timeout_seconds: ",
                           heartbeat_timeout,
                           ", join_timeout_seconds: 60, "
                           "collective_timeout_seconds: 60",
                           cluster, "}\n", "checkpoint: {every_steps: 50, keep_last: 2}\n");
  return ::flashdraft::testing::SmallJobYaml(job);
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
    ASSERT_TRUE(
        WriteFileAtomically(dir_->Join("job-stall.yaml"),
                            JobYaml(dir_->Join("shards"), 1, 30, ", stall_timeout_seconds: 3"))
            .ok());
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
// step 50 (that checkpoint is skipped, the next one is written); or alive but sending that upload
// with a bad chunk (the coordinator drops it as failed, skips the checkpoint, and it joins again).
// All finish to the same bits.
TEST_F(ElasticTest, KilledInsideTheExchangeOrTheCheckpointUpload) {
  for (const char* fault :
       {"reduce:step=7:rank=1", "upload:step=50:rank=0", "corrupt:step=50:rank=0"}) {
    SCOPED_TRACE(fault);
    const std::string out = dir_->Join(absl::StrCat("fault-", std::string(fault).substr(0, 6)));
    const int launch = LaunchAndWait("job-min1.yaml", 3, out, 1, 0, {},
                                     {absl::StrCat("FLASHDRAFT_FAULT=", fault)});
    EXPECT_EQ(processes_.Wait(launch), 0) << *ReadFile(out + ".log");
    ExpectSameAsReference(out);
    const std::string log = *ReadFile(out + ".log");
    const std::vector<int> sizes = WorldSizes(out);
    ASSERT_GE(sizes.size(), 2u) << log;
    EXPECT_EQ(sizes[0], 3);
    EXPECT_EQ(sizes[1], 2);
    if (std::string(fault).rfind("corrupt", 0) == 0) {
      // A broken upload (the process lives on): its worker leaves as failed, joins again as new.
      EXPECT_THAT(log, HasSubstr("failed: sent a bad checkpoint upload"));
      EXPECT_THAT(log, HasSubstr("CRC"));
    } else {
      EXPECT_EQ(sizes.size(), 2u) << log;
      EXPECT_THAT(log, HasSubstr("FLASHDRAFT_FAULT: killing this worker"));
    }
    if (std::string(fault).rfind("reduce", 0) != 0) {
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

// Leaving on purpose is not a failure: `flashdraft status --drain RANK` makes that worker leave at
// the next step boundary, SIGTERM to a worker does the same; the group re-forms without them
// (no "lost"), they exit 0 and are not restarted, and the numbers still match.
TEST_F(ElasticTest, DrainedAndSigtermedWorkersLeaveAtAStepBoundary) {
  const std::string out = dir_->Join("drained");
  const int launch = LaunchAndWait("job-min1.yaml", 3, out, 1, /*max_restarts=*/1);
  const std::string address = absl::StrCat("127.0.0.1:", Port(out));
  auto bad = RunCommand(absl::StrCat(kBin, "/flashdraft status ", address, " --drain 7"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("no worker has rank 7 in membership epoch 1 (3 worker(s))"));
  auto drained = RunCommand(absl::StrCat(kBin, "/flashdraft status ", address, " --drain 1"));
  ASSERT_EQ(drained.exit_code, 0) << drained.output << *ReadFile(out + ".log");
  EXPECT_THAT(drained.output, ::testing::ContainsRegex("worker 'worker-.' \\(rank 1\\) leaves "
                                                       "after step"));
  const std::string drained_id = drained.output.substr(drained.output.find("worker-"), 8);
  for (int i = 0; i < 1000 && WorldSizes(out).size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int sigtermed = -1;
  for (const char* id : {"worker-0", "worker-1", "worker-2"}) {
    if (id != drained_id && sigtermed < 0) sigtermed = Worker(out, id);
  }
  ASSERT_GT(sigtermed, 0);
  ASSERT_EQ(kill(sigtermed, SIGTERM), 0);
  EXPECT_EQ(processes_.Wait(launch), 0) << *ReadFile(out + ".log");
  ExpectSameAsReference(out);
  EXPECT_THAT(WorldSizes(out), ::testing::ElementsAre(3, 2, 1));
  const std::string log = *ReadFile(out + ".log");
  EXPECT_THAT(log, HasSubstr("0 of 3 worker(s) failed, 0 restart(s)"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr(") lost:")));
  const auto events = ReadEvents(out + "/steps.jsonl");
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1]["changes"][0]["worker"], drained_id);
  EXPECT_THAT(events[1]["changes"][0]["why"].get<std::string>(),
              HasSubstr("left: drained (flashdraft status --drain)"));
  EXPECT_THAT(events[2]["changes"][0]["why"].get<std::string>(),
              HasSubstr("left: the worker asked to leave (SIGTERM)"));
}

// A training thread that stops for good (a hung kernel) while its process still sends heartbeats:
// the heartbeats carry its progress, so the coordinator declares it lost after
// cluster.stall_timeout_seconds and the rest go on; the stuck worker, its stream gone, exits
// (code 3) instead of hanging forever, and launch starts it again.
TEST_F(ElasticTest, AStuckTrainingThreadIsLostAndItsProcessExits) {
  const std::string out = dir_->Join("stalled");
  const int launch = LaunchAndWait("job-stall.yaml", 3, out, 1, /*max_restarts=*/1, {},
                                   {"FLASHDRAFT_FAULT=stall:step=7:rank=1"});
  EXPECT_EQ(processes_.Wait(launch), 0) << *ReadFile(out + ".log");
  ExpectSameAsReference(out);
  const std::string log = *ReadFile(out + ".log");
  const std::vector<int> sizes = WorldSizes(out);
  ASSERT_GE(sizes.size(), 2u) << log;
  EXPECT_EQ(sizes[0], 3);
  EXPECT_EQ(sizes[1], 2);
  EXPECT_THAT(log, HasSubstr("its training thread has been stuck in forward of step 7"));
  EXPECT_THAT(log, HasSubstr("exiting (code 3) so that a supervisor starts this worker again"));
}

// A network namespace joined to the host by a veth pair (private addresses, only inside this
// test's namespace and link). The namespaces and links are removed whatever happens.
class NetworkNamespace {
 public:
  NetworkNamespace() {
    const int id = static_cast<int>(getpid() % 200) + 20;
    name_ = absl::StrCat("fdtest", getpid());
    host_link_ = absl::StrCat("fdh", getpid());
    host_address_ = absl::StrCat("10.213.", id, ".1");
    inside_address_ = absl::StrCat("10.213.", id, ".2");
    const std::string inside_link = absl::StrCat("fdn", getpid());
    for (const std::string& command :
         {absl::StrCat("ip netns add ", name_),
          absl::StrCat("ip link add ", host_link_, " type veth peer name ", inside_link),
          absl::StrCat("ip link set ", inside_link, " netns ", name_),
          absl::StrCat("ip addr add ", host_address_, "/30 dev ", host_link_),
          absl::StrCat("ip link set ", host_link_, " up"),
          absl::StrCat("ip netns exec ", name_, " ip addr add ", inside_address_, "/30 dev ",
                       inside_link),
          absl::StrCat("ip netns exec ", name_, " ip link set ", inside_link, " up"),
          absl::StrCat("ip netns exec ", name_, " ip link set lo up")}) {
      auto r = RunCommand(command + " 2>&1");
      if (r.exit_code != 0) {
        error_ = absl::StrCat("`", command, "` failed: ", r.output);
        return;
      }
    }
  }
  ~NetworkNamespace() {
    RunCommand(absl::StrCat("ip netns del ", name_, " 2>/dev/null"));
    RunCommand(absl::StrCat("ip link del ", host_link_, " 2>/dev/null"));
  }
  // Empty when the namespace is up; why not otherwise.
  const std::string& error() const { return error_; }
  const std::string& name() const { return name_; }
  const std::string& host_address() const { return host_address_; }
  // Cuts the namespace off the host.
  bool Cut() const { return RunCommand("ip link set " + host_link_ + " down").exit_code == 0; }

 private:
  std::string name_, host_link_, host_address_, inside_address_, error_;
};

// A worker whose network is cut (it runs in its own network namespace, and the test takes the
// link down): no stream breaks, nothing is said, it just goes silent — lost after the heartbeat
// timeout; the others re-form without it and finish to the same numbers.
TEST_F(ElasticTest, AWorkerWhoseNetworkIsCutIsLostAfterTheHeartbeatTimeout) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create a network namespace (ip netns)";
  NetworkNamespace ns;
  if (!ns.error().empty())
    GTEST_SKIP() << "needs /usr/sbin/ip, netns and veth links: " << ns.error();
  const std::string out = dir_->Join("network-cut");
  std::filesystem::create_directories(out);
  // Other hosts (the namespace) reach it in plaintext: allowed only by security.insecure.
  ASSERT_TRUE(WriteFileAtomically(out + "/job.yaml", JobYaml(dir_->Join("shards"), 1, 3,
                                                             ", listen: '0.0.0.0:0'", out) +
                                                         "security: {insecure: true}\n")
                  .ok());
  const int coordinator =
      processes_.Start({kBin + "/flashdraft-coordinator", "--job", out + "/job.yaml", "--port-file",
                        out + "/coordinator.port"},
                       out + ".log");
  ASSERT_GT(WaitForPortFile(out + "/coordinator.port", 10), 0) << *ReadFile(out + ".log");
  const std::string address = absl::StrCat(ns.host_address(), ":", Port(out));
  // Rank 0 of the last epoch exports the drafter: a host worker, whatever the join order.
  processes_.Start({"/usr/sbin/ip", "netns", "exec", ns.name(), kBin + "/flashdraft-worker",
                    "--coordinator", address, "--id", "cut-off"},
                   out + ".cut-off.log");
  for (const char* id : {"host-0", "host-1"}) {
    processes_.Start({kBin + "/flashdraft-worker", "--coordinator", address, "--id", id},
                     absl::StrCat(out, ".", id, ".log"));
  }
  // All three train (a late joiner makes a second epoch), a few steps, then the cut.
  for (int i = 0; i < 6000 && (WorldSizes(out).empty() || WorldSizes(out).back() != 3 ||
                               ReadSteps(out + "/steps.jsonl").size() < 3);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(WorldSizes(out).back(), 3)
      << *ReadFile(out + ".log") << "\n--- the worker in the namespace:\n"
      << ReadFile(out + ".cut-off.log").value_or("(no log)");
  ASSERT_LT(ReadSteps(out + "/steps.jsonl").size(), static_cast<size_t>(kSteps / 2));
  ASSERT_TRUE(ns.Cut());
  EXPECT_EQ(processes_.Wait(coordinator), 0) << *ReadFile(out + ".log");
  ExpectSameAsReference(out);
  const std::vector<int> sizes = WorldSizes(out);
  ASSERT_GE(sizes.size(), 2u);
  EXPECT_EQ(sizes.back(), 2);
  EXPECT_EQ(sizes[sizes.size() - 2], 3);
  EXPECT_THAT(*ReadFile(out + ".log"),
              ::testing::ContainsRegex("'cut-off' \\(rank . of epoch .\\) lost: no message for "
                                       "3 s \\(heartbeat timeout\\)"));
  const auto recovered = ReadEvents(out + "/steps.jsonl", "recovered");
  ASSERT_FALSE(recovered.empty());
  std::printf("recovery after the cut: %.2f s after the loss was declared\n",
              recovered.back()["recovery_seconds"].get<double>());
}

}  // namespace
}  // namespace flashdraft
