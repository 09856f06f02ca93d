#include "deploy/proxmox/pve_deployment.h"

#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "common/yaml_fields.h"
#include "deploy/proxmox/pve_runner.h"

namespace flashdraft {
namespace {

namespace fs = std::filesystem;

// A worker's or a feeder's unit instance: its GPU, or cpu.
std::string DeviceInstance(const PveContainer& c) {
  return c.gpu >= 0 ? absl::StrCat("gpu", c.gpu) : "cpu";
}

// The job file's settings that the containers decide.
absl::Status AdaptJob(PveDeployment& d) {
  const std::string pki = kPvePki;
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
  // Every feeder container is one the job waits for, and there are no others: without feeder
  // containers the coordinator runs the target itself, whatever the job file said.
  overrides.push_back(absl::StrCat("cluster.min_feeders=", d.feeders.size()));
  if (d.job.cluster.min_workers > static_cast<int>(d.workers.size())) {
    overrides.push_back(absl::StrCat("cluster.min_workers=", d.workers.size()));
  }
  if (d.cluster.metrics_port > 0) {
    overrides.push_back("metrics.enabled=true");
    overrides.push_back(absl::StrCat("metrics.listen=", PveAddress(d.coordinator->ip), ":",
                                     d.cluster.metrics_port));
    // Each worker on a free port of its container, listed in the job's target file under the
    // address it reaches the coordinator from.
    overrides.push_back("metrics.worker_listen=0.0.0.0:0");
  }
  return ApplyOverrides(d.job, overrides);
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
# Installs this flashdraft bundle into the container (written by flashdraft-pve; docs/DEPLOY.md).
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
                             {{"@UNIT@", unit}, {"@OPT@", kPveOpt}, {"@ETC@", kPveEtc}});
}

// train.blas_kernel as a line of a unit's EnvironmentFile= ("" when the job does not pin one):
// OpenBLAS reads OPENBLAS_CORETYPE only when it loads, and a process in a container inherits
// nothing of the environment of the machine that deployed it.
std::string BlasKernelEnv(const JobConfig& job) {
  if (job.train.blas_kernel.empty()) return "";
  return absl::StrCat("OPENBLAS_CORETYPE=", job.train.blas_kernel, "\n");
}

// An empty bundle directory (bin, systemd, etc/pki); etc only for root, it gets the keys.
absl::Status EmptyBundleDir(const std::string& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  for (const char* sub : {"bin", "systemd", "etc/pki"}) fs::create_directories(dir + "/" + sub, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  chmod(dir.c_str(), 0755);
  chmod((dir + "/etc").c_str(), 0700);
  return absl::OkStatus();
}

// flashdraft and the role's binary (flashdraft-<role>), without their debug sections (~60 MB ->
// ~2 MB each) when strip is here; the role's unit, run from the bundle that is current.
absl::Status CopyProgram(const std::string& dir, const std::string& role,
                         const std::string& bin_dir, const std::string& deploy_dir) {
  const bool strip = RunShell("command -v strip").exit_code == 0;
  for (const std::string& b : {std::string("flashdraft"), "flashdraft-" + role}) {
    const std::string from = bin_dir + "/" + b, to = dir + "/bin/" + b;
    if (access(from.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(from, " not found (build it first)"));
    }
    ShellResult r = RunShell(
        strip ? absl::StrCat("strip --strip-debug -o ", ShellWord(to), " ", ShellWord(from))
              : absl::StrCat("cp ", ShellWord(from), " ", ShellWord(to)));
    if (r.exit_code != 0) {
      return absl::InternalError(absl::StrCat("copying ", from, ": ", r.output));
    }
  }
  const std::string unit_file = absl::StrCat("flashdraft-", role, "@.service");
  FD_ASSIGN_OR_RETURN(std::string unit, ReadFile(deploy_dir + "/systemd/" + unit_file));
  return WriteMode(
      dir + "/systemd/" + unit_file,
      absl::StrReplaceAll(unit, {{"/usr/local/bin/", absl::StrCat(kPveOpt, "/current/bin/")}}),
      0644);
}

// A worker's or feeder's per-device settings (etc/<role>-<gpuN|cpu>.env): the collective's
// interface, and the one GPU the container sees.
absl::Status WriteDeviceEnv(const PveDeployment& d, const PveContainer& c, const std::string& dir) {
  std::string env = absl::StrCat("NCCL_SOCKET_IFNAME=", d.cluster.interface,
                                 "\nGLOO_SOCKET_IFNAME=", d.cluster.interface, "\n");
  // The container sees only its own GPU (one device node passed through): CUDA's device 0.
  if (c.gpu >= 0) absl::StrAppend(&env, "CUDA_VISIBLE_DEVICES=0\n");
  return WriteMode(absl::StrCat(dir, "/etc/", c.role, "-", DeviceInstance(c), ".env"), env, 0600);
}

// etc/feeder.env: the coordinator, the job's target (at target.path: the container mounts it),
// the service workers fetch from under the feeder's own certificate, which is also its client
// certificate toward the coordinator.
absl::Status WriteFeederEnv(const PveDeployment& d, const PveContainer& c, const std::string& dir) {
  const std::string address = PveAddress(c.ip);
  const std::string cert = absl::StrCat(kPvePki, "/feeder-", address);
  return WriteMode(dir + "/etc/feeder.env",
                   absl::StrCat("FLASHDRAFT_COORDINATOR=", PveCoordinatorAddress(d), "\n",
                                "FLASHDRAFT_TARGET=", d.job.target.path, "\n",
                                "FLASHDRAFT_FEEDER_ARGS=--listen 0.0.0.0:", d.cluster.feeder_port,
                                " --advertise ", address, ":", d.cluster.feeder_port, " --tls-ca ",
                                kPvePki, "/ca.pem --tls-cert ", cert, ".pem --tls-key ", cert,
                                ".key --serve-tls-cert ", cert, ".pem --serve-tls-key ", cert,
                                ".key --token-file ", kPvePki, "/token\n", BlasKernelEnv(d.job)),
                   0600);
}

// The role's configuration in etc/; the names of the pieces of the job's PKI it needs.
absl::StatusOr<std::vector<std::string>> WriteRoleEnv(const PveDeployment& d, const PveContainer& c,
                                                      const std::string& dir) {
  if (c.role == "coordinator") {
    FD_RETURN_IF_ERROR(
        WriteMode(absl::StrCat(dir, "/etc/", d.job_name, ".yaml"), JobConfigToYaml(d.job), 0600));
    FD_RETURN_IF_ERROR(
        WriteMode(absl::StrCat(dir, "/etc/", d.job_name, ".env"),
                  absl::StrCat("FLASHDRAFT_COORDINATOR_ARGS=\n", BlasKernelEnv(d.job)), 0600));
    return std::vector<std::string>{"ca.pem",     "token",           "worker.pem",
                                    "worker.key", "coordinator.pem", "coordinator.key"};
  }
  FD_RETURN_IF_ERROR(WriteDeviceEnv(d, c, dir));
  if (c.role == "feeder") {
    FD_RETURN_IF_ERROR(WriteFeederEnv(d, c, dir));
    const std::string cert = "feeder-" + PveAddress(c.ip);
    return std::vector<std::string>{"ca.pem", "token", cert + ".pem", cert + ".key"};
  }
  FD_RETURN_IF_ERROR(WriteMode(
      dir + "/etc/worker.env",
      absl::StrCat("FLASHDRAFT_COORDINATOR=", PveCoordinatorAddress(d), "\n",
                   "FLASHDRAFT_WORKER_ARGS=--tls-ca ", kPvePki, "/ca.pem --tls-cert ", kPvePki,
                   "/worker.pem --tls-key ", kPvePki, "/worker.key --token-file ", kPvePki,
                   "/token\n", BlasKernelEnv(d.job)),
      0600));
  return std::vector<std::string>{"ca.pem", "token", "worker.pem", "worker.key"};
}

// The role's configuration in etc/ and the pieces of the job's PKI it needs in etc/pki.
absl::Status WriteRoleConfig(const PveDeployment& d, const PveContainer& c,
                             const std::string& dir) {
  FD_ASSIGN_OR_RETURN(const std::vector<std::string> pki_files, WriteRoleEnv(d, c, dir));
  for (const std::string& f : pki_files) {
    FD_ASSIGN_OR_RETURN(std::string content, ReadFile(d.state_dir + "/pki/" + f));
    FD_RETURN_IF_ERROR(WriteMode(dir + "/etc/pki/" + f, content, 0600));
  }
  return absl::OkStatus();
}

// A deterministic tar of `dir` (the same files give the same bundle id) beside it, renamed to its
// id: ct<id>-<the first 12 hex digits of its SHA-256>.
absl::StatusOr<std::string> TarBundle(const PveDeployment& d, const PveContainer& c,
                                      const std::string& dir) {
  const std::string tar = dir + ".tar";
  ShellResult r =
      RunShell(absl::StrCat("tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C ",
                            ShellWord(dir), " -cf ", ShellWord(tar), " ."));
  if (r.exit_code != 0) return absl::InternalError(absl::StrCat("tar of ", dir, ": ", r.output));
  chmod(tar.c_str(), 0600);  // it holds private keys and the job secret
  FD_ASSIGN_OR_RETURN(std::string sha, Sha256Hex(tar));
  const std::string id = absl::StrCat("ct", c.id, "-", sha.substr(0, 12));
  std::error_code ec;
  fs::rename(tar, absl::StrCat(d.state_dir, "/bundles/", id, ".tar"), ec);
  if (ec) return absl::InternalError(absl::StrCat("rename ", tar, ": ", ec.message()));
  return id;
}

// The bundle of container `c` under state/bundles.
absl::Status MakeBundle(PveDeployment& d, const PveContainer& c, const std::string& bin_dir,
                        const std::string& deploy_dir) {
  const std::string dir = absl::StrCat(d.state_dir, "/bundles/ct", c.id);
  FD_RETURN_IF_ERROR(EmptyBundleDir(dir));
  FD_RETURN_IF_ERROR(CopyProgram(dir, c.role, bin_dir, deploy_dir));
  FD_RETURN_IF_ERROR(WriteRoleConfig(d, c, dir));
  FD_RETURN_IF_ERROR(WriteMode(dir + "/install.sh", InstallScript(PveUnit(d, c)), 0755));
  // What the binaries need at run time (Debian package names), for a container without them.
  FD_ASSIGN_OR_RETURN(std::string packages, ReadFile(deploy_dir + "/runtime-packages.txt"));
  FD_RETURN_IF_ERROR(WriteMode(dir + "/runtime-packages.txt", packages, 0644));
  FD_ASSIGN_OR_RETURN(d.bundle[c.id], TarBundle(d, c, dir));
  return absl::OkStatus();
}

}  // namespace

std::string PveUnit(const PveDeployment& d, const PveContainer& c) {
  return c.role == "coordinator" ? absl::StrCat("flashdraft-coordinator@", d.job_name)
                                 : absl::StrCat("flashdraft-", c.role, "@", DeviceInstance(c));
}

std::string PveCoordinatorAddress(const PveDeployment& d) {
  return absl::StrCat(PveAddress(d.coordinator->ip), ":", d.cluster.port);
}

absl::StatusOr<PveDeployment> LoadPveDeployment(const std::string& cluster_path,
                                                const std::string& job_path,
                                                const std::string& state_dir) {
  PveDeployment d;
  FD_ASSIGN_OR_RETURN(std::string text, ReadFile(cluster_path));
  FD_ASSIGN_OR_RETURN(d.cluster, ParsePveCluster(text, cluster_path));
  for (const PveContainer& c : d.cluster.containers) {
    if (c.role == "coordinator") d.coordinator = &c;
    if (c.role == "worker") d.workers.push_back(&c);
    if (c.role == "feeder") d.feeders.push_back(&c);
  }
  FD_ASSIGN_OR_RETURN(d.job, LoadJobConfig(job_path));
  d.job_name = d.job.name;
  if (!IsSafePveName(d.job_name) || d.job_name.find('.') != std::string::npos) {
    return FieldError(job_path, "name",
                      absl::StrCat("= ", d.job_name,
                                   " names the systemd unit and the state directory: letters, "
                                   "digits, - and _ only"));
  }
  FD_RETURN_IF_ERROR(AdaptJob(d));
  FD_RETURN_IF_ERROR(
      ValidateJobConfig(d.job, absl::StrCat(job_path, " as deployed by ", cluster_path)));
  d.state_dir =
      state_dir.empty()
          ? (fs::absolute(cluster_path).parent_path() / ("flashdraft-pve-" + d.job_name)).string()
          : state_dir;
  return d;
}

absl::Status BuildPveBundles(PveDeployment& d, const std::string& deploy_dir,
                             const std::string& bin_dir) {
  std::error_code ec;
  fs::create_directories(d.state_dir + "/bundles", ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", d.state_dir, ": ", ec.message()));
  }
  chmod(d.state_dir.c_str(), 0700);  // the job's keys and secret are in here
  // The coordinator's certificate names its address, each feeder's the address workers fetch from.
  std::string make_certs =
      absl::StrCat(ShellWord(deploy_dir + "/make-certs.sh"), " ", ShellWord(d.state_dir + "/pki"),
                   " --ip ", PveAddress(d.coordinator->ip), " --name ", d.coordinator->hostname);
  for (const PveContainer* f : d.feeders)
    absl::StrAppend(&make_certs, " --feeder ", PveAddress(f->ip));
  ShellResult certs = RunShell(make_certs);
  if (certs.exit_code != 0) {
    return absl::InternalError("deploy/make-certs.sh failed:\n" + certs.output);
  }
  for (const PveContainer& c : d.cluster.containers) {
    FD_RETURN_IF_ERROR(MakeBundle(d, c, bin_dir, deploy_dir));
  }
  return absl::OkStatus();
}

}  // namespace flashdraft
