#include "deploy/proxmox/pve.h"

#include <chrono>
#include <filesystem>
#include <functional>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "deploy/proxmox/pve_deployment.h"
#include "deploy/proxmox/pve_runner.h"
#include "deploy/proxmox/pve_steps.h"

namespace flashdraft {
namespace {

namespace fs = std::filesystem;

int Fail(const std::string& command, const absl::Status& s) {
  std::cerr << "flashdraft-pve " << command << ": error: " << s.message() << "\n";
  return 1;
}

// Every container, then every bundle, then the coordinator's unit, the feeders' and the workers'.
std::vector<Step> DeploySteps(const PveDeployment& d) {
  std::vector<Step> steps;
  for (const PveContainer& c : d.cluster.containers) {
    for (Step& s : PveContainerSteps(d, c)) steps.push_back(std::move(s));
  }
  for (const PveContainer& c : d.cluster.containers) {
    for (Step& s : PveBundleSteps(d, c)) steps.push_back(std::move(s));
  }
  steps.push_back(PveServiceStep(d, *d.coordinator));
  for (const PveContainer* f : d.feeders) steps.push_back(PveServiceStep(d, *f));
  for (const PveContainer* w : d.workers) steps.push_back(PveServiceStep(d, *w));
  return steps;
}

// When `flashdraft status` gets no answer: true when the job is over (its coordinator exited 0,
// "inactive success"), an error with its journal when the unit failed, false otherwise.
absl::StatusOr<bool> CoordinatorFinished(const PveDeployment& d, const Runner& run) {
  const std::string unit = PveUnit(d, *d.coordinator);
  const std::string unit_state = std::string(absl::StripAsciiWhitespace(
      run.Host(PctExecSh(d.coordinator->id,
                         absl::StrCat("echo $(systemctl is-active ", unit,
                                      ") $(systemctl show -p Result --value ", unit, ")")))
          .output));
  if (unit_state == "inactive success") return true;
  if (absl::StartsWith(unit_state, "failed")) {
    return absl::InternalError(absl::StrCat(
        unit, " failed in CT ", d.coordinator->id, ":\n",
        run.Host(PctExec(d.coordinator->id, "journalctl -n 20 --no-pager -u " + unit)).output));
  }
  return false;
}

// Until every worker has joined ("runs") or the job is already over ("done").
absl::StatusOr<std::string> WaitForWorkers(const PveDeployment& d, const Runner& run,
                                           double timeout_seconds) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1e3));
  while (true) {
    ShellResult r = run.Host(PveStatusCommand(d, /*json=*/true));
    std::string state;
    const int joined = r.exit_code == 0 ? PveJoinedWorkers(r.output, &state) : -1;
    if (state == "done") return state;
    if (joined == static_cast<int>(d.workers.size())) return std::string("runs");
    if (r.exit_code != 0) {
      FD_ASSIGN_OR_RETURN(const bool finished, CoordinatorFinished(d, run));
      if (finished) return std::string("done");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "not every worker joined within ", timeout_seconds, " s; the coordinator says:\n",
          r.output, "\n(journalctl -u flashdraft-worker@... inside the worker containers)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

int Deploy(const PveOptions& o) {
  absl::StatusOr<PveDeployment> loaded = LoadPveDeployment(o.cluster_path, o.job_path, o.state_dir);
  if (!loaded.ok()) return Fail(o.command, loaded.status());
  PveDeployment& d = *loaded;
  if (absl::Status s = BuildPveBundles(d, o.deploy_dir, o.bin_dir); !s.ok()) {
    return Fail(o.command, s);
  }
  Runner run(d.cluster.host, o.dry_run);
  std::cout << "# flashdraft-pve deploy: job '" << d.job_name << "' on " << d.cluster.host
            << ", coordinator CT " << d.coordinator->id << ", " << d.workers.size()
            << " worker CT(s)"
            << (d.feeders.empty() ? "" : absl::StrCat(" and ", d.feeders.size(), " feeder CT(s)"))
            << "; commands run on the Proxmox host over ssh\n";
  if (absl::Status s = run.Apply(DeploySteps(d)); !s.ok()) return Fail(o.command, s);
  if (o.dry_run) {
    std::cout << "# until every worker has joined (up to " << o.join_timeout_seconds << " s)\n"
              << PveStatusCommand(d, /*json=*/true) << "\n";
    return 0;
  }
  absl::StatusOr<std::string> state = WaitForWorkers(d, run, o.join_timeout_seconds);
  if (!state.ok()) return Fail(o.command, state.status());
  const std::string metrics = d.cluster.metrics_port > 0
                                  ? absl::StrCat("http://", PveAddress(d.coordinator->ip), ":",
                                                 d.cluster.metrics_port, "/metrics")
                                  : "off (metrics_port: 0)";
  std::cout << "flashdraft-pve: job '" << d.job_name << "' "
            << (*state == "done" ? "finished" : "runs") << ": coordinator "
            << PveCoordinatorAddress(d) << " (CT " << d.coordinator->id << "), " << d.workers.size()
            << " worker(s); " << run.changed() << " change(s)\n"
            << "  /metrics: " << metrics << "\n"
            << "  status:   flashdraft-pve status " << o.cluster_path << " " << o.job_path << "\n";
  return 0;
}

int Status(const PveOptions& o) {
  absl::StatusOr<PveDeployment> loaded = LoadPveDeployment(o.cluster_path, o.job_path, o.state_dir);
  if (!loaded.ok()) return Fail(o.command, loaded.status());
  const PveDeployment& d = *loaded;
  Runner run(d.cluster.host, false);
  for (const PveContainer& c : d.cluster.containers) {
    ShellResult ct = run.Host(absl::StrCat("pct status ", c.id));
    ShellResult unit = run.Host(PctExec(c.id, "systemctl is-active " + PveUnit(d, c)));
    std::cout << "CT " << c.id << " " << c.hostname << " (" << c.role
              << "): " << absl::StripAsciiWhitespace(ct.output) << ", " << PveUnit(d, c) << " "
              << absl::StripAsciiWhitespace(unit.output) << "\n";
  }
  ShellResult r = run.Host(PveStatusCommand(d, /*json=*/false));
  std::cout << r.output;
  return r.exit_code == 0 ? 0 : 1;
}

// One step per container, run or printed: workers and feeders first (the coordinator last), or
// the other way.
int ApplyPerContainer(const PveOptions& o, bool workers_first,
                      const std::function<Step(const PveDeployment&, const PveContainer&)>& step) {
  absl::StatusOr<PveDeployment> loaded = LoadPveDeployment(o.cluster_path, o.job_path, o.state_dir);
  if (!loaded.ok()) return Fail(o.command, loaded.status());
  const PveDeployment& d = *loaded;
  std::vector<const PveContainer*> order = d.workers;
  order.insert(order.end(), d.feeders.begin(), d.feeders.end());
  if (workers_first) {
    order.push_back(d.coordinator);
  } else {
    order.insert(order.begin(), d.coordinator);
  }
  std::vector<Step> steps;
  for (const PveContainer* c : order) steps.push_back(step(d, *c));
  Runner run(d.cluster.host, o.dry_run);
  if (absl::Status s = run.Apply(steps); !s.ok()) return Fail(o.command, s);
  return 0;
}

}  // namespace

std::string PveProgramDir() {
  std::error_code ec;
  return fs::read_symlink("/proc/self/exe", ec).parent_path().string();
}

std::string FindDeployDir() {
  std::error_code ec;
  const fs::path bin = PveProgramDir();
  for (const fs::path& dir : {bin / "../share/flashdraft/deploy", bin / "../../deploy"}) {
    if (fs::exists(dir / "make-certs.sh", ec)) return fs::weakly_canonical(dir, ec).string();
  }
  return "";
}

int RunPve(const PveOptions& o) {
  if (o.deploy_dir.empty() || !fs::exists(o.deploy_dir + "/make-certs.sh")) {
    std::cerr << "flashdraft-pve: error: no deploy directory (with make-certs.sh and systemd/) at '"
              << o.deploy_dir << "': pass --deploy-dir\n";
    return 2;
  }
  if (o.command == "deploy") return Deploy(o);
  if (o.command == "status") return Status(o);
  // Stop: workers first, then the coordinator (SIGTERM: it commits the step in flight and
  // checkpoints).
  if (o.command == "stop") return ApplyPerContainer(o, /*workers_first=*/true, &PveStopStep);
  if (o.command == "rollback") {
    return ApplyPerContainer(
        o, /*workers_first=*/false,
        [](const PveDeployment&, const PveContainer& c) { return PveRollbackStep(c); });
  }
  std::cerr << "flashdraft-pve: unknown command '" << o.command << "'\n";
  return 2;
}

}  // namespace flashdraft
