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
#include <regex>
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
using ::flashdraft::testing::HostBlasKernel;
using ::flashdraft::testing::PkiSecurityYaml;
using ::flashdraft::testing::ReadEvents;
using ::flashdraft::testing::ReadSteps;
using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::ShellQuote;
using ::flashdraft::testing::SmallJob;
using ::flashdraft::testing::SmallJobYaml;
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
  for (const auto& [unit, instance] :
       std::vector<std::pair<std::string, std::string>>{{"flashdraft-coordinator@", "demo"},
                                                        {"flashdraft-worker@", "gpu0"},
                                                        {"flashdraft-feeder@", "gpu1"}}) {
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
// `root`/out) of `max_steps` steps, pinned to `blas_kernel` (train.blas_kernel) when one is given.
void WriteSecuredJob(const std::string& root, const std::string& path, const std::string& pki,
                     int max_steps, const std::string& blas_kernel = "") {
  auto r =
      RunCommand(absl::StrCat(kBin, "/flashdraft make-shards --out ", root,
                              "/shards --samples 24 --seq 64 --vocab 48 --hidden 32 --seed 2"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = RunCommand(absl::StrCat(kSource, "/deploy/make-certs.sh ", pki));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  SmallJob job;
  job.name = "deploy";
  job.output_dir = root + "/out";
  job.shards_dir = root + "/shards";
  job.max_steps = max_steps;
  job.blas_kernel = blas_kernel;
  job.extra = PkiSecurityYaml(pki);
  EXPECT_TRUE(WriteFileAtomically(path, SmallJobYaml(job)).ok());
}

TEST(DeployTest, TheUnitsCommandLinesTrainASecuredJob) {
  TempDir dir;
  const std::string root = dir.path();
  std::filesystem::create_directories(root + "/run/flashdraft-demo");
  std::filesystem::create_directories(root + "/run/flashdraft-worker-gpu0");
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
  // The worker's metrics port where `flashdraft probe --port-file` finds it (docs/DEPLOY.md).
  EXPECT_GT(WaitForPortFile(root + "/run/flashdraft-worker-gpu0/metrics.port", 1), 0);
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
                         // 4 CPUs whatever the machine has, so that 3 tasks (a feeder and 2
                         // workers) fit the one node.
                         "SlurmdParameters=config_overrides\n", "NodeName=", node,
                         " NodeAddr=127.0.0.1 CPUs=4\n",
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
  // The job pins this machine's own OpenBLAS kernel: the batch script passes it to the coordinator
  // and the workers, so they match the reference whatever OPENBLAS_CORETYPE this shell has.
  const absl::StatusOr<std::string> kernel = HostBlasKernel(kBin);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  WriteSecuredJob(root, job, root + "/pki", kSteps, *kernel);
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
    // COMPLETING: the batch step ended, Slurm is still cleaning up.
    if (!absl::StartsWith(state, "RUNNING") && !absl::StartsWith(state, "PENDING") &&
        !absl::StartsWith(state, "COMPLETING")) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string first_log = ReadFile(root + "/slurm-" + id + ".out").value_or("");
  EXPECT_EQ(state, "COMPLETED 0:0") << first_log;
  EXPECT_THAT(first_log, HasSubstr("SIGTERM: checkpointing"));
  if (!kernel->empty()) {
    EXPECT_THAT(first_log, HasSubstr("OPENBLAS_CORETYPE=" + *kernel + " (train.blas_kernel)"));
  }
  EXPECT_THAT(first_log, HasSubstr(absl::StrCat("output in ", root, "/out (Prometheus: ", root,
                                                "/out/prometheus/targets.json)")));
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

  // A broken job fails the batch job at once, saying so, before a coordinator or worker starts.
  ASSERT_TRUE(WriteFileAtomically(root + "/broken.yaml", "train: {max_steps: -1}\n").ok());
  auto broken =
      slurm.Run(absl::StrCat("sbatch --wait --ntasks=1 --time=2 --output=", root, "/broken.out ",
                             ShellQuote(kSource + "/deploy/slurm/flashdraft.sbatch"), " ", root,
                             "/broken.yaml"),
                env);
  EXPECT_NE(broken.exit_code, 0) << broken.output;
  const std::string broken_log = ReadFile(root + "/broken.out").value_or("");
  EXPECT_THAT(broken_log, HasSubstr("train.max_steps"));
  EXPECT_THAT(broken_log, HasSubstr("is not a job this script can run"));
  EXPECT_THAT(broken_log, ::testing::Not(HasSubstr("coordinator on")));
}

// FLASHDRAFT_FEEDERS=1 of 3 tasks: one task runs a target feeder with its own certificate
// (deploy/make-certs.sh --feeder <node>), which the workers verify when they fetch their shards;
// the other two train. The job is secured (mutual TLS, the job secret) and ends exported.
TEST(DeployTest, SlurmBatchScriptRunsAFeederTaskBesideTheWorkers) {
  if (std::string why = OneNodeSlurm::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  const std::string root = dir.path();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string node = std::string(host).substr(0, std::string(host).find('.'));
  const std::string pki = root + "/pki";
  auto made = RunCommand(absl::StrCat(kSource, "/deploy/make-certs.sh ", pki, " --feeder ", node));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  made = RunCommand(absl::StrCat(kBin, "/flashdraft make-tiny-target --out ", root,
                                 "/target --steps 150 --merges 256 --hidden 64 --layers 4"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const absl::StatusOr<std::string> kernel = HostBlasKernel(kBin);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  const std::string job = root + "/job.yaml";
  ASSERT_TRUE(WriteFileAtomically(
                  job, absl::StrCat(
                           "name: fed\noutput_dir: ", root, "/out\n", "target: {path: ", root,
                           "/target, layer_ids: [1, 3]}\n",
                           "drafter: {num_hidden_layers: 1, block_size: 8, num_target_features: 2, "
                           "max_anchors: 16}\n",
                           "data: {source: target, jsonl: ", root,
                           "/target/chats.jsonl, max_seq_len: 256, regenerate: false}\n",
                           "train: {seed: 0, max_steps: 8, global_batch_size: 8",
                           kernel->empty() ? "" : ", blas_kernel: " + *kernel, "}\n",
                           "checkpoint: {every_steps: 0}\n", PkiSecurityYaml(pki)))
                  .ok());
  OneNodeSlurm slurm(root + "/slurm");
  ASSERT_TRUE(slurm.ready()) << slurm.Run("sinfo").output << slurm.Logs();
  auto run = slurm.Run(
      absl::StrCat("timeout 600 sbatch --wait --ntasks=3 --time=10 --output=", root, "/slurm.out ",
                   ShellQuote(kSource + "/deploy/slurm/flashdraft.sbatch"), " ", job),
      absl::StrCat("FLASHDRAFT_BIN=", kBin, " FLASHDRAFT_FEEDERS=1 FLASHDRAFT_FEEDER_PKI=", pki));
  const std::string log = ReadFile(root + "/slurm.out").value_or("");
  ASSERT_EQ(run.exit_code, 0) << run.output << log << slurm.Logs();
  EXPECT_THAT(log, HasSubstr("2 worker(s), 1 feeder(s)"));
  EXPECT_THAT(log, HasSubstr("feeder 'feeder-" + node + "-0' joined (serving at " + node + ":"));
  EXPECT_THAT(log, HasSubstr("every shard's features are computed by a feeder"));
  EXPECT_THAT(log, HasSubstr("shut down by the coordinator: job finished"));
  EXPECT_EQ(ReadSteps(root + "/out/steps.jsonl").size(), 8u) << log;
  EXPECT_TRUE(std::filesystem::exists(root + "/out/drafter/model.safetensors")) << log;
}

// A scratch "Proxmox host" on this machine: the pct and ssh stand-ins of tests/deploy first on
// PATH, containers (real LXC, systemd inside) under `dir`/ct, a bridge of its own. Every container
// and the bridge are removed on destruction, whatever the test did.
class PveStandIn {
 public:
  static std::string Unavailable() {
    if (geteuid() != 0) return "needs root (privileged LXC containers, a bridge)";
    for (const char* b :
         {"/usr/bin/lxc-start", "/usr/bin/lxc-attach", "/usr/sbin/ip", "/lib/systemd/systemd"}) {
      if (access(b, X_OK) != 0) {
        return absl::StrCat("needs ", b, " (packages lxc, iproute2, systemd; scripts/setup.sh)");
      }
    }
    return "";
  }

  explicit PveStandIn(const std::string& dir)
      : dir_(dir), bridge_(absl::StrCat("fdt", getpid() % 100000)) {
    std::filesystem::create_directories(dir + "/ct");
    auto r = RunCommand(
        absl::StrCat("ip link add ", bridge_, " type bridge && ip link set ", bridge_, " up 2>&1"));
    bridge_ok_ = r.exit_code == 0;
    EXPECT_TRUE(bridge_ok_) << r.output;
  }

  ~PveStandIn() {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_ + "/ct", ec)) {
      if (e.path().extension() == ".conf") Run("pct destroy " + e.path().stem().string());
    }
    RunCommand("ip link del " + bridge_ + " 2>/dev/null");
  }

  PveStandIn(const PveStandIn&) = delete;
  PveStandIn& operator=(const PveStandIn&) = delete;

  bool ok() const { return bridge_ok_; }
  const std::string& bridge() const { return bridge_; }
  std::string ct_dir() const { return dir_ + "/ct"; }
  std::string ssh_log() const { return dir_ + "/ssh.log"; }
  // A file inside a container, read from its root filesystem.
  std::string ContainerFile(int id, const std::string& path) const {
    return ReadFile(absl::StrCat(dir_, "/ct/", id, "/rootfs", path)).value_or("");
  }
  testing::CommandResult Run(const std::string& command) const {
    return RunCommand(absl::StrCat("env PATH=", kSource, "/tests/deploy:$PATH PCT_ROOT=", dir_,
                                   "/ct SSH_STANDIN_LOG=", ssh_log(), " ", command, " 2>&1"));
  }
  std::string Exec(int id, const std::string& command) const {
    return std::string(
        absl::StripAsciiWhitespace(Run(absl::StrCat("pct exec ", id, " -- ", command)).output));
  }

 private:
  std::string dir_;
  std::string bridge_;
  bool bridge_ok_ = false;
};

// deploy/proxmox end to end on real LXC containers: a broken job is refused before anything
// reaches the host; the job trains across three containers (Gloo on their eth0) to the numbers
// `flashdraft launch` gets on loopback; a second deploy changes nothing; a changed job is rolled
// out (the coordinator resumes it) and rolled back; stop takes every unit down.
TEST(DeployTest, ProxmoxDeploysTheJobIntoLxcContainers) {
  if (std::string why = PveStandIn::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  const std::string root = dir.path();
  PveStandIn pve(root);
  ASSERT_TRUE(pve.ok());
  auto made = RunCommand(absl::StrCat(kBin, "/flashdraft make-shards --out ", root,
                                      "/data/shards --samples 24 --seq 64 --vocab 48 "
                                      "--hidden 32 --seed 2"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string cluster = root + "/cluster.yaml";
  ASSERT_TRUE(WriteFileAtomically(
                  cluster, absl::StrCat("host: root@pve-test\n"
                                        "template: local:vztmpl/debian-12-standard_12.7-1_amd64."
                                        "tar.zst\nbridge: ",
                                        pve.bridge(), "\npve_config_dir: ", pve.ct_dir(),
                                        "\nshm_gb: 1\ncontainers:\n"
                                        "  - {id: 300, role: coordinator, ip: 10.213.7.10/24, "
                                        "mounts: [{host: ",
                                        root, "/data, path: /data}]}\n",
                                        "  - {id: 301, role: worker, ip: 10.213.7.11/24}\n"
                                        "  - {id: 302, role: worker, ip: 10.213.7.12/24}\n"))
                  .ok());
  // The job pins this machine's own OpenBLAS kernel, which reaches the units in the containers
  // through their env files (a container inherits no environment from here); the reference, run
  // here by launch, gets it from the same job.
  const absl::StatusOr<std::string> kernel = HostBlasKernel(kBin);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  auto write_job = [&](const std::string& path, int steps) {
    SmallJob job;
    job.name = "pvetest";
    job.shards_dir = "/data/shards";
    job.max_steps = steps;
    job.blas_kernel = *kernel;
    ASSERT_TRUE(WriteFileAtomically(path, SmallJobYaml(job)).ok());
  };
  const std::string job = root + "/job.yaml";
  write_job(job, 120);
  const std::string pve_cmd = absl::StrCat(kSource, "/deploy/proxmox/flashdraft-pve ");
  const std::string args = absl::StrCat(cluster, " ", job, " --state ", root, "/state");
  const std::string env = "FLASHDRAFT_BIN=" + kBin + " ";

  // A broken job: refused, naming the file and the field, before anything reaches the host.
  const std::string broken = root + "/broken.yaml";
  ASSERT_TRUE(WriteFileAtomically(broken, "name: pvetest\ntrain: {max_steps: -3}\n").ok());
  auto refused = pve.Run(absl::StrCat(env, pve_cmd, "deploy ", cluster, " ", broken));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.output, HasSubstr("broken.yaml"));
  EXPECT_THAT(refused.output, HasSubstr("train.max_steps"));
  EXPECT_FALSE(std::filesystem::exists(pve.ssh_log())) << *ReadFile(pve.ssh_log());

  // The reference: the same job on loopback.
  auto reference =
      RunCommand(absl::StrCat(kBin, "/flashdraft launch ", job, " --workers 2 --out ", root,
                              "/reference --set data.shards_dir=", root, "/data/shards 2>&1"));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;

  auto first = pve.Run(absl::StrCat(env, pve_cmd, "deploy ", args, " --join-timeout 120"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_THAT(first.output, HasSubstr("/metrics: http://10.213.7.10:9400/metrics"));
  // Trained across the containers to the end; the coordinator exported the drafter on its disk.
  const std::string coordinator_unit = "flashdraft-coordinator@pvetest";
  for (int i = 0; i < 600 && pve.Exec(300, "systemctl is-active " + coordinator_unit) == "active";
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const std::string journal = pve.Exec(300, "journalctl --no-pager -u " + coordinator_unit);
  EXPECT_EQ(pve.Exec(300, "systemctl is-active " + coordinator_unit), "inactive") << journal;
  EXPECT_EQ(pve.Exec(300, "systemctl show -p Result --value " + coordinator_unit), "success")
      << journal;
  const std::string out = absl::StrCat(pve.ct_dir(), "/300/rootfs/var/lib/flashdraft/pvetest");
  EXPECT_EQ(FirstDifferentStep(ReadSteps(out + "/steps.jsonl"),
                               ReadSteps(root + "/reference/steps.jsonl")),
            "")
      << journal;
  EXPECT_TRUE(std::filesystem::exists(out + "/drafter/model.safetensors")) << journal;
  EXPECT_THAT(journal, HasSubstr("worker 'flashdraft-301-cpu'"));
  EXPECT_THAT(journal, HasSubstr("worker 'flashdraft-302-cpu'"));
  if (!kernel->empty()) {
    const std::string pinned = "OPENBLAS_CORETYPE=" + *kernel + "\n";
    EXPECT_THAT(pve.ContainerFile(300, "/etc/flashdraft/pvetest.env"), HasSubstr(pinned));
    for (int id : {301, 302}) {
      EXPECT_THAT(pve.ContainerFile(id, "/etc/flashdraft/worker.env"), HasSubstr(pinned)) << id;
    }
  }
  for (int id : {301, 302}) {
    EXPECT_EQ(pve.Exec(id, "systemctl show -p NRestarts --value flashdraft-worker@cpu"), "0")
        << pve.Exec(id, "journalctl --no-pager -u flashdraft-worker@cpu");
    // Gradients went over the containers' own network.
    EXPECT_THAT(pve.Exec(id, "journalctl --no-pager -u flashdraft-worker@cpu"),
                HasSubstr("joined as"));
  }

  // Again: nothing changes, nothing restarts.
  auto second = pve.Run(absl::StrCat(env, pve_cmd, "deploy ", args, " --join-timeout 30"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_THAT(second.output, HasSubstr(" 0 change(s)"));
  EXPECT_THAT(second.output, ::testing::Not(HasSubstr("  changed ")));
  EXPECT_EQ(pve.Exec(300, "journalctl --no-pager -u " + coordinator_unit +
                              " | grep -c 'Started flashdraft-coordinator'"),
            "1");

  // A longer job: only the coordinator's bundle changes; it resumes and the workers come back.
  write_job(job, 150);
  auto third = pve.Run(absl::StrCat(env, pve_cmd, "deploy ", args, " --join-timeout 120"));
  ASSERT_EQ(third.exit_code, 0) << third.output;
  EXPECT_THAT(third.output, HasSubstr("changed    CT 300: install"));
  EXPECT_THAT(third.output, HasSubstr("unchanged  CT 301: install"));
  for (int i = 0; i < 600 && ReadSteps(out + "/steps.jsonl").size() < 150; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(ReadSteps(out + "/steps.jsonl").size(), 150u)
      << pve.Exec(300, "journalctl --no-pager -n 30 -u " + coordinator_unit);
  EXPECT_EQ(ReadEvents(out + "/steps.jsonl", "resumed").size(), 1u);
  EXPECT_THAT(pve.ContainerFile(300, "/etc/flashdraft/pvetest.yaml"), HasSubstr("max_steps: 150"));

  // Rollback: the coordinator's files are the first bundle's again; the workers' did not change.
  auto rollback = pve.Run(absl::StrCat(env, pve_cmd, "rollback ", args));
  EXPECT_EQ(rollback.exit_code, 0) << rollback.output;
  EXPECT_THAT(pve.ContainerFile(300, "/etc/flashdraft/pvetest.yaml"), HasSubstr("max_steps: 120"));

  // Stop: every unit down and disabled.
  auto stop = pve.Run(absl::StrCat(env, pve_cmd, "stop ", args));
  EXPECT_EQ(stop.exit_code, 0) << stop.output;
  EXPECT_EQ(pve.Exec(300, "systemctl is-enabled " + coordinator_unit), "disabled");
  EXPECT_EQ(pve.Exec(301, "systemctl is-active flashdraft-worker@cpu"), "inactive");
}

// A job on make-tiny-target's target in `target_dir` (online, no regeneration), with the lines of
// `extra` (cluster, security) added (`out` empty: no output_dir): the deploy tests that run a
// target feeder train it.
std::string TinyTargetJobYaml(const std::string& name, const std::string& target_dir,
                              const std::string& out, int steps, const std::string& kernel,
                              const std::string& extra) {
  return absl::StrCat(
      "name: ", name, "\n", out.empty() ? "" : absl::StrCat("output_dir: ", out, "\n"),
      "target: {path: ", target_dir, ", layer_ids: [1, 3]}\n",
      "drafter: {num_hidden_layers: 1, block_size: 8, num_target_features: 2, max_anchors: 16}\n",
      "data: {source: target, jsonl: ", target_dir,
      "/chats.jsonl, max_seq_len: 256, regenerate: false}\n", "train: {seed: 0, max_steps: ", steps,
      ", global_batch_size: 8", kernel.empty() ? "" : ", blas_kernel: " + kernel, "}\n",
      "checkpoint: {every_steps: 0}\n", extra);
}

// deploy/proxmox with a target feeder on real LXC containers: a coordinator, a worker and a feeder
// container (the feeder's certificate from the deployment's PKI, the target mounted into it); the
// worker fetches its features from the feeder, and the job ends with the numbers `flashdraft
// launch` gets on loopback without a feeder.
TEST(DeployTest, ProxmoxDeploysAFeederContainerBesideTheWorkers) {
  if (std::string why = PveStandIn::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  const std::string root = dir.path();
  PveStandIn pve(root);
  ASSERT_TRUE(pve.ok());
  auto made = RunCommand(absl::StrCat(kBin, "/flashdraft make-tiny-target --out ", root,
                                      "/data/target --steps 150 --merges 256 --hidden 64 "
                                      "--layers 4 2>&1"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string mounts = absl::StrCat("mounts: [{host: ", root, "/data, path: /data}]");
  const std::string cluster = root + "/cluster.yaml";
  ASSERT_TRUE(
      WriteFileAtomically(
          cluster, absl::StrCat("host: root@pve-test\n"
                                "template: local:vztmpl/debian-12-standard_12.7-1_amd64."
                                "tar.zst\nbridge: ",
                                pve.bridge(), "\npve_config_dir: ", pve.ct_dir(),
                                "\ncontainers:\n"
                                "  - {id: 310, role: coordinator, ip: 10.213.6.10/24, ",
                                mounts, "}\n", "  - {id: 311, role: worker, ip: 10.213.6.11/24}\n",
                                "  - {id: 312, role: feeder, ip: 10.213.6.12/24, ", mounts, "}\n"))
          .ok());
  const absl::StatusOr<std::string> kernel = HostBlasKernel(kBin);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  const std::string job = root + "/job.yaml";
  ASSERT_TRUE(
      WriteFileAtomically(job, TinyTargetJobYaml("pvefed", "/data/target", "", 40, *kernel, ""))
          .ok());
  auto reference = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", job, " --workers 1 --out ",
                                           root, "/reference --set target.path=", root,
                                           "/data/target --set data.jsonl=", root,
                                           "/data/target/chats.jsonl 2>&1"));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;

  const std::string pve_cmd =
      absl::StrCat("FLASHDRAFT_BIN=", kBin, " ", kSource, "/deploy/proxmox/flashdraft-pve ");
  const std::string args = absl::StrCat(cluster, " ", job, " --state ", root, "/state");
  auto deployed = pve.Run(absl::StrCat(pve_cmd, "deploy ", args, " --join-timeout 180"));
  ASSERT_EQ(deployed.exit_code, 0) << deployed.output;
  EXPECT_THAT(deployed.output, HasSubstr("1 worker CT(s) and 1 feeder CT(s)"));
  const std::string unit = "flashdraft-coordinator@pvefed";
  for (int i = 0; i < 600 && pve.Exec(310, "systemctl is-active " + unit) == "active"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const std::string journal = pve.Exec(310, "journalctl --no-pager -u " + unit);
  const std::string feeder_journal =
      pve.Exec(312, "journalctl --no-pager -u flashdraft-feeder@cpu");
  EXPECT_EQ(pve.Exec(310, "systemctl show -p Result --value " + unit), "success") << journal;
  EXPECT_THAT(journal, HasSubstr("feeder 'flashdraft-312-cpu' joined (serving at "
                                 "10.213.6.12:7700"));
  EXPECT_THAT(journal, HasSubstr("security: mutual TLS, job token"));
  EXPECT_THAT(feeder_journal, HasSubstr("security: mutual TLS, job token")) << feeder_journal;
  EXPECT_EQ(pve.Exec(312, "systemctl show -p NRestarts --value flashdraft-feeder@cpu"), "0")
      << feeder_journal;
  const std::string out = absl::StrCat(pve.ct_dir(), "/310/rootfs/var/lib/flashdraft/pvefed");
  EXPECT_EQ(FirstDifferentStep(ReadSteps(out + "/steps.jsonl"),
                               ReadSteps(root + "/reference/steps.jsonl")),
            "")
      << journal << feeder_journal;
  EXPECT_TRUE(*ReadFile(out + "/drafter/model.safetensors") ==
              *ReadFile(root + "/reference/drafter/model.safetensors"));
  EXPECT_THAT(pve.ContainerFile(310, "/etc/flashdraft/pvefed.yaml"), HasSubstr("min_feeders: 1"));

  auto stop = pve.Run(absl::StrCat(pve_cmd, "stop ", args));
  EXPECT_EQ(stop.exit_code, 0) << stop.output;
  EXPECT_EQ(pve.Exec(312, "systemctl is-enabled flashdraft-feeder@cpu"), "disabled");
}

// `flashdraft-pve deploy --dry-run` of the shipped 1 + 4 GPU example prints exactly what
// docs/DEPLOY.md shows (bundle ids aside: they are hashes of this build's binaries); the classic
// cgroup GPU passthrough lines match their golden file; bad cluster files are refused, naming the
// file, the field and the value.
TEST(DeployTest, ProxmoxDryRunIsWhatTheDocsShowAndBadClusterFilesAreRefused) {
  TempDir dir;
  const std::string pve = absl::StrCat("cd ", dir.path(), " && FLASHDRAFT_BIN=", kBin, " ", kSource,
                                       "/deploy/proxmox/flashdraft-pve ");
  const std::string examples = kSource + "/deploy/proxmox/";
  auto normalized = [](const std::string& text) {
    return std::regex_replace(text, std::regex("(ct[0-9]+)-[0-9a-f]{12}"), "$1-<bundle>");
  };
  auto dry = RunCommand(absl::StrCat(pve, "deploy ", examples, "cluster.example.yaml ", examples,
                                     "job.example.yaml --state flashdraft-pve-demo --dry-run"));
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  const std::string docs = *ReadFile(kSource + "/docs/DEPLOY.md");
  const std::string begin = "<!-- dry-run:begin -->\n```sh\n", end = "```\n<!-- dry-run:end -->";
  ASSERT_NE(docs.find(begin), std::string::npos);
  const size_t from = docs.find(begin) + begin.size();
  EXPECT_EQ(normalized(dry.output), normalized(docs.substr(from, docs.find(end) - from)))
      << "docs/DEPLOY.md's dry-run block is out of date";
  EXPECT_THAT(dry.output, HasSubstr("pct set 204 --dev0 /dev/nvidia3 --dev1 /dev/nvidiactl"));
  // Host GPU 3 is the container's only GPU, so CUDA's device 0 inside it.
  auto env = ReadFile(dir.Join("flashdraft-pve-demo/bundles/ct204/etc/worker-gpu3.env"));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_THAT(*env, HasSubstr("CUDA_VISIBLE_DEVICES=0\n"));

  // The classic passthrough for hosts before Proxmox 8.2.
  const std::string cgroup = dir.Join("cgroup.yaml");
  ASSERT_TRUE(WriteFileAtomically(cgroup,
                                  "host: root@pve1\ntemplate: local:vztmpl/debian-12.tar.zst\n"
                                  "gpu_passthrough: cgroup\ncontainers:\n"
                                  "  - {id: 200, role: coordinator, ip: 10.10.0.10/24}\n"
                                  "  - {id: 201, role: worker, ip: 10.10.0.11/24, gpu: 1}\n")
                  .ok());
  auto classic = RunCommand(
      absl::StrCat(pve, "deploy ", cgroup, " ", examples, "job.example.yaml --state s --dry-run"));
  ASSERT_EQ(classic.exit_code, 0) << classic.output;
  std::string gpu_lines;
  bool take = false;
  for (absl::string_view line : absl::StrSplit(classic.output, '\n')) {
    if (absl::StartsWith(line, "# ")) take = absl::StrContains(line, "GPU");
    if (take) absl::StrAppend(&gpu_lines, line, "\n");
  }
  EXPECT_EQ(gpu_lines, *ReadFile(kSource + "/tests/deploy/gpu-cgroup.golden"));

  // A job that pins its OpenBLAS kernel (train.blas_kernel) has it in every unit's env file: a
  // container inherits no environment from the machine that deploys it. The example pins none.
  EXPECT_THAT(*env, ::testing::Not(HasSubstr("OPENBLAS_CORETYPE")));
  const std::string pinned_job = dir.Join("pinned.yaml");
  ASSERT_TRUE(
      WriteFileAtomically(pinned_job,
                          absl::StrReplaceAll(*ReadFile(examples + "job.example.yaml"),
                                              {{"\ntrain:\n", "\ntrain:\n  blas_kernel: Zen\n"}}))
          .ok());
  auto pinned = RunCommand(
      absl::StrCat(pve, "deploy ", cgroup, " ", pinned_job, " --state pinned --dry-run"));
  ASSERT_EQ(pinned.exit_code, 0) << pinned.output;
  for (const char* file : {"ct200/etc/demo.env", "ct201/etc/worker.env"}) {
    auto pinned_env = ReadFile(dir.Join(absl::StrCat("pinned/bundles/", file)));
    ASSERT_TRUE(pinned_env.ok()) << pinned_env.status();
    EXPECT_THAT(*pinned_env, HasSubstr("OPENBLAS_CORETYPE=Zen\n")) << file;
  }

  // A host ssh cannot reach is named as such (not taken for "not done yet" by the first check).
  if (access("/usr/bin/ssh", X_OK) == 0) {
    const std::string unreachable = dir.Join("unreachable.yaml");
    ASSERT_TRUE(WriteFileAtomically(
                    unreachable,
                    absl::StrReplaceAll(*ReadFile(cgroup), {{"root@pve1", "root@pve.invalid"}}))
                    .ok());
    auto r = RunCommand(
        absl::StrCat(pve, "deploy ", unreachable, " ", examples, "job.example.yaml --state s"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.output, HasSubstr("cannot reach the Proxmox host root@pve.invalid over ssh"));
  }

  // Bad cluster files: refused before anything runs, naming the file, the field and the value
  // (every refusal is in deploy/proxmox/pve_cluster_test.cc; these show the program reports them).
  struct Case {
    std::string yaml, want;
  };
  const std::string ok_head = "host: root@pve1\ntemplate: local:vztmpl/d.tar.zst\n";
  const std::string coordinator = "  - {id: 200, role: coordinator, ip: 10.0.0.10/24}\n";
  const std::vector<Case> cases = {
      {"[", "not valid YAML"},
      {ok_head + "hots: x\n", "unknown field 'hots' (known: host, template"},
      {ok_head + "containers:\n" + coordinator + "  - {id: 201, role: worker, ip: 10.0.0.300/24}\n",
       "field 'containers[1].ip' = 10.0.0.300/24 is not an IPv4 address with a prefix"},
      {ok_head + "port: 70000\ncontainers:\n" + coordinator,
       "field 'port' = 70000 must be in [1, 65535]"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir.Join(absl::StrCat("bad-", i, ".yaml"));
    ASSERT_TRUE(WriteFileAtomically(path, cases[i].yaml).ok());
    auto r = RunCommand(
        absl::StrCat(pve, "deploy ", path, " ", examples, "job.example.yaml --state s --dry-run"));
    EXPECT_EQ(r.exit_code, 1) << cases[i].yaml;
    EXPECT_THAT(r.output, HasSubstr(absl::StrCat(path, ": ", cases[i].want))) << cases[i].yaml;
  }
}

// Podman as this machine runs it: runc and explicit ulimits from a containers.conf of the test's
// own (crun fails on its hybrid cgroups). Containers and the network the test made are removed on
// destruction; images stay (the base image is reused by the next run).
class Podman {
 public:
  static std::string Unavailable() {
    if (geteuid() != 0) return "needs root (podman networks with fixed addresses)";
    for (const char* b : {"/usr/bin/podman", "/usr/sbin/runc", "/usr/sbin/debootstrap"}) {
      if (access(b, X_OK) != 0) {
        return absl::StrCat("needs ", b, " (packages podman, runc, debootstrap; scripts/setup.sh)");
      }
    }
    return "";
  }

  explicit Podman(const std::string& dir)
      : conf_(dir + "/containers.conf"), network_(absl::StrCat("fdtest", getpid())) {
    EXPECT_TRUE(WriteFileAtomically(conf_,
                                    "[containers]\ndefault_ulimits = [\"nofile=1024:1024\", "
                                    "\"nproc=1024:1024\"]\n[engine]\nruntime = \"runc\"\n")
                    .ok());
  }
  ~Podman() {
    for (const std::string& name : containers_) Run("rm -f " + name);
    Run("network rm -f " + network_);
  }
  Podman(const Podman&) = delete;
  Podman& operator=(const Podman&) = delete;

  // `podman ARGS` (stderr too).
  testing::CommandResult Run(const std::string& args, const std::string& env = "") const {
    return RunCommand(
        absl::StrCat("env CONTAINERS_CONF=", conf_, " ", env, " podman ", args, " 2>&1"));
  }
  std::string Env() const { return "CONTAINERS_CONF=" + conf_; }
  const std::string& network() const { return network_; }
  // `podman run -d --name NAME ARGS`, removed with this object.
  testing::CommandResult Start(const std::string& name, const std::string& args) {
    containers_.push_back(name);
    return Run(absl::StrCat("run -d --name ", name, " ", args));
  }

 private:
  std::string conf_;
  std::string network_;
  std::vector<std::string> containers_;
};

// The three images, tagged `test`, from a Debian bookworm base made here with debootstrap (kept
// between runs as localhost/flashdraft-test-base:bookworm) and this build's binaries.
void BuildTestImages(const Podman& podman, const std::string& root) {
  const std::string base = "localhost/flashdraft-test-base:bookworm";
  if (podman.Run("image exists " + base).exit_code != 0) {
    const char* mirror = getenv("FLASHDRAFT_DEBIAN_MIRROR");
    auto boot = RunCommand(absl::StrCat("debootstrap --variant=minbase bookworm ", root, "/rootfs ",
                                        mirror ? mirror : "http://deb.debian.org/debian",
                                        " 2>&1 | tail -5"));
    auto imported = RunCommand(absl::StrCat("tar -C ", root, "/rootfs -c . | env ", podman.Env(),
                                            " podman import - ", base, " 2>&1"));
    ASSERT_EQ(podman.Run("image exists " + base).exit_code, 0) << boot.output << imported.output;
    std::filesystem::remove_all(root + "/rootfs");
  }
  auto built = RunCommand(absl::StrCat("env ", podman.Env(), " FLASHDRAFT_BIN=", kBin, " ", kSource,
                                       "/docker/build-images.sh --prebuilt --base ", base,
                                       " --tag test 2>&1"));
  ASSERT_EQ(built.exit_code, 0) << built.output;
  auto tags = podman.Run("images --format '{{.Repository}}:{{.Tag}}'");
  for (const char* image : {"coordinator", "worker", "feeder"}) {
    EXPECT_THAT(tags.output, HasSubstr(absl::StrCat("localhost/flashdraft-", image, ":test")));
  }
  EXPECT_THAT(tags.output, ::testing::Not(HasSubstr("flashdraft-coordinator:latest")));
}

// The podman test's job, as the containers see it (`at` /etc/flashdraft, listening on 0.0.0.0:7600,
// one feeder) or as `flashdraft launch` runs it here for the reference (no feeder: the numbers do
// not depend on who computes the features).
std::string PodmanJobYaml(const std::string& at, const std::string& out, const std::string& listen,
                          int feeders, const std::string& kernel) {
  return TinyTargetJobYaml("podtest", at + "/target", out, 60, kernel,
                           absl::StrCat("cluster: {listen: '", listen,
                                        "', max_workers: 2, min_workers: 2, min_feeders: ", feeders,
                                        "}\n", PkiSecurityYaml(at + "/pki")));
}

// docker/: the coordinator, worker and feeder images built with podman from a Debian bookworm base
// made here (debootstrap; no registry is reachable), then a secured job run as four containers on
// a podman network (a coordinator, a target feeder with its own certificate, two workers that
// fetch their features from it), to the numbers `flashdraft launch` gets on loopback.
TEST(DeployTest, ContainerImagesTrainAJobOnAPodmanNetwork) {
  if (std::string why = Podman::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  const std::string root = dir.path();
  Podman podman(root);
  BuildTestImages(podman, root);
  if (HasFatalFailure()) return;

  // The job as the containers see it (/etc/flashdraft mounted read-only, files owned by the
  // images' user), and the same job on this machine for the reference. The feeder's certificate
  // names the address the workers reach it by.
  const std::string etc = root + "/etc";
  auto made = RunCommand(absl::StrCat(
      kBin, "/flashdraft make-tiny-target --out ", etc,
      "/target --steps 150 --merges 256 --hidden 64 --layers 4 >/dev/null && ", kSource,
      "/deploy/make-certs.sh ", etc, "/pki --ip 10.213.9.10 --feeder 10.213.9.20 && chown -R ",
      "10001:10001 ", etc, "/pki && mkdir -m 777 ", root, "/out 2>&1"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  // Pinned to this machine's own OpenBLAS kernel: the containers inherit no environment from here.
  const absl::StatusOr<std::string> kernel = HostBlasKernel(kBin);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  ASSERT_TRUE(WriteFileAtomically(etc + "/job.yaml",
                                  PodmanJobYaml("/etc/flashdraft", "/var/lib/flashdraft/out",
                                                "0.0.0.0:7600", 1, *kernel))
                  .ok());
  ASSERT_TRUE(
      WriteFileAtomically(root + "/reference.yaml",
                          PodmanJobYaml(etc, root + "/reference", "127.0.0.1:0", 0, *kernel))
          .ok());
  auto reference = RunCommand(
      absl::StrCat(kBin, "/flashdraft launch ", root, "/reference.yaml --workers 2 2>&1"));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;

  // A run killed before its cleanup left its network (this subnet) and containers: remove them.
  const std::string stale_networks =
      podman.Run("network ls --format '{{.Name}}' --filter name=^fdtest").output;
  for (absl::string_view stale : absl::StrSplit(stale_networks, '\n', absl::SkipEmpty())) {
    if (stale != podman.network()) podman.Run(absl::StrCat("network rm -f ", stale));
  }
  auto network = podman.Run("network create --subnet 10.213.9.0/24 " + podman.network());
  ASSERT_EQ(network.exit_code, 0) << network.output;
  const std::string id = absl::StrCat(getpid());
  const std::string on_network =
      absl::StrCat("--network ", podman.network(), " -v ", etc, ":/etc/flashdraft:ro ");
  auto c = podman.Start("fdc" + id, absl::StrCat(on_network, "--ip 10.213.9.10 -v ", root,
                                                 "/out:/var/lib/flashdraft/out "
                                                 "localhost/flashdraft-coordinator:test"));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  // Both ways the job's kernel reaches a container (docs/DEPLOY.md): the coordinator pins itself
  // from the job (it starts again with OPENBLAS_CORETYPE), the workers and the feeder are given it
  // up front.
  const std::string kernel_env =
      kernel->empty() ? "" : absl::StrCat("-e OPENBLAS_CORETYPE=", *kernel, " ");
  const std::string to_coordinator = "-e FLASHDRAFT_COORDINATOR=10.213.9.10:7600 ";
  auto f = podman.Start(
      "fdf" + id,
      absl::StrCat(on_network, "--ip 10.213.9.20 ", kernel_env, to_coordinator,
                   "-e FLASHDRAFT_FEEDER_CERT=/etc/flashdraft/pki/feeder-10.213.9.20.pem "
                   "-e FLASHDRAFT_FEEDER_KEY=/etc/flashdraft/pki/feeder-10.213.9.20.key "
                   "localhost/flashdraft-feeder:test"));
  ASSERT_EQ(f.exit_code, 0) << f.output;
  for (int w : {1, 2}) {
    auto started = podman.Start(absl::StrCat("fdw", w, "-", id),
                                absl::StrCat(on_network, "--ip 10.213.9.1", w, " ", kernel_env,
                                             to_coordinator, "localhost/flashdraft-worker:test"));
    ASSERT_EQ(started.exit_code, 0) << started.output;
  }
  // While it trains: healthy by their HEALTHCHECKs (the coordinator's `flashdraft status`, the
  // worker's and the feeder's `flashdraft probe` of their own /healthz), not root.
  for (int i = 0; i < 600 && ReadSteps(root + "/out/steps.jsonl").empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // All at once: the job lasts seconds. On a failure, the answers the HEALTHCHECKs logged.
  const std::vector<std::string> checked = {"fdc" + id, "fdw1-" + id, "fdf" + id};
  const std::string podman_command = absl::StrCat("env ", podman.Env(), " podman ");
  std::string checks;
  for (const std::string& name : checked) {
    absl::StrAppend(&checks, "(", podman_command, "healthcheck run ", name,
                    " >/dev/null 2>&1; echo ", name, " $?) & ");
  }
  // The probe itself, as the worker's HEALTHCHECK runs it: it answers from the worker's own port.
  absl::StrAppend(&checks, "(", podman_command, "exec fdw1-", id,
                  " flashdraft probe --port-file /tmp/flashdraft-metrics.port 2>&1 | sed "
                  "'s/^/probe /') & wait");
  const std::string answers = RunCommand(checks).output;
  std::string health_logs;
  for (const std::string& name : checked) {
    absl::StrAppend(&health_logs, name, ": ",
                    podman.Run("inspect --format '{{json .State.Health}}' " + name).output);
  }
  for (const std::string& name : checked) {
    EXPECT_THAT(answers, HasSubstr(name + " 0\n")) << answers << health_logs;
  }
  EXPECT_THAT(answers, HasSubstr("probe ok\n")) << answers;
  EXPECT_EQ(podman.Run("exec fdc" + id + " id -u").output, "10001\n");
  auto waited = podman.Run(absl::StrCat("wait fdc", id, " fdf", id, " fdw1-", id, " fdw2-", id));
  const std::string logs = podman.Run("logs fdc" + id).output;
  EXPECT_EQ(waited.output, "0\n0\n0\n0\n") << logs << podman.Run("logs fdf" + id).output;
  EXPECT_THAT(logs, HasSubstr("feeder 'feeder-"));
  EXPECT_THAT(logs, HasSubstr("joined (serving at 10.213.9.20:7700"));
  EXPECT_EQ(FirstDifferentStep(ReadSteps(root + "/out/steps.jsonl"),
                               ReadSteps(root + "/reference/steps.jsonl")),
            "");
  auto exported = ReadFile(root + "/out/drafter/model.safetensors");
  auto expected = ReadFile(root + "/reference/drafter/model.safetensors");
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(*exported == *expected);
}

}  // namespace
}  // namespace flashdraft
