// `flashdraft pve deploy|status|stop|rollback CLUSTER JOB`: a job in Proxmox LXC containers over
// ssh (pve.h).
#include "cli/command.h"
#include "cli/pve.h"

namespace flashdraft {
namespace {

class PveCommand : public Command {
 public:
  explicit PveCommand(CLI::App& parent)
      : Command(parent.add_subcommand(
            "pve",
            "Deploy a job into Proxmox LXC containers over ssh (deploy/proxmox/flashdraft-pve)")) {
    PveOptions& o = options_;
    app()
        .add_option("command", o.command, "deploy | status | stop | rollback")
        ->required()
        ->check(CLI::IsMember({"deploy", "status", "stop", "rollback"}));
    app()
        .add_option("cluster", o.cluster_path, "cluster file (deploy/proxmox/cluster.example.yaml)")
        ->required();
    app().add_option("job", o.job_path, "YAML job file")->required();
    app().add_flag("--dry-run", o.dry_run, "print every command instead of running it");
    app().add_option("--state", o.state_dir,
                     "local directory for the job's certificates and bundles (default: "
                     "flashdraft-pve-<job name> next to the cluster file)");
    app().add_option("--deploy-dir", o.deploy_dir,
                     "the project's deploy/ directory (systemd units, make-certs.sh); default: "
                     "found next to this program");
    app()
        .add_option("--join-timeout", o.join_timeout_seconds,
                    "seconds to wait for every worker to join")
        ->capture_default_str();
  }

  int Run() override {
    if (options_.deploy_dir.empty()) options_.deploy_dir = FindDeployDir();
    return RunPve(options_);
  }

 private:
  PveOptions options_;
};

}  // namespace

void AddPveCommand(CLI::App& app, Commands& out) {
  out.push_back(std::make_unique<PveCommand>(app));
}

}  // namespace flashdraft
