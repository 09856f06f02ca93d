// flashdraft-pve deploy|status|stop|rollback CLUSTER JOB: a job in Proxmox LXC containers, one
// coordinator container and one per worker (one per GPU), driven over ssh on the Proxmox host with
// `pct` (deploy/proxmox/pve_steps.h). deploy/proxmox/flashdraft-pve runs it from a checkout;
// docs/DEPLOY.md.
#pragma once

#include <string>

namespace flashdraft {

struct PveOptions {
  std::string command;  // deploy | status | stop | rollback
  std::string cluster_path;
  std::string job_path;
  std::string deploy_dir;  // the project's deploy/ (systemd units, make-certs.sh)
  std::string bin_dir;     // flashdraft, flashdraft-coordinator and flashdraft-worker for bundles
  // Local: PKI and bundles; default <cluster file's dir>/flashdraft-pve-<job>.
  std::string state_dir;
  bool dry_run = false;
  double join_timeout_seconds = 300;
};

// The exit code: 0 done, 1 failed (the error on stderr), 2 bad options.
int RunPve(const PveOptions& options);

// The directory of this program.
std::string PveProgramDir();

// The deploy/ directory next to this program: <bin>/../share/flashdraft/deploy when installed,
// <bin>/../../deploy in a build tree; empty when neither has make-certs.sh.
std::string FindDeployDir();

}  // namespace flashdraft
