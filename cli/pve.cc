#include "cli/pve.h"

#include <arpa/inet.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/job_config.h"
#include "common/status_macros.h"

namespace flashdraft {
namespace {

namespace fs = std::filesystem;

// Paths inside every container.
constexpr char kEtc[] = "/etc/flashdraft";
constexpr char kPki[] = "/etc/flashdraft/pki";
constexpr char kOpt[] = "/opt/flashdraft";
constexpr char kHostCache[] = "/var/tmp/flashdraft";

// ---------------------------------------------------------------------------------------------
// The cluster file.

absl::Status Bad(const std::string& source, const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", field, ": ", why));
}

std::string Scalar(const YAML::Node& n) { return n.IsScalar() ? n.Scalar() : "<not a scalar>"; }

absl::Status ReadString(const YAML::Node& n, const std::string& source, const std::string& field,
                        std::string& out) {
  if (!n.IsScalar()) return Bad(source, field, "must be a string");
  out = n.Scalar();
  return absl::OkStatus();
}

absl::Status ReadInt(const YAML::Node& n, const std::string& source, const std::string& field,
                     int lo, int hi, int& out) {
  int64_t v = 0;
  if (!n.IsScalar() || !absl::SimpleAtoi(n.Scalar(), &v)) {
    return Bad(source, field, absl::StrCat("'", Scalar(n), "' is not an integer"));
  }
  if (v < lo || v > hi) {
    return Bad(source, field, absl::StrCat("= ", v, " must be in [", lo, ", ", hi, "]"));
  }
  out = static_cast<int>(v);
  return absl::OkStatus();
}

absl::Status ReadBool(const YAML::Node& n, const std::string& source, const std::string& field,
                      bool& out) {
  if (!n.IsScalar() || (n.Scalar() != "true" && n.Scalar() != "false")) {
    return Bad(source, field, absl::StrCat("'", Scalar(n), "' is not true or false"));
  }
  out = n.Scalar() == "true";
  return absl::OkStatus();
}

// Calls `field(key, value)` for each key of a map; unknown keys are an error naming the known ones.
absl::Status ForEachField(
    const YAML::Node& map, const std::string& source, const std::string& where,
    const std::vector<std::string>& known,
    const std::function<absl::Status(const std::string&, const YAML::Node&)>& field) {
  if (!map.IsMap()) return Bad(source, where.empty() ? "the file" : where, "must be a mapping");
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) return Bad(source, where, "has a key that is not a string");
    const std::string key = kv.first.Scalar();
    const std::string name = where.empty() ? key : absl::StrCat(where, ".", key);
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return Bad(source, name,
                 absl::StrCat("unknown field (known: ", absl::StrJoin(known, ", "), ")"));
    }
    FD_RETURN_IF_ERROR(field(name, kv.second));
  }
  return absl::OkStatus();
}

// a.b.c.d/n
bool IsIpv4WithPrefix(const std::string& s) {
  std::pair<std::string, std::string> parts = absl::StrSplit(s, absl::MaxSplits('/', 1));
  in_addr addr{};
  int prefix = 0;
  return inet_pton(AF_INET, parts.first.c_str(), &addr) == 1 &&
         absl::SimpleAtoi(parts.second, &prefix) && prefix >= 1 && prefix <= 32;
}

std::string Address(const std::string& ip_with_prefix) {
  return ip_with_prefix.substr(0, ip_with_prefix.find('/'));
}

// Names that go into commands, paths and unit instance names unquoted.
bool IsSafeName(const std::string& s, const std::string& extra = "") {
  if (s.empty() || s.size() > 200) return false;
  for (char c : s) {
    if (!isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' &&
        extra.find(c) == std::string::npos) {
      return false;
    }
  }
  return true;
}

bool IsSafePath(const std::string& s) { return !s.empty() && s[0] == '/' && IsSafeName(s, "/"); }

absl::Status ParseMount(const YAML::Node& n, const std::string& source, const std::string& where,
                        PveMount& m) {
  FD_RETURN_IF_ERROR(
      ForEachField(n, source, where, {"host", "path", "read_only"},
                   [&](const std::string& name, const YAML::Node& v) -> absl::Status {
                     const std::string key = name.substr(name.rfind('.') + 1);
                     if (key == "read_only") return ReadBool(v, source, name, m.read_only);
                     std::string& out = key == "host" ? m.host : m.path;
                     FD_RETURN_IF_ERROR(ReadString(v, source, name, out));
                     if (!IsSafePath(out)) {
                       return Bad(source, name,
                                  absl::StrCat("'", out,
                                               "' must be an absolute path of letters, digits and "
                                               "- _ . /"));
                     }
                     return absl::OkStatus();
                   }));
  if (m.host.empty() || m.path.empty()) return Bad(source, where, "needs both host and path");
  return absl::OkStatus();
}

absl::Status ParseContainer(const YAML::Node& n, const std::string& source,
                            const std::string& where, PveContainer& c) {
  FD_RETURN_IF_ERROR(ForEachField(
      n, source, where, {"id", "role", "ip", "hostname", "cores", "memory_mb", "gpu", "mounts"},
      [&](const std::string& name, const YAML::Node& v) -> absl::Status {
        const std::string key = name.substr(name.rfind('.') + 1);
        if (key == "id") return ReadInt(v, source, name, 100, 999999999, c.id);
        if (key == "cores") return ReadInt(v, source, name, 1, 8192, c.cores);
        if (key == "memory_mb") return ReadInt(v, source, name, 256, 1 << 30, c.memory_mb);
        if (key == "gpu") return ReadInt(v, source, name, 0, 255, c.gpu);
        if (key == "role") {
          FD_RETURN_IF_ERROR(ReadString(v, source, name, c.role));
          if (c.role != "coordinator" && c.role != "worker") {
            return Bad(source, name, absl::StrCat("'", c.role, "' must be coordinator or worker"));
          }
          return absl::OkStatus();
        }
        if (key == "ip") {
          FD_RETURN_IF_ERROR(ReadString(v, source, name, c.ip));
          if (!IsIpv4WithPrefix(c.ip)) {
            return Bad(
                source, name,
                absl::StrCat("'", c.ip, "' is not an IPv4 address with a prefix (a.b.c.d/n)"));
          }
          return absl::OkStatus();
        }
        if (key == "hostname") {
          FD_RETURN_IF_ERROR(ReadString(v, source, name, c.hostname));
          if (!IsSafeName(c.hostname) || c.hostname.size() > 63) {
            return Bad(source, name, absl::StrCat("'", c.hostname, "' is not a host name"));
          }
          return absl::OkStatus();
        }
        // mounts
        if (!v.IsSequence()) return Bad(source, name, "must be a list");
        for (size_t i = 0; i < v.size(); ++i) {
          PveMount m;
          FD_RETURN_IF_ERROR(ParseMount(v[i], source, absl::StrCat(name, "[", i, "]"), m));
          c.mounts.push_back(m);
        }
        return absl::OkStatus();
      }));
  if (c.id == 0) return Bad(source, where + ".id", "is required");
  if (c.role.empty()) return Bad(source, where + ".role", "is required");
  if (c.ip.empty()) return Bad(source, where + ".ip", "is required");
  if (c.role == "coordinator" && c.gpu >= 0) {
    return Bad(source, where + ".gpu", "only workers take a GPU");
  }
  if (c.hostname.empty()) c.hostname = absl::StrCat("flashdraft-", c.id);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PveCluster> ParsePveCluster(const std::string& yaml_text,
                                           const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid YAML: ", e.what()));
  }
  PveCluster c;
  FD_RETURN_IF_ERROR(ForEachField(
      root, source, "",
      {"host", "template", "storage", "disk_gb", "bridge", "gateway", "interface", "port",
       "metrics_port", "gpu_passthrough", "shm_gb", "pve_config_dir", "containers"},
      [&](const std::string& key, const YAML::Node& v) -> absl::Status {
        if (key == "disk_gb") return ReadInt(v, source, key, 1, 1 << 20, c.disk_gb);
        if (key == "port") return ReadInt(v, source, key, 1, 65535, c.port);
        if (key == "metrics_port") return ReadInt(v, source, key, 0, 65535, c.metrics_port);
        if (key == "shm_gb") return ReadInt(v, source, key, 0, 1 << 20, c.shm_gb);
        if (key == "containers") {
          if (!v.IsSequence()) return Bad(source, key, "must be a list");
          for (size_t i = 0; i < v.size(); ++i) {
            PveContainer ct;
            FD_RETURN_IF_ERROR(
                ParseContainer(v[i], source, absl::StrCat("containers[", i, "]"), ct));
            c.containers.push_back(ct);
          }
          return absl::OkStatus();
        }
        std::map<std::string, std::string*> strings = {{"host", &c.host},
                                                       {"template", &c.ostemplate},
                                                       {"storage", &c.storage},
                                                       {"bridge", &c.bridge},
                                                       {"gateway", &c.gateway},
                                                       {"interface", &c.interface},
                                                       {"gpu_passthrough", &c.gpu_passthrough},
                                                       {"pve_config_dir", &c.pve_config_dir}};
        FD_RETURN_IF_ERROR(ReadString(v, source, key, *strings.at(key)));
        const std::string& s = *strings.at(key);
        const bool ok = key == "pve_config_dir" ? IsSafePath(s)
                        : key == "template"     ? IsSafeName(s, ":/")
                        : key == "host"         ? IsSafeName(s, "@:")
                        : key == "gateway"      ? s.empty() || IsIpv4WithPrefix(s + "/32")
                                                : IsSafeName(s);
        if (!ok) return Bad(source, key, absl::StrCat("'", s, "' is not allowed here"));
        return absl::OkStatus();
      }));
  if (c.host.empty())
    return Bad(source, "host", "is required (the Proxmox host's ssh destination)");
  if (c.ostemplate.empty()) {
    return Bad(source, "template",
               "is required (a container template, e.g. "
               "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst)");
  }
  if (c.gpu_passthrough != "dev" && c.gpu_passthrough != "cgroup") {
    return Bad(source, "gpu_passthrough",
               absl::StrCat("'", c.gpu_passthrough, "' must be dev (Proxmox 8.2+) or cgroup"));
  }
  int coordinators = 0, workers = 0;
  std::set<int> ids, gpus;
  std::set<std::string> ips, hostnames;
  for (size_t i = 0; i < c.containers.size(); ++i) {
    const PveContainer& ct = c.containers[i];
    const std::string where = absl::StrCat("containers[", i, "]");
    (ct.role == "coordinator" ? coordinators : workers)++;
    if (!ids.insert(ct.id).second) {
      return Bad(source, where + ".id", absl::StrCat(ct.id, " is used twice"));
    }
    if (!ips.insert(Address(ct.ip)).second) {
      return Bad(source, where + ".ip", absl::StrCat(ct.ip, " is used twice"));
    }
    if (!hostnames.insert(ct.hostname).second) {
      return Bad(source, where + ".hostname", absl::StrCat(ct.hostname, " is used twice"));
    }
    if (ct.gpu >= 0 && !gpus.insert(ct.gpu).second) {
      return Bad(source, where + ".gpu", absl::StrCat("GPU ", ct.gpu, " is given to two workers"));
    }
  }
  if (coordinators != 1) {
    return Bad(source, "containers",
               absl::StrCat("needs exactly one coordinator container, found ", coordinators));
  }
  if (workers == 0) return Bad(source, "containers", "needs at least one worker container");
  return c;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Commands.

std::string Quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789@%+=:,./-_") == std::string::npos) {
    return s;
  }
  return "'" + absl::StrReplaceAll(s, {{"'", "'\\''"}}) + "'";
}

struct CommandResult {
  int exit_code = -1;
  std::string output;
};

CommandResult RunShell(const std::string& command) {
  CommandResult r;
  FILE* pipe = popen(("( " + command + " ) 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) r.output.append(buffer, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// One change: `check` (exit 0: already so; empty: always act) and `action`, both shell commands
// for the Proxmox host, or for this machine when `local`.
struct Step {
  std::string what;
  std::string check;
  std::string action;
  bool local = false;
};

class Runner {
 public:
  Runner(std::string host, bool dry_run) : host_(std::move(host)), dry_run_(dry_run) {}

  // On the Proxmox host.
  CommandResult Host(const std::string& command) const {
    return RunShell("ssh -o BatchMode=yes " + Quote(host_) + " " + Quote(command));
  }

  // Runs (or prints) the steps in order; the first failure ends it.
  absl::Status Apply(const std::vector<Step>& steps) {
    for (const Step& s : steps) {
      if (dry_run_) {
        // As one would type it: a compound check in a subshell.
        std::string check = s.check;
        std::string action = s.action;
        if (absl::StrContains(check, "&&") || absl::StrContains(check, "||")) {
          check = "( " + check + " )";
        }
        if (!check.empty() && (absl::StrContains(action, "&&") || absl::StrContains(action, ";"))) {
          action = "{ " + action + "; }";
        }
        std::cout << "# " << s.what << (s.local ? " (on this machine)" : "") << "\n"
                  << (check.empty() ? "" : check + " || ") << action << "\n";
        continue;
      }
      if (!s.check.empty()) {
        CommandResult c = s.local ? RunShell(s.check) : Host(s.check);
        if (!s.local && c.exit_code == 255) {  // ssh's own failure, not the check's answer
          return absl::UnavailableError(
              absl::StrCat("cannot reach the Proxmox host ", host_, " over ssh: ", c.output));
        }
        if (c.exit_code == 0) {
          std::cout << "  unchanged  " << s.what << "\n" << std::flush;
          continue;
        }
      }
      CommandResult a = s.local ? RunShell(s.action) : Host(s.action);
      if (a.exit_code != 0) {
        return absl::InternalError(absl::StrCat(s.what, ": `", s.action, "` failed with exit code ",
                                                a.exit_code, ":\n", a.output));
      }
      ++changed_;
      std::cout << "  changed    " << s.what << "\n" << std::flush;
    }
    return absl::OkStatus();
  }

  int changed() const { return changed_; }

 private:
  std::string host_;
  bool dry_run_;
  int changed_ = 0;
};

std::string Exec(int id, const std::string& command) {
  return absl::StrCat("pct exec ", id, " -- ", command);
}
std::string ExecSh(int id, const std::string& script) { return Exec(id, "sh -c " + Quote(script)); }

// ---------------------------------------------------------------------------------------------
// The local side: the job as it runs in the containers, the PKI, one bundle per container.

struct Deployment {
  PveCluster cluster;
  JobConfig job;  // as the coordinator container runs it
  std::string job_name;
  std::string state_dir;
  const PveContainer* coordinator = nullptr;
  std::vector<const PveContainer*> workers;
  std::map<int, std::string> bundle;  // container id -> bundle id
};

std::string WorkerInstance(const PveContainer& c) {
  return c.gpu >= 0 ? absl::StrCat("gpu", c.gpu) : "cpu";
}

std::string Unit(const Deployment& d, const PveContainer& c) {
  return c.role == "coordinator" ? absl::StrCat("flashdraft-coordinator@", d.job_name)
                                 : absl::StrCat("flashdraft-worker@", WorkerInstance(c));
}

std::string CoordinatorAddress(const Deployment& d) {
  return absl::StrCat(Address(d.coordinator->ip), ":", d.cluster.port);
}

// The job file's settings that the containers decide.
absl::Status AdaptJob(Deployment& d) {
  JobConfig& j = d.job;
  const std::string pki = kPki;
  std::vector<std::string> overrides = {
      absl::StrCat("output_dir=/var/lib/flashdraft/", d.job_name),
      absl::StrCat("cluster.listen=0.0.0.0:", d.cluster.port),
      absl::StrCat("cluster.max_workers=", d.workers.size()),
      "cluster.collective_interface=" + d.cluster.interface,
      "security.tls_cert=" + pki + "/coordinator.pem",
      "security.tls_key=" + pki + "/coordinator.key",
      "security.tls_ca=" + pki + "/ca.pem",
      "security.client_auth=true",
      "security.client_cert=" + pki + "/worker.pem",
      "security.client_key=" + pki + "/worker.key",
      "security.server_name=",
      "security.token_file=" + pki + "/token",
      "security.insecure=false",
  };
  if (j.cluster.min_workers > static_cast<int>(d.workers.size())) {
    overrides.push_back(absl::StrCat("cluster.min_workers=", d.workers.size()));
  }
  if (d.cluster.metrics_port > 0) {
    overrides.push_back("metrics.enabled=true");
    overrides.push_back(
        absl::StrCat("metrics.listen=", Address(d.coordinator->ip), ":", d.cluster.metrics_port));
    // Each worker on a free port of its container, listed in the job's target file under the
    // address it reaches the coordinator from.
    overrides.push_back("metrics.worker_listen=0.0.0.0:0");
  }
  return ApplyOverrides(j, overrides);
}

absl::StatusOr<std::string> Sha256Hex(const std::string& path) {
  FD_ASSIGN_OR_RETURN(std::string data, ReadFile(path));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), digest, &n, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) absl::StrAppend(&hex, absl::Hex(digest[i], absl::kZeroPad2));
  return hex;
}

absl::Status WriteMode(const std::string& path, const std::string& content, mode_t mode) {
  FD_RETURN_IF_ERROR(WriteFileAtomically(path, content));
  if (chmod(path.c_str(), mode) != 0) return absl::InternalError("chmod " + path);
  return absl::OkStatus();
}

// install.sh of a bundle: puts its files in place (idempotent), points /opt/flashdraft/current at
// it (the one it replaces becomes /opt/flashdraft/previous, for rollback) and restarts the unit
// when it is enabled (deployed before). --check: exit 0 when all of that is already so.
std::string InstallScript(const std::string& unit) {
  return absl::StrReplaceAll(R"sh(#!/bin/sh
# Installs this flashdraft bundle into the container (written by flashdraft pve; docs/DEPLOY.md).
# --check: exit 0 when it is installed as it is.
set -eu
b=$(cd "$(dirname "$0")" && pwd)
unit=@UNIT@
installed() {
  id -u flashdraft >/dev/null 2>&1 || return 1
  [ "$(readlink @OPT@/current 2>/dev/null)" = "$b" ] || return 1
  for f in $(cd "$b/etc" && find . -type f); do cmp -s "$b/etc/$f" "@ETC@/$f" || return 1; done
  for f in $(cd "$b/systemd" && ls); do cmp -s "$b/systemd/$f" "/etc/systemd/system/$f" || return 1; done
}
if [ "${1:-}" = --check ]; then installed; exit $?; fi
installed && exit 0
id -u flashdraft >/dev/null 2>&1 ||
  useradd --system --home-dir /var/lib/flashdraft --no-create-home --shell /usr/sbin/nologin flashdraft
mkdir -p @ETC@
cp -R "$b/etc/." @ETC@/
chown -R root:flashdraft @ETC@
chmod 750 @ETC@ @ETC@/pki
find @ETC@ -type f -exec chmod 640 {} +
cp "$b/systemd/"*.service /etc/systemd/system/
old=$(readlink @OPT@/current 2>/dev/null || true)
if [ "$old" != "$b" ]; then
  [ -n "$old" ] && echo "$old" >@OPT@/previous
  ln -sfn "$b" @OPT@/current.new && mv -T @OPT@/current.new @OPT@/current
fi
systemctl daemon-reload
# A deployed unit runs what it was given: restarted on a new bundle (a coordinator checkpoints at
# SIGTERM and resumes; a worker leaves at a step boundary and joins again).
if systemctl is-enabled --quiet "$unit"; then systemctl restart "$unit"; fi
)sh",
                             {{"@UNIT@", unit}, {"@OPT@", kOpt}, {"@ETC@", kEtc}});
}

// train.blas_kernel as a line of a unit's EnvironmentFile= ("" when the job does not pin one):
// OpenBLAS reads OPENBLAS_CORETYPE only when it loads, and a process in a container inherits
// nothing of the environment of the machine that deployed it.
std::string BlasKernelEnv(const JobConfig& job) {
  if (job.train.blas_kernel.empty()) return "";
  return absl::StrCat("OPENBLAS_CORETYPE=", job.train.blas_kernel, "\n");
}

// A bundle directory for container `c` under state/bundles, tarred; its id is the tar's SHA-256.
absl::Status MakeBundle(Deployment& d, const PveContainer& c, const std::string& bin_dir,
                        const std::string& deploy_dir) {
  const bool coordinator = c.role == "coordinator";
  const std::string dir = absl::StrCat(d.state_dir, "/bundles/ct", c.id);
  std::error_code ec;
  fs::remove_all(dir, ec);
  for (const char* sub : {"bin", "systemd", "etc/pki"}) fs::create_directories(dir + "/" + sub, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  chmod(dir.c_str(), 0755);
  chmod((dir + "/etc").c_str(), 0700);
  // Binaries without their debug sections (~60 MB -> ~2 MB each) when strip is here.
  const bool strip = RunShell("command -v strip").exit_code == 0;
  for (const std::string& b :
       {std::string("flashdraft"),
        std::string(coordinator ? "flashdraft-coordinator" : "flashdraft-worker")}) {
    const std::string from = bin_dir + "/" + b, to = dir + "/bin/" + b;
    if (access(from.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(from, " not found (build it first)"));
    }
    CommandResult r =
        RunShell(strip ? absl::StrCat("strip --strip-debug -o ", Quote(to), " ", Quote(from))
                       : absl::StrCat("cp ", Quote(from), " ", Quote(to)));
    if (r.exit_code != 0)
      return absl::InternalError(absl::StrCat("copying ", from, ": ", r.output));
  }
  // The unit, run from the bundle that is current.
  const std::string unit_file =
      coordinator ? "flashdraft-coordinator@.service" : "flashdraft-worker@.service";
  FD_ASSIGN_OR_RETURN(std::string unit, ReadFile(deploy_dir + "/systemd/" + unit_file));
  FD_RETURN_IF_ERROR(WriteMode(
      dir + "/systemd/" + unit_file,
      absl::StrReplaceAll(unit, {{"/usr/local/bin/", absl::StrCat(kOpt, "/current/bin/")}}), 0644));
  // Configuration and the PKI pieces this role needs.
  const std::string pki = d.state_dir + "/pki";
  std::vector<std::string> pki_files = {"ca.pem", "token", "worker.pem", "worker.key"};
  if (coordinator) {
    pki_files.push_back("coordinator.pem");
    pki_files.push_back("coordinator.key");
    FD_RETURN_IF_ERROR(
        WriteMode(absl::StrCat(dir, "/etc/", d.job_name, ".yaml"), JobConfigToYaml(d.job), 0600));
    FD_RETURN_IF_ERROR(
        WriteMode(absl::StrCat(dir, "/etc/", d.job_name, ".env"),
                  absl::StrCat("FLASHDRAFT_COORDINATOR_ARGS=\n", BlasKernelEnv(d.job)), 0600));
  } else {
    FD_RETURN_IF_ERROR(
        WriteMode(dir + "/etc/worker.env",
                  absl::StrCat("FLASHDRAFT_COORDINATOR=", CoordinatorAddress(d), "\n",
                               "FLASHDRAFT_WORKER_ARGS=--tls-ca ", kPki, "/ca.pem --tls-cert ",
                               kPki, "/worker.pem --tls-key ", kPki, "/worker.key --token-file ",
                               kPki, "/token\n", BlasKernelEnv(d.job)),
                  0600));
    std::string env = absl::StrCat("NCCL_SOCKET_IFNAME=", d.cluster.interface,
                                   "\nGLOO_SOCKET_IFNAME=", d.cluster.interface, "\n");
    // The container sees only its own GPU (one device node passed through): CUDA's device 0.
    if (c.gpu >= 0) absl::StrAppend(&env, "CUDA_VISIBLE_DEVICES=0\n");
    FD_RETURN_IF_ERROR(
        WriteMode(absl::StrCat(dir, "/etc/worker-", WorkerInstance(c), ".env"), env, 0600));
  }
  for (const std::string& f : pki_files) {
    FD_ASSIGN_OR_RETURN(std::string content, ReadFile(pki + "/" + f));
    FD_RETURN_IF_ERROR(WriteMode(dir + "/etc/pki/" + f, content, 0600));
  }
  FD_RETURN_IF_ERROR(WriteMode(dir + "/install.sh", InstallScript(Unit(d, c)), 0755));
  // What the binaries need at run time (Debian package names), for a container without them.
  FD_ASSIGN_OR_RETURN(std::string packages, ReadFile(deploy_dir + "/runtime-packages.txt"));
  FD_RETURN_IF_ERROR(WriteMode(dir + "/runtime-packages.txt", packages, 0644));
  // A deterministic tar: the same files give the same bundle id.
  const std::string tar = dir + ".tar";
  CommandResult r =
      RunShell(absl::StrCat("tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C ",
                            Quote(dir), " -cf ", Quote(tar), " ."));
  if (r.exit_code != 0) return absl::InternalError(absl::StrCat("tar of ", dir, ": ", r.output));
  chmod(tar.c_str(), 0600);  // it holds private keys and the job secret
  FD_ASSIGN_OR_RETURN(std::string sha, Sha256Hex(tar));
  const std::string id = absl::StrCat("ct", c.id, "-", sha.substr(0, 12));
  fs::rename(tar, absl::StrCat(d.state_dir, "/bundles/", id, ".tar"), ec);
  if (ec) return absl::InternalError(absl::StrCat("rename ", tar, ": ", ec.message()));
  d.bundle[c.id] = id;
  return absl::OkStatus();
}

absl::StatusOr<Deployment> Prepare(const PveOptions& o, bool build_bundles) {
  Deployment d;
  FD_ASSIGN_OR_RETURN(std::string text, ReadFile(o.cluster_path));
  FD_ASSIGN_OR_RETURN(d.cluster, ParsePveCluster(text, o.cluster_path));
  for (const PveContainer& c : d.cluster.containers) {
    if (c.role == "coordinator") {
      d.coordinator = &c;
    } else {
      d.workers.push_back(&c);
    }
  }
  // The job, checked as the containers will run it, before anything is touched.
  FD_ASSIGN_OR_RETURN(d.job, LoadJobConfig(o.job_path));
  d.job_name = d.job.name;
  if (!IsSafeName(d.job_name) || d.job_name.find('.') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.job_path, ": name: '", d.job_name,
        "' names the systemd unit and the state directory: letters, digits, - and _ only"));
  }
  FD_RETURN_IF_ERROR(AdaptJob(d));
  FD_RETURN_IF_ERROR(
      ValidateJobConfig(d.job, absl::StrCat(o.job_path, " as deployed by ", o.cluster_path)));
  d.state_dir =
      o.state_dir.empty()
          ? (fs::absolute(o.cluster_path).parent_path() / ("flashdraft-pve-" + d.job_name)).string()
          : o.state_dir;
  if (!build_bundles) return d;
  std::error_code ec;
  fs::create_directories(d.state_dir + "/bundles", ec);
  chmod(d.state_dir.c_str(), 0700);  // the job's keys and secret are in here
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create ", d.state_dir, ": ", ec.message()));
  // The job's PKI, made once and kept: the coordinator's certificate names its address.
  CommandResult certs = RunShell(
      absl::StrCat(Quote(o.deploy_dir + "/make-certs.sh"), " ", Quote(d.state_dir + "/pki"),
                   " --ip ", Address(d.coordinator->ip), " --name ", d.coordinator->hostname));
  if (certs.exit_code != 0) {
    return absl::InternalError("deploy/make-certs.sh failed:\n" + certs.output);
  }
  std::error_code exe_ec;
  const std::string bin_dir = fs::read_symlink("/proc/self/exe", exe_ec).parent_path().string();
  for (const PveContainer& c : d.cluster.containers) {
    FD_RETURN_IF_ERROR(MakeBundle(d, c, bin_dir, o.deploy_dir));
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// The steps on the Proxmox host.

std::string ConfigHas(int id, const std::string& line) {
  return absl::StrCat("pct config ", id, " | grep -qxF ", Quote(line));
}

// The lines a worker's container config gets for its GPU (and /dev/shm): Proxmox 8.2+ device
// entries, or the classic cgroup rules and bind mounts (the nvidia-uvm major is read from the
// host's /proc/devices when the command runs).
std::vector<Step> GpuSteps(const Deployment& d, const PveContainer& c) {
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
    std::string lines =
        "lxc.cgroup2.devices.allow: c 195:* rwm\n"
        "lxc.cgroup2.devices.allow: c $uvm:* rwm\n";
    for (const std::string& n : nodes) {
      absl::StrAppend(&lines, "lxc.mount.entry: ", n, " ", n.substr(1),
                      " none bind,optional,create=file\n");
    }
    steps.push_back(
        {absl::StrCat("CT ", c.id, ": GPU ", c.gpu, " (cgroup rules and device binds)"),
         absl::StrCat("grep -qxF ",
                      Quote(absl::StrCat("lxc.mount.entry: ", nodes[0], " ", nodes[0].substr(1),
                                         " none bind,optional,create=file")),
                      " ", conf),
         absl::StrCat("uvm=$(awk '$2 == \"nvidia-uvm\" {print $1}' /proc/devices); "
                      "[ -n \"$uvm\" ] || { echo 'no nvidia-uvm in /proc/devices: load the NVIDIA "
                      "driver on the host (modprobe nvidia-uvm)' >&2; exit 1; }; "
                      "printf '%b' \"",
                      absl::StrReplaceAll(lines, {{"\n", "\\n"}}), "\" >>", conf)});
  }
  if (d.cluster.shm_gb > 0 && c.role == "worker") {
    const std::string line =
        absl::StrCat("lxc.mount.entry: tmpfs dev/shm tmpfs size=", d.cluster.shm_gb,
                     "G,nosuid,nodev,create=dir 0 0");
    steps.push_back({absl::StrCat("CT ", c.id, ": /dev/shm of ", d.cluster.shm_gb, " GiB"),
                     absl::StrCat("grep -qxF ", Quote(line), " ", conf),
                     absl::StrCat("echo ", Quote(line), " >>", conf)});
  }
  return steps;
}

std::vector<Step> ContainerSteps(const Deployment& d, const PveContainer& c) {
  const PveCluster& k = d.cluster;
  std::string net = absl::StrCat("name=", k.interface, ",bridge=", k.bridge, ",ip=", c.ip);
  if (!k.gateway.empty()) absl::StrAppend(&net, ",gw=", k.gateway);
  const std::string ct = absl::StrCat("CT ", c.id, " (", c.role, " ", c.hostname, ")");
  std::vector<Step> steps = {
      {ct + ": create", absl::StrCat("pct status ", c.id, " >/dev/null 2>&1"),
       absl::StrCat("pct create ", c.id, " ", k.ostemplate, " --hostname ", c.hostname, " --cores ",
                    c.cores, " --memory ", c.memory_mb, " --net0 ", net, " --rootfs ", k.storage,
                    ":", k.disk_gb, " --unprivileged 0 --features nesting=1 --onboot 1")},
      {ct + ": cores and memory",
       ConfigHas(c.id, absl::StrCat("cores: ", c.cores)) + " && " +
           ConfigHas(c.id, absl::StrCat("memory: ", c.memory_mb)),
       absl::StrCat("pct set ", c.id, " --cores ", c.cores, " --memory ", c.memory_mb)},
      // Proxmox adds hwaddr and type to net0: look for the parts this file sets.
      {ct + ": network",
       absl::StrCat("pct config ", c.id, " | grep '^net0: ' | tr ' ,' '\\n\\n' | grep -cxF",
                    absl::StrJoin(absl::StrSplit(net, ','), "",
                                  [](std::string* out, absl::string_view p) {
                                    absl::StrAppend(out, " -e ", p);
                                  }),
                    " | grep -qx ", std::count(net.begin(), net.end(), ',') + 1),
       absl::StrCat("pct set ", c.id, " --net0 ", net)},
  };
  for (size_t i = 0; i < c.mounts.size(); ++i) {
    const PveMount& m = c.mounts[i];
    const std::string spec = absl::StrCat(m.host, ",mp=", m.path, m.read_only ? ",ro=1" : "");
    steps.push_back({absl::StrCat(ct, ": mount ", m.host, " at ", m.path),
                     ConfigHas(c.id, absl::StrCat("mp", i, ": ", spec)),
                     absl::StrCat("pct set ", c.id, " --mp", i, " ", spec)});
  }
  for (Step& s : GpuSteps(d, c)) steps.push_back(std::move(s));
  steps.push_back({ct + ": running",
                   absl::StrCat("pct status ", c.id, " | grep -q 'status: running'"),
                   absl::StrCat("pct start ", c.id)});
  return steps;
}

// The bundle onto the host (once) and into the container, its runtime libraries, its install.
std::vector<Step> BundleSteps(const Deployment& d, const PveContainer& c, const std::string& host) {
  const std::string id = d.bundle.at(c.id);
  const std::string on_host = absl::StrCat(kHostCache, "/", id, ".tar");
  const std::string local = absl::StrCat(d.state_dir, "/bundles/", id, ".tar");
  const std::string dir = absl::StrCat(kOpt, "/bundles/", id);
  const std::string ct = absl::StrCat("CT ", c.id);
  return {
      {absl::StrCat("bundle ", id, ": copy to the Proxmox host"),
       absl::StrCat("ssh -o BatchMode=yes ", Quote(host), " test -f ", on_host),
       absl::StrCat("ssh -o BatchMode=yes ", Quote(host), " ",
                    Quote(absl::StrCat("mkdir -p ", kHostCache, " && umask 077 && cat >", on_host,
                                       ".part && mv ", on_host, ".part ", on_host)),
                    " <", Quote(local)),
       /*local=*/true},
      {absl::StrCat(ct, ": bundle ", id), Exec(c.id, absl::StrCat("test -f ", dir, "/.complete")),
       absl::StrCat("pct push ", c.id, " ", on_host, " /var/tmp/", id, ".tar && ",
                    ExecSh(c.id, absl::StrCat("mkdir -p ", dir, " && tar -xf /var/tmp/", id,
                                              ".tar -C ", dir, " && rm /var/tmp/", id,
                                              ".tar && touch ", dir, "/.complete")))},
      {ct + ": runtime libraries", Exec(c.id, dir + "/bin/flashdraft version"),
       ExecSh(c.id,
              "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
              "--no-install-recommends $(cat " +
                  dir + "/runtime-packages.txt)")},
      {absl::StrCat(ct, ": install ", id), Exec(c.id, dir + "/install.sh --check"),
       Exec(c.id, dir + "/install.sh")},
  };
}

// The coordinator is enabled and started once; a new bundle restarts it (install.sh). A finished
// job's coordinator stays down. Workers run whenever their coordinator does.
Step ServiceStep(const Deployment& d, const PveContainer& c) {
  const std::string unit = Unit(d, c);
  std::string check = Exec(c.id, "systemctl is-enabled --quiet " + unit);
  if (c.role == "worker") {
    check = absl::StrCat(
        Exec(c.id, "systemctl is-active --quiet " + unit), " || ! ",
        Exec(d.coordinator->id, "systemctl is-active --quiet " + Unit(d, *d.coordinator)));
  }
  return {absl::StrCat("CT ", c.id, ": ", unit, c.role == "worker" ? " running" : " enabled"),
          check, Exec(c.id, "systemctl enable --now --quiet " + unit)};
}

std::string StatusCommand(const Deployment& d, bool json = false) {
  return Exec(d.coordinator->id,
              absl::StrCat(kOpt, "/current/bin/flashdraft status 127.0.0.1:", d.cluster.port,
                           " --job ", kEtc, "/", d.job_name, ".yaml", json ? " --json" : ""));
}

// The workers in the current epoch from `flashdraft status --json` (and the job's state), or -1.
int JoinedWorkers(const std::string& status_json, std::string* state) {
  const nlohmann::json reply = nlohmann::json::parse(status_json, nullptr, false);
  if (!reply.is_object() || !reply.contains("world_size") || !reply["world_size"].is_number()) {
    return -1;
  }
  if (state != nullptr && reply.contains("state") && reply["state"].is_string()) {
    *state = reply["state"].get<std::string>();
  }
  return reply["world_size"].get<int>();
}

int Fail(const std::string& command, const absl::Status& s) {
  std::cerr << "flashdraft pve " << command << ": error: " << s.message() << "\n";
  return 1;
}

int Deploy(const PveOptions& o) {
  absl::StatusOr<Deployment> prepared = Prepare(o, /*build_bundles=*/true);
  if (!prepared.ok()) return Fail(o.command, prepared.status());
  Deployment& d = *prepared;
  Runner run(d.cluster.host, o.dry_run);
  std::cout << "# flashdraft pve deploy: job '" << d.job_name << "' on " << d.cluster.host << ", "
            << "coordinator CT " << d.coordinator->id << " and " << d.workers.size()
            << " worker CT(s); commands run on the Proxmox host over ssh\n";
  std::vector<Step> steps;
  for (const PveContainer& c : d.cluster.containers) {
    for (Step& s : ContainerSteps(d, c)) steps.push_back(std::move(s));
  }
  for (const PveContainer& c : d.cluster.containers) {
    for (Step& s : BundleSteps(d, c, d.cluster.host)) steps.push_back(std::move(s));
  }
  steps.push_back(ServiceStep(d, *d.coordinator));
  for (const PveContainer* w : d.workers) steps.push_back(ServiceStep(d, *w));
  if (absl::Status s = run.Apply(steps); !s.ok()) return Fail(o.command, s);
  const std::string metrics = d.cluster.metrics_port > 0
                                  ? absl::StrCat("http://", Address(d.coordinator->ip), ":",
                                                 d.cluster.metrics_port, "/metrics")
                                  : "off (metrics_port: 0)";
  if (o.dry_run) {
    std::cout << "# until every worker has joined (up to " << o.join_timeout_seconds << " s)\n"
              << StatusCommand(d, /*json=*/true) << "\n";
    return 0;
  }
  // Every worker joined, or the job is already over (its coordinator exited 0).
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(o.join_timeout_seconds * 1e3));
  const std::string coordinator_unit = Unit(d, *d.coordinator);
  std::string last, state;
  while (true) {
    CommandResult r = run.Host(StatusCommand(d, /*json=*/true));
    last = r.output;
    state.clear();
    const int joined = r.exit_code == 0 ? JoinedWorkers(r.output, &state) : -1;
    if (joined == static_cast<int>(d.workers.size()) || state == "done") break;
    if (r.exit_code != 0) {
      // "inactive success": the job is over and its coordinator exited 0.
      const std::string unit_state = std::string(absl::StripAsciiWhitespace(
          run.Host(ExecSh(d.coordinator->id,
                          absl::StrCat("echo $(systemctl is-active ", coordinator_unit,
                                       ") $(systemctl show -p Result --value ", coordinator_unit,
                                       ")")))
              .output));
      if (unit_state == "inactive success") {
        state = "done";
        break;
      }
      if (absl::StartsWith(unit_state, "failed")) {
        return Fail(o.command,
                    absl::InternalError(absl::StrCat(
                        coordinator_unit, " failed in CT ", d.coordinator->id, ":\n",
                        run.Host(Exec(d.coordinator->id,
                                      "journalctl -n 20 --no-pager -u " + coordinator_unit))
                            .output)));
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Fail(o.command,
                  absl::DeadlineExceededError(absl::StrCat(
                      "not every worker joined within ", o.join_timeout_seconds,
                      " s; the coordinator says:\n", last,
                      "\n(journalctl -u flashdraft-worker@... inside the worker containers)")));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  std::cout << "flashdraft pve: job '" << d.job_name << "' "
            << (state == "done" ? "finished" : "runs") << ": coordinator " << CoordinatorAddress(d)
            << " (CT " << d.coordinator->id << "), " << d.workers.size() << " worker(s); "
            << run.changed() << " change(s)\n"
            << "  /metrics: " << metrics << "\n"
            << "  status:   flashdraft pve status " << o.cluster_path << " " << o.job_path << "\n";
  return 0;
}

int Status(const PveOptions& o) {
  absl::StatusOr<Deployment> prepared = Prepare(o, /*build_bundles=*/false);
  if (!prepared.ok()) return Fail(o.command, prepared.status());
  const Deployment& d = *prepared;
  Runner run(d.cluster.host, false);
  for (const PveContainer& c : d.cluster.containers) {
    CommandResult ct = run.Host(absl::StrCat("pct status ", c.id));
    CommandResult unit = run.Host(Exec(c.id, "systemctl is-active " + Unit(d, c)));
    std::cout << "CT " << c.id << " " << c.hostname << " (" << c.role
              << "): " << absl::StripAsciiWhitespace(ct.output) << ", " << Unit(d, c) << " "
              << absl::StripAsciiWhitespace(unit.output) << "\n";
  }
  CommandResult r = run.Host(StatusCommand(d));
  std::cout << r.output;
  return r.exit_code == 0 ? 0 : 1;
}

// One step per container, in `order` (workers first: the coordinator last), run or printed.
int ApplyPerContainer(const PveOptions& o, bool workers_first,
                      const std::function<Step(const Deployment&, const PveContainer&)>& step) {
  absl::StatusOr<Deployment> prepared = Prepare(o, /*build_bundles=*/false);
  if (!prepared.ok()) return Fail(o.command, prepared.status());
  const Deployment& d = *prepared;
  std::vector<const PveContainer*> order = d.workers;
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

// Workers first, then the coordinator (SIGTERM: it commits the step in flight and checkpoints).
int Stop(const PveOptions& o) {
  return ApplyPerContainer(o, /*workers_first=*/true,
                           [](const Deployment& d, const PveContainer& c) -> Step {
                             const std::string unit = Unit(d, c);
                             return {absl::StrCat("CT ", c.id, ": ", unit, " stopped and disabled"),
                                     ExecSh(c.id, "! systemctl is-enabled --quiet " + unit +
                                                      " && ! systemctl is-active --quiet " + unit),
                                     Exec(c.id, "systemctl disable --now --quiet " + unit)};
                           });
}

// Every container back to the bundle it ran before the last change (its install.sh again, which
// restarts the unit and makes the undone bundle the previous one: a second rollback undoes the
// first). A container whose bundle never changed has nothing to go back to.
int Rollback(const PveOptions& o) {
  return ApplyPerContainer(
      o, /*workers_first=*/false, [](const Deployment&, const PveContainer& c) -> Step {
        return {absl::StrCat("CT ", c.id, ": back to the previous bundle"),
                Exec(c.id, absl::StrCat("test ! -s ", kOpt, "/previous")),
                ExecSh(c.id, absl::StrCat("p=$(cat ", kOpt,
                                          "/previous 2>/dev/null) && [ -x \"$p/install.sh\" ] "
                                          "|| { echo 'no previous bundle to go back to' >&2; "
                                          "exit 1; }; \"$p/install.sh\""))};
      });
}

}  // namespace

std::string FindDeployDir() {
  std::error_code ec;
  const fs::path bin = fs::read_symlink("/proc/self/exe", ec).parent_path();
  for (const fs::path& dir : {bin / "../share/flashdraft/deploy", bin / "../../deploy"}) {
    if (fs::exists(dir / "make-certs.sh", ec)) return fs::weakly_canonical(dir, ec).string();
  }
  return "";
}

int RunPve(const PveOptions& o) {
  if (o.deploy_dir.empty() || !fs::exists(o.deploy_dir + "/make-certs.sh")) {
    std::cerr << "flashdraft pve: error: no deploy directory (with make-certs.sh and systemd/) at '"
              << o.deploy_dir << "': pass --deploy-dir\n";
    return 2;
  }
  if (o.command == "deploy") return Deploy(o);
  if (o.command == "status") return Status(o);
  if (o.command == "stop") return Stop(o);
  if (o.command == "rollback") return Rollback(o);
  std::cerr << "flashdraft pve: unknown command '" << o.command << "'\n";
  return 2;
}

}  // namespace flashdraft
