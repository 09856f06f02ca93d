// flashdraft-pve: deploys a flashdraft job into Proxmox LXC containers over ssh
// (deploy/proxmox/pve.h, docs/DEPLOY.md). Flags only here; the library takes PveOptions.
#include <CLI/CLI.hpp>

#include "deploy/proxmox/pve.h"

int main(int argc, char** argv) {
  flashdraft::PveOptions o;
  CLI::App app(
      "Deploys a flashdraft job into Proxmox LXC containers over ssh: one coordinator container "
      "and one per worker (docs/DEPLOY.md)",
      "flashdraft-pve");
  app.add_option("command", o.command, "deploy | status | stop | rollback")
      ->required()
      ->check(CLI::IsMember({"deploy", "status", "stop", "rollback"}));
  app.add_option("cluster", o.cluster_path, "cluster file (deploy/proxmox/cluster.example.yaml)")
      ->required();
  app.add_option("job", o.job_path, "YAML job file")->required();
  app.add_flag("--dry-run", o.dry_run, "print every command instead of running it");
  app.add_option("--state", o.state_dir,
                 "local directory for the job's certificates and bundles (default: "
                 "flashdraft-pve-<job name> next to the cluster file)");
  app.add_option("--deploy-dir", o.deploy_dir,
                 "the project's deploy/ directory (systemd units, make-certs.sh); default: found "
                 "next to this program");
  app.add_option("--bin-dir", o.bin_dir,
                 "where flashdraft, flashdraft-coordinator and flashdraft-worker are; default: "
                 "this program's directory");
  app.add_option("--join-timeout", o.join_timeout_seconds,
                 "seconds to wait for every worker to join")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.deploy_dir.empty()) o.deploy_dir = flashdraft::FindDeployDir();
  if (o.bin_dir.empty()) o.bin_dir = flashdraft::PveProgramDir();
  return flashdraft::RunPve(o);
}
