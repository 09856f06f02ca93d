#include "deploy/proxmox/pve_steps.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace flashdraft {
namespace {

std::string ConfigHas(int id, const std::string& line) {
  return absl::StrCat("pct config ", id, " | grep -qxF ", ShellWord(line));
}

// The classic passthrough: cgroup rules for major 195 and nvidia-uvm's, bind mounts of the nodes.
Step CgroupGpuStep(const PveContainer& c, const std::vector<std::string>& nodes,
                   const std::string& conf) {
  std::string lines =
      "lxc.cgroup2.devices.allow: c 195:* rwm\n"
      "lxc.cgroup2.devices.allow: c $uvm:* rwm\n";
  for (const std::string& n : nodes) {
    absl::StrAppend(&lines, "lxc.mount.entry: ", n, " ", n.substr(1),
                    " none bind,optional,create=file\n");
  }
  return {
      absl::StrCat("CT ", c.id, ": GPU ", c.gpu, " (cgroup rules and device binds)"),
      absl::StrCat("grep -qxF ",
                   ShellWord(absl::StrCat("lxc.mount.entry: ", nodes[0], " ", nodes[0].substr(1),
                                          " none bind,optional,create=file")),
                   " ", conf),
      absl::StrCat("uvm=$(awk '$2 == \"nvidia-uvm\" {print $1}' /proc/devices); "
                   "[ -n \"$uvm\" ] || { echo 'no nvidia-uvm in /proc/devices: load the NVIDIA "
                   "driver on the host (modprobe nvidia-uvm)' >&2; exit 1; }; "
                   "printf '%b' \"",
                   absl::StrReplaceAll(lines, {{"\n", "\\n"}}), "\" >>", conf)};
}

// net0 as the cluster file sets it.
std::string NetSpec(const PveCluster& k, const PveContainer& c) {
  std::string net = absl::StrCat("name=", k.interface, ",bridge=", k.bridge, ",ip=", c.ip);
  if (!k.gateway.empty()) absl::StrAppend(&net, ",gw=", k.gateway);
  return net;
}

// Proxmox adds hwaddr and type to net0: the check looks for the parts this file sets.
Step NetworkStep(const PveContainer& c, const std::string& net, const std::string& ct) {
  return {ct + ": network",
          absl::StrCat("pct config ", c.id, " | grep '^net0: ' | tr ' ,' '\\n\\n' | grep -cxF",
                       absl::StrJoin(absl::StrSplit(net, ','), "",
                                     [](std::string* out, absl::string_view p) {
                                       absl::StrAppend(out, " -e ", p);
                                     }),
                       " | grep -qx ", std::count(net.begin(), net.end(), ',') + 1),
          absl::StrCat("pct set ", c.id, " --net0 ", net)};
}

}  // namespace

std::vector<Step> PveGpuSteps(const PveDeployment& d, const PveContainer& c) {
  std::vector<Step> steps;
  const std::string conf = absl::StrCat(d.cluster.pve_config_dir, "/", c.id, ".conf");
  const std::vector<std::string> nodes = {absl::StrCat("/dev/nvidia", c.gpu), "/dev/nvidiactl",
                                          "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"};
  if (c.gpu >= 0 && d.cluster.gpu_passthrough == "dev") {
    std::string set = absl::StrCat("pct set ", c.id);
    for (size_t i = 0; i < nodes.size(); ++i) absl::StrAppend(&set, " --dev", i, " ", nodes[i]);
    steps.push_back({absl::StrCat("CT ", c.id, ": GPU ", c.gpu, " (device entries)"),
                     ConfigHas(c.id, "dev0: " + nodes[0]), set});
  } else if (c.gpu >= 0) {
    steps.push_back(CgroupGpuStep(c, nodes, conf));
  }
  if (d.cluster.shm_gb > 0 && c.role == "worker") {
    const std::string line =
        absl::StrCat("lxc.mount.entry: tmpfs dev/shm tmpfs size=", d.cluster.shm_gb,
                     "G,nosuid,nodev,create=dir 0 0");
    steps.push_back({absl::StrCat("CT ", c.id, ": /dev/shm of ", d.cluster.shm_gb, " GiB"),
                     absl::StrCat("grep -qxF ", ShellWord(line), " ", conf),
                     absl::StrCat("echo ", ShellWord(line), " >>", conf)});
  }
  return steps;
}

std::vector<Step> PveContainerSteps(const PveDeployment& d, const PveContainer& c) {
  const PveCluster& k = d.cluster;
  const std::string ct = absl::StrCat("CT ", c.id, " (", c.role, " ", c.hostname, ")");
  const std::string net = NetSpec(k, c);
  std::vector<Step> steps = {
      {ct + ": create", absl::StrCat("pct status ", c.id, " >/dev/null 2>&1"),
       absl::StrCat("pct create ", c.id, " ", k.ostemplate, " --hostname ", c.hostname, " --cores ",
                    c.cores, " --memory ", c.memory_mb, " --net0 ", net, " --rootfs ", k.storage,
                    ":", k.disk_gb, " --unprivileged 0 --features nesting=1 --onboot 1")},
      {ct + ": cores and memory",
       ConfigHas(c.id, absl::StrCat("cores: ", c.cores)) + " && " +
           ConfigHas(c.id, absl::StrCat("memory: ", c.memory_mb)),
       absl::StrCat("pct set ", c.id, " --cores ", c.cores, " --memory ", c.memory_mb)},
      NetworkStep(c, net, ct),
  };
  for (size_t i = 0; i < c.mounts.size(); ++i) {
    const PveMount& m = c.mounts[i];
    const std::string spec = absl::StrCat(m.host, ",mp=", m.path, m.read_only ? ",ro=1" : "");
    steps.push_back({absl::StrCat(ct, ": mount ", m.host, " at ", m.path),
                     ConfigHas(c.id, absl::StrCat("mp", i, ": ", spec)),
                     absl::StrCat("pct set ", c.id, " --mp", i, " ", spec)});
  }
  for (Step& s : PveGpuSteps(d, c)) steps.push_back(std::move(s));
  steps.push_back({ct + ": running",
                   absl::StrCat("pct status ", c.id, " | grep -q 'status: running'"),
                   absl::StrCat("pct start ", c.id)});
  return steps;
}

std::vector<Step> PveBundleSteps(const PveDeployment& d, const PveContainer& c) {
  const std::string& host = d.cluster.host;
  const std::string id = d.bundle.at(c.id);
  const std::string on_host = absl::StrCat(kPveHostCache, "/", id, ".tar");
  const std::string local = absl::StrCat(d.state_dir, "/bundles/", id, ".tar");
  const std::string dir = absl::StrCat(kPveOpt, "/bundles/", id);
  const std::string ct = absl::StrCat("CT ", c.id);
  return {
      {absl::StrCat("bundle ", id, ": copy to the Proxmox host"),
       absl::StrCat("ssh -o BatchMode=yes ", ShellWord(host), " test -f ", on_host),
       absl::StrCat("ssh -o BatchMode=yes ", ShellWord(host), " ",
                    ShellWord(absl::StrCat("mkdir -p ", kPveHostCache, " && umask 077 && cat >",
                                           on_host, ".part && mv ", on_host, ".part ", on_host)),
                    " <", ShellWord(local)),
       /*local=*/true},
      {absl::StrCat(ct, ": bundle ", id),
       PctExec(c.id, absl::StrCat("test -f ", dir, "/.complete")),
       absl::StrCat("pct push ", c.id, " ", on_host, " /var/tmp/", id, ".tar && ",
                    PctExecSh(c.id, absl::StrCat("mkdir -p ", dir, " && tar -xf /var/tmp/", id,
                                                 ".tar -C ", dir, " && rm /var/tmp/", id,
                                                 ".tar && touch ", dir, "/.complete")))},
      {ct + ": runtime libraries", PctExec(c.id, dir + "/bin/flashdraft version"),
       PctExecSh(c.id,
                 "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                 "--no-install-recommends $(cat " +
                     dir + "/runtime-packages.txt)")},
      {absl::StrCat(ct, ": install ", id), PctExec(c.id, dir + "/install.sh --check"),
       PctExec(c.id, dir + "/install.sh")},
  };
}

Step PveServiceStep(const PveDeployment& d, const PveContainer& c) {
  const std::string unit = PveUnit(d, c);
  std::string check = PctExec(c.id, "systemctl is-enabled --quiet " + unit);
  // A worker or feeder runs while its coordinator does (and has ended with the job).
  const bool follows = c.role != "coordinator";
  if (follows) {
    check = absl::StrCat(
        PctExec(c.id, "systemctl is-active --quiet " + unit), " || ! ",
        PctExec(d.coordinator->id, "systemctl is-active --quiet " + PveUnit(d, *d.coordinator)));
  }
  return {absl::StrCat("CT ", c.id, ": ", unit, follows ? " running" : " enabled"), check,
          PctExec(c.id, "systemctl enable --now --quiet " + unit)};
}

Step PveStopStep(const PveDeployment& d, const PveContainer& c) {
  const std::string unit = PveUnit(d, c);
  return {absl::StrCat("CT ", c.id, ": ", unit, " stopped and disabled"),
          PctExecSh(c.id, "! systemctl is-enabled --quiet " + unit +
                              " && ! systemctl is-active --quiet " + unit),
          PctExec(c.id, "systemctl disable --now --quiet " + unit)};
}

Step PveRollbackStep(const PveContainer& c) {
  return {absl::StrCat("CT ", c.id, ": back to the previous bundle"),
          PctExec(c.id, absl::StrCat("test ! -s ", kPveOpt, "/previous")),
          PctExecSh(c.id, absl::StrCat("p=$(cat ", kPveOpt,
                                       "/previous 2>/dev/null) && [ -x \"$p/install.sh\" ] "
                                       "|| { echo 'no previous bundle to go back to' >&2; "
                                       "exit 1; }; \"$p/install.sh\""))};
}

std::string PveStatusCommand(const PveDeployment& d, bool json) {
  return PctExec(d.coordinator->id,
                 absl::StrCat(kPveOpt, "/current/bin/flashdraft status 127.0.0.1:", d.cluster.port,
                              " --job ", kPveEtc, "/", d.job_name, ".yaml", json ? " --json" : ""));
}

int PveJoinedWorkers(const std::string& status_json, std::string* state) {
  const nlohmann::json reply = nlohmann::json::parse(status_json, nullptr, false);
  if (!reply.is_object() || !reply.contains("world_size") ||
      !reply["world_size"].is_number_integer()) {
    return -1;
  }
  if (state != nullptr && reply.contains("state") && reply["state"].is_string()) {
    *state = reply["state"].get<std::string>();
  }
  return reply["world_size"].get<int>();
}

}  // namespace flashdraft
