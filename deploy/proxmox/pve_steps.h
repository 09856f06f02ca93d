// The steps flashdraft-pve runs on the Proxmox host (deploy/proxmox/pve_runner.h): containers
// created and configured with `pct`, bundles pushed and installed, units enabled, stopped or
// rolled back.
#pragma once

#include <string>
#include <vector>

#include "deploy/proxmox/pve_deployment.h"
#include "deploy/proxmox/pve_runner.h"

namespace flashdraft {

// Container `c` created (or adjusted) to the cluster file: cores, memory, network, mounts, GPU,
// /dev/shm, running.
std::vector<Step> PveContainerSteps(const PveDeployment& d, const PveContainer& c);

// The lines a worker's container config gets for its GPU (and /dev/shm): Proxmox 8.2+ device
// entries, or the classic cgroup rules and bind mounts (the nvidia-uvm major is read from the
// host's /proc/devices when the command runs).
std::vector<Step> PveGpuSteps(const PveDeployment& d, const PveContainer& c);

// The bundle onto the host (once, from this machine) and into the container, its runtime
// libraries, its install.
std::vector<Step> PveBundleSteps(const PveDeployment& d, const PveContainer& c);

// The coordinator is enabled and started once; a new bundle restarts it (install.sh). A finished
// job's coordinator stays down. Workers run whenever their coordinator does.
Step PveServiceStep(const PveDeployment& d, const PveContainer& c);

// The unit stopped and disabled.
Step PveStopStep(const PveDeployment& d, const PveContainer& c);

// Back to the bundle the container ran before the last change (its install.sh again, which
// restarts the unit and makes the undone bundle the previous one: a second rollback undoes the
// first). A container whose bundle never changed has nothing to go back to.
Step PveRollbackStep(const PveContainer& c);

// `flashdraft status` of the job, run in the coordinator's container.
std::string PveStatusCommand(const PveDeployment& d, bool json);

// The workers in the current epoch from `flashdraft status --json` (and the job's state), or -1.
int PveJoinedWorkers(const std::string& status_json, std::string* state);

}  // namespace flashdraft
