// `flashdraft pve deploy|status|stop|rollback CLUSTER JOB`: a job in Proxmox LXC containers, one
// coordinator container and one per worker (one per GPU), driven over ssh on the Proxmox host with
// `pct`. Every change is a step with a check (run first: exit 0 means already so) and an action,
// which makes a second deploy change nothing and --dry-run print exactly what would run.
// deploy/proxmox/flashdraft-pve is the command users run; docs/DEPLOY.md.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace flashdraft {

struct PveMount {
  std::string host;  // a directory on the Proxmox host
  std::string path;  // where the container sees it
  bool read_only = true;
};

struct PveContainer {
  int id = 0;
  std::string role;      // "coordinator" | "worker"
  std::string ip;        // a.b.c.d/n on the bridge
  std::string hostname;  // default flashdraft-<id>
  int cores = 2;
  int memory_mb = 4096;
  int gpu = -1;  // workers: the host's /dev/nvidia<gpu>; -1: a CPU worker
  std::vector<PveMount> mounts;
};

struct PveCluster {
  std::string host;  // ssh destination of the Proxmox host
  std::string ostemplate;
  std::string storage = "local-lvm";
  int disk_gb = 16;
  std::string bridge = "vmbr0";
  std::string gateway;
  std::string interface = "eth0";       // the containers' NIC; collective traffic is pinned to it
  int port = 7600;                      // the coordinator's gRPC port
  int metrics_port = 9400;              // its /metrics on its bridge address; 0: off
  std::string gpu_passthrough = "dev";  // "dev" (Proxmox 8.2+) | "cgroup" (lxc.cgroup2 + binds)
  int shm_gb = 0;                       // > 0: worker containers' /dev/shm size
  std::string pve_config_dir = "/etc/pve/lxc";
  std::vector<PveContainer> containers;
};

// Parses and checks a cluster file; errors name the file, the field and the value.
absl::StatusOr<PveCluster> ParsePveCluster(const std::string& yaml_text, const std::string& source);

struct PveOptions {
  std::string command;  // deploy | status | stop | rollback
  std::string cluster_path;
  std::string job_path;
  std::string deploy_dir;  // the project's deploy/ (systemd units, make-certs.sh)
  std::string
      state_dir;  // local: PKI and bundles; default <cluster file's dir>/flashdraft-pve-<job>
  bool dry_run = false;
  double join_timeout_seconds = 300;
};

int RunPve(const PveOptions& options);

// The deploy/ directory next to this program: <bin>/../share/flashdraft/deploy when installed,
// <bin>/../../deploy in a build tree; empty when neither has make-certs.sh.
std::string FindDeployDir();

}  // namespace flashdraft
