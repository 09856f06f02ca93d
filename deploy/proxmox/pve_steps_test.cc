#include "deploy/proxmox/pve_steps.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "deploy/proxmox/pve_runner.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A deployment of the cluster file `yaml` (job 'demo'), without the job file or bundles.
PveDeployment Deployment(const std::string& yaml) {
  PveDeployment d;
  absl::StatusOr<PveCluster> cluster = ParsePveCluster(yaml, "c.yaml");
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  d.cluster = *cluster;
  for (const PveContainer& c : d.cluster.containers) {
    if (c.role == "coordinator") d.coordinator = &c;
    if (c.role == "worker") d.workers.push_back(&c);
    if (c.role == "feeder") d.feeders.push_back(&c);
  }
  d.job_name = "demo";
  d.state_dir = "/state";
  return d;
}

const char kCluster[] =
    "host: root@pve1\ntemplate: local:vztmpl/d.tar.zst\nshm_gb: 4\ngateway: 10.0.0.1\n"
    "containers:\n"
    "  - {id: 200, role: coordinator, ip: 10.0.0.10/24, mounts: [{host: /srv, path: /data}]}\n"
    "  - {id: 201, role: worker, ip: 10.0.0.11/24, gpu: 1}\n"
    "  - {id: 202, role: worker, ip: 10.0.0.12/24}\n";

std::vector<std::string> Whats(const std::vector<Step>& steps) {
  std::vector<std::string> out;
  for (const Step& s : steps) out.push_back(s.what);
  return out;
}

TEST(PveStepsTest, AFeederGetsItsGpuItsUnitAndRunsWhileTheCoordinatorDoes) {
  const PveDeployment d =
      Deployment(std::string(kCluster) + "  - {id: 203, role: feeder, ip: 10.0.0.13/24, gpu: 2}\n");
  ASSERT_EQ(d.feeders.size(), 1u);
  const PveContainer& f = *d.feeders[0];
  EXPECT_EQ(PveUnit(d, f), "flashdraft-feeder@gpu2");
  // Its GPU, but no /dev/shm of the workers' size (that is NCCL's, between workers).
  EXPECT_EQ(Whats(PveGpuSteps(d, f)), std::vector<std::string>{"CT 203: GPU 2 (device entries)"});
  const Step service = PveServiceStep(d, f);
  EXPECT_EQ(service.what, "CT 203: flashdraft-feeder@gpu2 running");
  EXPECT_THAT(service.check, HasSubstr("systemctl is-active --quiet flashdraft-feeder@gpu2"));
  EXPECT_THAT(service.check, HasSubstr("flashdraft-coordinator@demo"));
  // A GPU is given to one container, worker or feeder.
  EXPECT_FALSE(ParsePveCluster(std::string(kCluster) +
                                   "  - {id: 203, role: feeder, ip: 10.0.0.13/24, gpu: 1}\n",
                               "c.yaml")
                   .ok());
  // Feeders alone do not train: a worker is still needed.
  EXPECT_FALSE(ParsePveCluster("host: root@pve1\ntemplate: t\ncontainers:\n"
                               "  - {id: 200, role: coordinator, ip: 10.0.0.10/24}\n"
                               "  - {id: 203, role: feeder, ip: 10.0.0.13/24}\n",
                               "c.yaml")
                   .ok());
}

TEST(PveStepsTest, AContainerIsCreatedConfiguredAndStartedInOrder) {
  const PveDeployment d = Deployment(kCluster);
  const std::vector<Step> steps = PveContainerSteps(d, *d.workers[0]);
  EXPECT_EQ(Whats(steps), (std::vector<std::string>{
                              "CT 201 (worker flashdraft-201): create",
                              "CT 201 (worker flashdraft-201): cores and memory",
                              "CT 201 (worker flashdraft-201): network",
                              "CT 201: GPU 1 (device entries)",
                              "CT 201: /dev/shm of 4 GiB",
                              "CT 201 (worker flashdraft-201): running",
                          }));
  EXPECT_THAT(steps[0].action,
              HasSubstr("--net0 name=eth0,bridge=vmbr0,ip=10.0.0.11/24,gw=10.0.0.1 "));
  // The network check counts the four parts the file sets.
  EXPECT_THAT(steps[2].check, HasSubstr(" -e gw=10.0.0.1 | grep -qx 4"));
  EXPECT_EQ(steps[3].action,
            "pct set 201 --dev0 /dev/nvidia1 --dev1 /dev/nvidiactl --dev2 /dev/nvidia-uvm "
            "--dev3 /dev/nvidia-uvm-tools");
  // The coordinator: its mount, no GPU, no /dev/shm.
  const std::vector<Step> coordinator = PveContainerSteps(d, *d.coordinator);
  EXPECT_THAT(Whats(coordinator), ::testing::Contains("CT 200 (coordinator flashdraft-200): mount "
                                                      "/srv at /data"));
  EXPECT_EQ(coordinator[3].action, "pct set 200 --mp0 /srv,mp=/data,ro=1");
  EXPECT_EQ(coordinator.size(), 5u);
}

TEST(PveStepsTest, CgroupPassthroughAppendsToTheContainersConfig) {
  std::string yaml = kCluster;
  yaml.insert(0, "gpu_passthrough: cgroup\npve_config_dir: /cfg\n");
  const PveDeployment d = Deployment(yaml);
  const std::vector<Step> gpu = PveGpuSteps(d, *d.workers[0]);
  ASSERT_EQ(gpu.size(), 2u);
  EXPECT_EQ(gpu[0].what, "CT 201: GPU 1 (cgroup rules and device binds)");
  EXPECT_THAT(gpu[0].action, HasSubstr("lxc.cgroup2.devices.allow: c $uvm:* rwm\\n"));
  EXPECT_THAT(gpu[0].action, HasSubstr("\" >>/cfg/201.conf"));
  EXPECT_THAT(gpu[1].check, HasSubstr("size=4G,nosuid,nodev,create=dir 0 0' /cfg/201.conf"));
  // A CPU worker gets /dev/shm only.
  EXPECT_EQ(Whats(PveGpuSteps(d, *d.workers[1])),
            (std::vector<std::string>{"CT 202: /dev/shm of 4 GiB"}));
}

TEST(PveStepsTest, BundlesAndUnits) {
  PveDeployment d = Deployment(kCluster);
  d.bundle[201] = "ct201-0123456789ab";
  const std::vector<Step> bundle = PveBundleSteps(d, *d.workers[0]);
  ASSERT_EQ(bundle.size(), 4u);
  EXPECT_TRUE(bundle[0].local);  // the copy runs here, over ssh
  EXPECT_THAT(bundle[0].action,
              HasSubstr("<" + std::string("/state/bundles/ct201-0123456789ab.tar")));
  EXPECT_EQ(bundle[3].check,
            "pct exec 201 -- /opt/flashdraft/bundles/ct201-0123456789ab/install.sh "
            "--check");
  // A worker runs whenever its coordinator does; the coordinator is enabled once.
  const Step worker = PveServiceStep(d, *d.workers[0]);
  EXPECT_EQ(worker.what, "CT 201: flashdraft-worker@gpu1 running");
  EXPECT_THAT(worker.check, HasSubstr("|| ! pct exec 200 -- systemctl is-active --quiet "
                                      "flashdraft-coordinator@demo"));
  const Step coordinator = PveServiceStep(d, *d.coordinator);
  EXPECT_EQ(coordinator.what, "CT 200: flashdraft-coordinator@demo enabled");
  EXPECT_EQ(PveStopStep(d, *d.workers[1]).action,
            "pct exec 202 -- systemctl disable --now --quiet flashdraft-worker@cpu");
  EXPECT_THAT(PveRollbackStep(*d.coordinator).check,
              HasSubstr("test ! -s /opt/flashdraft/previous"));
  EXPECT_EQ(PveStatusCommand(d, /*json=*/true),
            "pct exec 200 -- /opt/flashdraft/current/bin/flashdraft status 127.0.0.1:7600 --job "
            "/etc/flashdraft/demo.yaml --json");
}

TEST(PveStepsTest, JoinedWorkersComeFromTheStatusJson) {
  std::string state;
  EXPECT_EQ(PveJoinedWorkers(R"({"world_size": 2, "state": "training"})", &state), 2);
  EXPECT_EQ(state, "training");
  EXPECT_EQ(PveJoinedWorkers("not json", nullptr), -1);
  EXPECT_EQ(PveJoinedWorkers(R"({"world_size": "2"})", nullptr), -1);
  EXPECT_EQ(PveJoinedWorkers(R"([2])", nullptr), -1);
}

TEST(PveRunnerTest, DryRunPrintsCommandsAsOneWouldTypeThem) {
  EXPECT_EQ(DryRunText({"one", "a && b", "c; d"}), "# one\n( a && b ) || { c; d; }\n");
  EXPECT_EQ(DryRunText({"two", "", "c && d", true}), "# two (on this machine)\nc && d\n");
  EXPECT_EQ(ShellWord("root@pve1:/a-b_c.d"), "root@pve1:/a-b_c.d");
  EXPECT_EQ(ShellWord("it's"), "'it'\\''s'");
  EXPECT_EQ(ShellWord(""), "''");
  EXPECT_EQ(PctExecSh(7, "a b"), "pct exec 7 -- sh -c 'a b'");
  const ShellResult r = RunShell("echo out; echo err >&2; exit 3");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.output, "out\nerr\n");
  EXPECT_THAT(r.output, Not(HasSubstr("exit")));
}

}  // namespace
}  // namespace flashdraft
