// The local side of flashdraft-pve: the job as its containers run it, the job's PKI and one bundle
// per container (binaries, units, configuration, install.sh), kept in the state directory.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_config.h"
#include "deploy/proxmox/pve_cluster.h"

namespace flashdraft {

// Paths inside every container, and the bundles' cache on the Proxmox host.
inline constexpr char kPveEtc[] = "/etc/flashdraft";
inline constexpr char kPvePki[] = "/etc/flashdraft/pki";
inline constexpr char kPveOpt[] = "/opt/flashdraft";
inline constexpr char kPveHostCache[] = "/var/tmp/flashdraft";

struct PveDeployment {
  PveDeployment() = default;
  // Moves only: coordinator, workers and feeders point into cluster.containers, whose elements a
  // move of the vector keeps where they are and a copy would not.
  PveDeployment(PveDeployment&&) = default;
  PveDeployment& operator=(PveDeployment&&) = default;
  PveDeployment(const PveDeployment&) = delete;
  PveDeployment& operator=(const PveDeployment&) = delete;

  PveCluster cluster;
  JobConfig job;  // as the coordinator container runs it
  std::string job_name;
  std::string state_dir;
  const PveContainer* coordinator = nullptr;  // in cluster.containers
  std::vector<const PveContainer*> workers;
  std::vector<const PveContainer*> feeders;  // target feeders (cluster.min_feeders of the job)
  std::map<int, std::string> bundle;         // container id -> bundle id ("ct201-<sha256 prefix>")
};

// Reads and checks the cluster file and the job as the containers will run it, before anything is
// touched. `state_dir` empty: flashdraft-pve-<job name> next to the cluster file.
absl::StatusOr<PveDeployment> LoadPveDeployment(const std::string& cluster_path,
                                                const std::string& job_path,
                                                const std::string& state_dir);

// The job's PKI (made once and kept, deploy/make-certs.sh) and a bundle per container from the
// binaries in `bin_dir` and the units in `deploy_dir`; sets d.bundle.
absl::Status BuildPveBundles(PveDeployment& d, const std::string& deploy_dir,
                             const std::string& bin_dir);

// The systemd unit container `c` runs: flashdraft-coordinator@<job>,
// flashdraft-worker@<gpuN|cpu> or flashdraft-feeder@<gpuN|cpu>.
std::string PveUnit(const PveDeployment& d, const PveContainer& c);

// The coordinator's gRPC address on the bridge.
std::string PveCoordinatorAddress(const PveDeployment& d);

}  // namespace flashdraft
