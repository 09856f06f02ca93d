// The cluster file of flashdraft-pve (deploy/proxmox/cluster.example.yaml, docs/DEPLOY.md): the
// Proxmox host, its network and storage, and the containers of a job. Read with the job file's
// field machinery (common/yaml_fields.h): errors name the file, the field and the value.
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
  std::string role;      // "coordinator" | "worker" | "feeder" (a target feeder)
  std::string ip;        // a.b.c.d/n on the bridge
  std::string hostname;  // default flashdraft-<id>
  int cores = 2;
  int memory_mb = 4096;
  int gpu = -1;  // workers and feeders: the host's /dev/nvidia<gpu>; -1: on CPUs
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
  int feeder_port = 7700;               // each feeder's FetchShard service (workers fetch there)
  int metrics_port = 9400;              // its /metrics on its bridge address; 0: off
  std::string gpu_passthrough = "dev";  // "dev" (Proxmox 8.2+) | "cgroup" (lxc.cgroup2 + binds)
  int shm_gb = 0;                       // > 0: worker containers' /dev/shm size
  std::string pve_config_dir = "/etc/pve/lxc";
  std::vector<PveContainer> containers;
};

// Parses and checks a cluster file (`source` names it in errors).
absl::StatusOr<PveCluster> ParsePveCluster(const std::string& yaml_text, const std::string& source);

// Names that go into commands, paths and unit instance names unquoted: letters, digits, - _ . and
// the characters of `extra`.
bool IsSafePveName(const std::string& s, const std::string& extra = "");

// "a.b.c.d/n" -> "a.b.c.d".
std::string PveAddress(const std::string& ip_with_prefix);

}  // namespace flashdraft
