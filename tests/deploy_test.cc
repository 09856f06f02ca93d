// Deployment files as shipped (deploy/): the systemd units pass `systemd-analyze verify` without a
// single warning, and their command lines, run as systemd would run them (instance names,
// environment files), train a secured job; the Slurm batch script trains a job on a real one-node
// Slurm cluster, checkpoints at SIGTERM and resumes when submitted again.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::FirstDifferentStep;
using ::flashdraft::testing::FreeTcpPort;
using ::flashdraft::testing::ReadEvents;
using ::flashdraft::testing::ReadSteps;
using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::ShellQuote;
using ::flashdraft::testing::StartProcess;
using ::flashdraft::testing::TempDir;
using ::flashdraft::testing::WaitForPortFile;
using ::testing::HasSubstr;

const std::string kBin = FLASHDRAFT_BIN_DIR;
const std::string kSource = FLASHDRAFT_SOURCE_DIR;
const std::string kUnits = kSource + "/deploy/systemd";

// A unit file with the binaries where this build put them.
std::string UnitWithBuildBinaries(const std::string& name) {
  return absl::StrReplaceAll(*ReadFile(kUnits + "/" + name), {{"/usr/local/bin", kBin}});
}

TEST(DeployTest, SystemdUnitsPassVerifyWithoutWarnings) {
  if (access("/usr/bin/systemd-analyze", X_OK) != 0) {
    GTEST_SKIP() << "needs systemd-analyze (package systemd)";
  }
  TempDir dir;
  std::string instances;
  for (const auto& [unit, instance] : std::vector<std::pair<std::string, std::string>>{
           {"flashdraft-coordinator@", "demo"}, {"flashdraft-worker@", "gpu0"}}) {
    ASSERT_TRUE(
        WriteFileAtomically(dir.Join(unit + ".service"), UnitWithBuildBinaries(unit + ".service"))
            .ok());
    std::filesystem::create_symlink(unit + ".service", dir.Join(unit + instance + ".service"));
    absl::StrAppend(&instances, " ", dir.Join(unit + instance + ".service"));
  }
  // An unknown key or a bad value only warns (exit 0): every line of output is a failure.
  auto r = RunCommand("systemd-analyze verify --man=no" + instances);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");
}

// The ExecStart= of a unit with %i, %H, the environment and the fixed paths filled in.
std::vector<std::string> ExecStart(const std::string& unit, const std::string& instance,
                                   const std::map<std::string, std::string>& env,
                                   const std::string& root) {
  std::string line;
  for (absl::string_view l : absl::StrSplit(*ReadFile(kUnits + "/" + unit), '\n')) {
    if (absl::ConsumePrefix(&l, "ExecStart=")) line = std::string(l);
  }
  EXPECT_FALSE(line.empty()) << unit;
  line = absl::StrReplaceAll(line, {{"%i", instance}, {"%H", "testhost"}});
  for (const auto& [name, value] : env) {
    line = absl::StrReplaceAll(line, {{"${" + name + "}", value}, {"$" + name, value}});
  }
  line = absl::StrReplaceAll(
      line,
      {{"/usr/local/bin", kBin}, {"/etc/flashdraft", root + "/etc"}, {"/run", root + "/run"}});
  return absl::StrSplit(line, ' ', absl::SkipEmpty());
}

// Shards (in `root`), a throwaway PKI (in `pki`) and a mutual-TLS job file (`path`, output_dir
// `root`/out) of `max_steps` steps.
void WriteSecuredJob(const std::string& root, const std::string& path, const std::string& pki,
                     int max_steps) {
  auto r =
      RunCommand(absl::StrCat(kBin, "/flashdraft make-shards --out ", root,
                              "/shards --samples 24 --seq 64 --vocab 48 --hidden 32 --seed 2"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = RunCommand(absl::StrCat(kSource, "/deploy/make-certs.sh ", pki));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  EXPECT_TRUE(
      WriteFileAtomically(
          path, absl::StrCat(
                    "name: deploy\noutput_dir: ", root, "/out\n",
                    "drafter: {num_hidden_layers: 1, block_size: 8, num_target_features: 2, "
                    "max_anchors: 8}\ndata: {source: shards, shards_dir: ",
                    root, "/shards, max_seq_len: 64}\n", "train: {seed: 1, max_steps: ", max_steps,
                    ", global_batch_size: 6}\n", "security: {tls_cert: ", pki,
                    "/coordinator.pem, tls_key: ", pki, "/coordinator.key, tls_ca: ", pki,
                    "/ca.pem, client_cert: ", pki, "/worker.pem, client_key: ", pki,
                    "/worker.key, token_file: ", pki, "/token}\n"))
          .ok());
}

TEST(DeployTest, TheUnitsCommandLinesTrainASecuredJob) {
  TempDir dir;
  const std::string root = dir.path();
  std::filesystem::create_directories(root + "/run/flashdraft-demo");
  WriteSecuredJob(root, root + "/etc/demo.yaml", root + "/etc/pki", 4);
  const std::vector<std::string> coordinator_argv = ExecStart(
      "flashdraft-coordinator@.service", "demo", {{"FLASHDRAFT_COORDINATOR_ARGS", ""}}, root);
  const int coordinator = StartProcess(coordinator_argv, root + "/coordinator.log");
  const int port = WaitForPortFile(root + "/run/flashdraft-demo/coordinator.port");
  ASSERT_GT(port, 0) << *ReadFile(root + "/coordinator.log");
  // worker.env as the example writes it, with this test's paths.
  std::map<std::string, std::string> env;
  for (absl::string_view l :
       absl::StrSplit(*ReadFile(kUnits + "/worker.env.example"), '\n', absl::SkipEmpty())) {
    if (l[0] == '#') continue;
    std::pair<std::string, std::string> kv = absl::StrSplit(l, absl::MaxSplits('=', 1));
    env[kv.first] = absl::StrReplaceAll(kv.second, {{"/etc/flashdraft", root + "/etc"}});
  }
  ASSERT_EQ(env.count("FLASHDRAFT_WORKER_ARGS"), 1u);
  env["FLASHDRAFT_COORDINATOR"] = absl::StrCat("127.0.0.1:", port);
  const int worker = StartProcess(ExecStart("flashdraft-worker@.service", "gpu0", env, root),
                                  root + "/worker.log");
  int status = 0;
  waitpid(coordinator, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << *ReadFile(root + "/coordinator.log");
  waitpid(worker, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << *ReadFile(root + "/worker.log");
  EXPECT_EQ(ReadSteps(root + "/out/steps.jsonl").size(), 4u);
  EXPECT_THAT(*ReadFile(root + "/coordinator.log"), HasSubstr("worker 'testhost-gpu0'"));
}

// A one-node Slurm cluster on loopback in a scratch directory: slurmctld and slurmd as root, no
// munge (auth/none), its own ports. Both daemons are stopped by their pid files on destruction,
// after every job of theirs is cancelled.
class OneNodeSlurm {
 public:
  // Empty when this machine can run it; otherwise what it needs.
  static std::string Unavailable() {
    for (const char* b : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch"}) {
      if (access(b, X_OK) != 0) {
        return absl::StrCat("needs Slurm (", b,
                            "; packages slurmctld slurmd slurm-client, scripts/setup.sh)");
      }
    }
    if (geteuid() != 0) return "needs root (slurmd starts jobs as their users)";
    return "";
  }

  explicit OneNodeSlurm(const std::string& dir) : dir_(dir) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    const std::string node = std::string(host).substr(0, std::string(host).find('.'));
    std::filesystem::create_directories(dir + "/state");
    std::filesystem::create_directories(dir + "/spool");
    EXPECT_TRUE(
        WriteFileAtomically(
            Conf(),
            absl::StrCat("ClusterName=flashdraft-test\n", "SlurmctldHost=", node, "(127.0.0.1)\n",
                         "SlurmctldPort=", FreeTcpPort(), "\nSlurmdPort=", FreeTcpPort(), "\n",
                         "AuthType=auth/none\nCredType=cred/none\n"
                         "SlurmUser=root\nSlurmdUser=root\n",
                         "StateSaveLocation=", dir, "/state\n", "SlurmdSpoolDir=", dir, "/spool\n",
                         "SlurmctldPidFile=", dir, "/slurmctld.pid\n", "SlurmdPidFile=", dir,
                         "/slurmd.pid\n", "SlurmctldLogFile=", dir, "/slurmctld.log\n",
                         "SlurmdLogFile=", dir, "/slurmd.log\n",
                         "ProctrackType=proctrack/linuxproc\n"
                         "TaskPlugin=task/none\n"
                         "SelectType=select/cons_tres\n"
                         "SelectTypeParameters=CR_Core\n"
                         "ReturnToService=2\nMpiDefault=none\n"
                         "JobCompType=jobcomp/none\n"
                         "AccountingStorageType=accounting_storage/none\n",
                         "NodeName=", node, " NodeAddr=127.0.0.1 CPUs=2\n",
                         "PartitionName=test Nodes=ALL Default=YES "
                         "MaxTime=INFINITE State=UP OverSubscribe=YES\n"))
            .ok());
    for (const char* daemon : {"/usr/sbin/slurmctld -c", "/usr/sbin/slurmd"}) {
      auto r = Run(daemon);
      EXPECT_EQ(r.exit_code, 0) << daemon << ": " << r.output << Logs();
    }
    for (int i = 0; i < 300 && !ready_; ++i) {
      ready_ = Run("sinfo -h -o %t").output == "idle\n";
      if (!ready_) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  ~OneNodeSlurm() {
    Run("scancel --full --user=root");
    for (const char* pid_file : {"slurmd.pid", "slurmctld.pid"}) {
      auto pid = ReadFile(dir_ + "/" + pid_file);
      int p = 0;
      if (!pid.ok() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*pid), &p) || p <= 1) continue;
      kill(p, SIGTERM);
      for (int i = 0; i < 100 && kill(p, 0) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      kill(p, SIGKILL);
    }
  }

  OneNodeSlurm(const OneNodeSlurm&) = delete;
  OneNodeSlurm& operator=(const OneNodeSlurm&) = delete;

  bool ready() const { return ready_; }
  // A command with this cluster's SLURM_CONF (and the rest of `env`, NAME=value ...).
  testing::CommandResult Run(const std::string& command, const std::string& env = "") const {
    return RunCommand(absl::StrCat("env SLURM_CONF=", Conf(), " ", env, " ", command, " 2>&1"));
  }
  // A job's state and exit code ("COMPLETED 0:0"), from scontrol.
  std::string JobState(const std::string& id) const {
    const std::string out = Run("scontrol show job " + id).output;
    std::string state, code;
    for (absl::string_view word : absl::StrSplit(out, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
      if (absl::ConsumePrefix(&word, "JobState=")) state = std::string(word);
      if (absl::ConsumePrefix(&word, "ExitCode=")) code = std::string(word);
    }
    return absl::StrCat(state, " ", code);
  }
  std::string Logs() const {
    return absl::StrCat("\n--- slurmctld.log\n", ReadFile(dir_ + "/slurmctld.log").value_or(""),
                        "\n--- slurmd.log\n", ReadFile(dir_ + "/slurmd.log").value_or(""));
  }

 private:
  std::string Conf() const { return dir_ + "/slurm.conf"; }

  std::string dir_;
  bool ready_ = false;
};

TEST(DeployTest, SlurmBatchScriptTrainsCheckpointsAtSigtermAndResumes) {
  if (std::string why = OneNodeSlurm::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  const std::string root = dir.path();
  // Long enough that the signal lands mid-job (~25 ms a step here).
  const int kSteps = 240;
  const std::string job = root + "/job.yaml";
  WriteSecuredJob(root, job, root + "/pki", kSteps);
  // The reference: the same job with `flashdraft launch`.
  auto reference = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", job, " --workers 2 --out ",
                                           root, "/reference 2>&1"));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;

  OneNodeSlurm slurm(root + "/slurm");
  ASSERT_TRUE(slurm.ready()) << slurm.Run("sinfo").output << slurm.Logs();
  const std::string submit =
      absl::StrCat("sbatch --ntasks=2 --time=10 --output=", root, "/slurm-%j.out ",
                   ShellQuote(kSource + "/deploy/slurm/flashdraft.sbatch"), " ", job);
  const std::string env = "FLASHDRAFT_BIN=" + kBin;
  auto first = slurm.Run("sbatch --parsable " + submit.substr(strlen("sbatch ")), env);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string id(absl::StripAsciiWhitespace(first.output));
  // SIGTERM to the batch script once training runs, as the time limit's --signal=B:TERM sends.
  const std::string steps = root + "/out/steps.jsonl";
  for (int i = 0; i < 1200 && ReadSteps(steps).size() < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(ReadSteps(steps).size(), 20u) << ReadFile(root + "/slurm-" + id + ".out").value_or("");
  auto cancel = slurm.Run("scancel --batch --signal=TERM " + id);
  ASSERT_EQ(cancel.exit_code, 0) << cancel.output;
  std::string state;
  for (int i = 0; i < 600; ++i) {
    state = slurm.JobState(id);
    if (!absl::StartsWith(state, "RUNNING") && !absl::StartsWith(state, "PENDING")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string first_log = ReadFile(root + "/slurm-" + id + ".out").value_or("");
  EXPECT_EQ(state, "COMPLETED 0:0") << first_log;
  EXPECT_THAT(first_log, HasSubstr("SIGTERM: checkpointing"));
  const size_t stopped_at = ReadSteps(steps).size();
  EXPECT_LT(stopped_at, static_cast<size_t>(kSteps)) << "the job ended before the signal";
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(root, "/out/checkpoints"))) << first_log;

  // Submitted again, it resumes from that checkpoint and finishes with the reference's numbers.
  auto second = slurm.Run("sbatch --wait " + submit.substr(strlen("sbatch ")), env);
  const std::string second_id(absl::StripAsciiWhitespace(
      absl::StripPrefix(absl::StripAsciiWhitespace(second.output), "Submitted batch job")));
  const std::string second_log = ReadFile(root + "/slurm-" + second_id + ".out").value_or("");
  ASSERT_EQ(second.exit_code, 0) << second.output << second_log << slurm.Logs();
  EXPECT_EQ(ReadEvents(steps, "resumed").size(), 1u);
  EXPECT_EQ(FirstDifferentStep(ReadSteps(steps), ReadSteps(root + "/reference/steps.jsonl")), "");
  // Two workers, one per task, named after the node and the task.
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string node = std::string(host).substr(0, std::string(host).find('.'));
  EXPECT_THAT(second_log, HasSubstr("worker '" + node + "-0'"));
  EXPECT_THAT(second_log, HasSubstr("worker '" + node + "-1'"));
  EXPECT_TRUE(std::filesystem::exists(root + "/out/drafter/model.safetensors")) << second_log;
}

}  // namespace
}  // namespace flashdraft
