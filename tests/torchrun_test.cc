// flashdraft under torchrun, for real: Debian's torchrun (`python3 -m torch.distributed.run
// --no_python`, python3-torch) starts `flashdraft run-rank` once per rank; the job trains to the
// same bits as `flashdraft launch --workers 3`. Restarts (--max_restarts) after a rank is killed
// and the elastic c10d rendezvous (--nnodes=1:2, where rank 0 serves the store itself) too. Every
// run is secured (mutual TLS and the job secret).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::FindProcess;
using ::flashdraft::testing::FirstDifferentStep;
using ::flashdraft::testing::FreeTcpPort;
using ::flashdraft::testing::ReadSteps;
using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::StartProcess;
using ::flashdraft::testing::TempDir;
using ::testing::HasSubstr;

const std::string kBin = FLASHDRAFT_BIN_DIR;
constexpr int kSteps = 120;

class TorchrunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string python = ::flashdraft::testing::ReferencePythonUnavailableReason();
    if (!python.empty()) {
      skip_ = new std::string(absl::StrCat(
          "needs torchrun: /usr/bin/python3 with torch (python3-torch; scripts/setup.sh --tests): ",
          python));
      return;
    }
    dir_ = new TempDir();
    auto r = RunCommand(absl::StrCat(kBin, "/flashdraft make-shards --out ", dir_->Join("shards"),
                                     " --samples 96 --seq 64 --vocab 48 --hidden 32 --seed 6"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = RunCommand(
        absl::StrCat(FLASHDRAFT_SOURCE_DIR, "/deploy/make-certs.sh ", dir_->Join("pki")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ::flashdraft::testing::SmallJob job;
    job.name = "torchrun";
    job.shards_dir = dir_->Join("shards");
    job.max_steps = kSteps;
    job.seed = 5;
    job.learning_rate = 0.01;
    job.extra =
        "cluster: {heartbeat_interval_seconds: 0.5, heartbeat_timeout_seconds: 30, "
        "join_timeout_seconds: 60, collective_timeout_seconds: 60}\n"
        "checkpoint: {every_steps: 40, keep_last: 2}\n";
    ASSERT_TRUE(WriteFileAtomically(dir_->Join("job.yaml"), SmallJobYaml(job)).ok());
    ASSERT_TRUE(
        WriteFileAtomically(
            dir_->Join("job-secure.yaml"),
            SmallJobYaml(job) + ::flashdraft::testing::PkiSecurityYaml(dir_->Join("pki")) + "\n")
            .ok());
    // The peer: launch with 3 workers on this host.
    r = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir_->Join("job.yaml"),
                                " --workers 3 --out ", dir_->Join("launch")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete skip_;
  }
  void SetUp() override {
    if (skip_ != nullptr) GTEST_SKIP() << *skip_;
  }

  // torchrun's command line: `torchrun_args`, then run-rank of the secured job into `out`.
  static std::vector<std::string> Torchrun(const std::vector<std::string>& torchrun_args,
                                           const std::string& out) {
    // Debian's torch 1.13 under Python 3.11 cannot parse its own default "0" of --redirects and
    // --tee (Python 3.11 no longer lists IntFlag's zero member); "1" (stdout) it can.
    std::vector<std::string> argv = {"/usr/bin/python3", "-m", "torch.distributed.run",
                                     "--redirects", "1", "--tee", "1"};
    argv.insert(argv.end(), torchrun_args.begin(), torchrun_args.end());
    argv.insert(argv.end(), {"--no_python", kBin + "/flashdraft", "run-rank",
                             dir_->Join("job-secure.yaml"), "--out", out});
    return argv;
  }
  // Runs it to its end; the exit code (-signal when killed), the output in <out>.log.
  static int Run(const std::vector<std::string>& argv, const std::string& out) {
    const int pid = StartProcess(argv, out + ".log");
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  // Every step and the exported drafter to the bit of `launch --workers 3`.
  static void ExpectSameAsLaunch(const std::string& out) {
    const auto steps = ReadSteps(out + "/steps.jsonl");
    EXPECT_EQ(steps.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(FirstDifferentStep(ReadSteps(dir_->Join("launch/steps.jsonl")), steps), "");
    auto a = ReadFile(dir_->Join("launch/drafter/model.safetensors"));
    auto b = ReadFile(out + "/drafter/model.safetensors");
    ASSERT_TRUE(a.ok() && b.ok()) << *ReadFile(out + ".log");
    EXPECT_TRUE(*a == *b) << "the exported drafters differ";
  }

  static TempDir* dir_;
  static std::string* skip_;
};
TempDir* TorchrunTest::dir_ = nullptr;
std::string* TorchrunTest::skip_ = nullptr;

TEST_F(TorchrunTest, ThreeRanksOnOneHostEqualLaunchBitForBit) {
  const std::string out = dir_->Join("static");
  const int code =
      Run(Torchrun({"--nproc_per_node", "3", "--master_port", std::to_string(FreeTcpPort())}, out),
          out);
  const std::string log = *ReadFile(out + ".log");
  ASSERT_EQ(code, 0) << log;
  EXPECT_THAT(log, HasSubstr("rank 0 of 3 (attempt 0): the coordinator listens on 127.0.0.1:"));
  EXPECT_THAT(log, HasSubstr("rank 2 of 3 (attempt 0): worker joining 127.0.0.1:"));
  EXPECT_THAT(log, HasSubstr("security: mutual TLS, job token"));
  ExpectSameAsLaunch(out);
}

// kill -9 rank 2's worker mid-run: torchrun stops the other ranks (the coordinator checkpoints
// on SIGTERM) and starts all three again; the coordinator of attempt 1 resumes.
TEST_F(TorchrunTest, ARankKilledMidRunIsRestartedAndTheJobStillEqualsLaunch) {
  const std::string out = dir_->Join("restart");
  const int pid =
      StartProcess(Torchrun({"--nproc_per_node", "3", "--max_restarts", "1", "--monitor_interval",
                             "0.5", "--master_port", std::to_string(FreeTcpPort())},
                            out),
                   out + ".log");
  for (int i = 0; i < 6000 && ReadSteps(out + "/steps.jsonl").size() < 30; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int port = 0;
  std::ifstream(out + "/coordinator.port") >> port;
  const int victim =
      FindProcess({"flashdraft-worker", absl::StrCat("127.0.0.1:", port), "--id worker-2"});
  ASSERT_GT(victim, 0) << *ReadFile(out + ".log");
  ASSERT_LT(ReadSteps(out + "/steps.jsonl").size(), static_cast<size_t>(kSteps))
      << "the job ended before the kill";
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string log = *ReadFile(out + ".log");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
  EXPECT_THAT(log, HasSubstr("rank 0 of 3 (attempt 1): the coordinator listens on"));
  EXPECT_THAT(log, HasSubstr("resuming from"));
  ExpectSameAsLaunch(out);
}

// The elastic rendezvous (--nnodes=1:2, c10d): no agent store, so rank 0 serves the store on
// MASTER_PORT itself; one node shows up, and its three ranks train the same bits.
TEST_F(TorchrunTest, AnElasticRendezvousOfOneNodeEqualsLaunch) {
  const std::string out = dir_->Join("elastic");
  const int code =
      Run(Torchrun({"--nnodes", "1:2", "--nproc_per_node", "3", "--rdzv_backend", "c10d",
                    "--rdzv_endpoint", absl::StrCat("127.0.0.1:", FreeTcpPort()), "--rdzv_conf",
                    "last_call_timeout=1"},
                   out),
          out);
  const std::string log = *ReadFile(out + ".log");
  ASSERT_EQ(code, 0) << log;
  EXPECT_THAT(log, HasSubstr("rank 0 of 3 (attempt 0)"));
  ExpectSameAsLaunch(out);
}

}  // namespace
}  // namespace flashdraft
