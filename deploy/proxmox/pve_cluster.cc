#include "deploy/proxmox/pve_cluster.h"

#include <arpa/inet.h>

#include <cctype>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/yaml_fields.h"

namespace flashdraft {
namespace {

// a.b.c.d/n
bool IsIpv4WithPrefix(const std::string& s) {
  std::pair<std::string, std::string> parts = absl::StrSplit(s, absl::MaxSplits('/', 1));
  in_addr addr{};
  int prefix = 0;
  return inet_pton(AF_INET, parts.first.c_str(), &addr) == 1 &&
         absl::SimpleAtoi(parts.second, &prefix) && prefix >= 1 && prefix <= 32;
}

bool IsSafePath(const std::string& s) { return !s.empty() && s[0] == '/' && IsSafePveName(s, "/"); }

// `what`, made of the characters IsSafePveName allows with `extra`.
FieldCheck<std::string> SafeName(std::string extra, std::string what, size_t max_size = 200) {
  return [extra, what, max_size](const std::string& v) -> std::optional<std::string> {
    if (IsSafePveName(v, extra) && v.size() <= max_size) return std::nullopt;
    std::vector<std::string> allowed = {"-", "_", "."};
    for (char c : extra) allowed.push_back(std::string(1, c));
    return absl::StrCat("must be ", what, " of letters, digits and ", absl::StrJoin(allowed, " "),
                        " (at most ", max_size, ")");
  };
}

FieldCheck<std::string> AbsolutePath() {
  return [](const std::string& v) -> std::optional<std::string> {
    if (IsSafePath(v)) return std::nullopt;
    return std::string("must be an absolute path of letters, digits and - _ . /");
  };
}

FieldCheck<std::string> Ipv4WithPrefix() {
  return [](const std::string& v) -> std::optional<std::string> {
    if (IsIpv4WithPrefix(v)) return std::nullopt;
    return std::string("is not an IPv4 address with a prefix (a.b.c.d/n)");
  };
}

FieldCheck<std::string> Gateway() {
  return [](const std::string& v) -> std::optional<std::string> {
    if (v.empty() || IsIpv4WithPrefix(v + "/32")) return std::nullopt;
    return std::string("is not an IPv4 address");
  };
}

FieldCheck<std::string> GpuPassthrough() {
  return [](const std::string& v) -> std::optional<std::string> {
    if (v == "dev" || v == "cgroup") return std::nullopt;
    return std::string("must be dev (Proxmox 8.2+) or cgroup");
  };
}

const std::vector<Field<PveMount>>& MountFields() {
  static const auto* fields = new std::vector<Field<PveMount>>{
      MemberField("host", &PveMount::host, AbsolutePath()),
      MemberField("path", &PveMount::path, AbsolutePath()),
      MemberField("read_only", &PveMount::read_only),
  };
  return *fields;
}

absl::Status FinishMount(PveMount& m, const std::string& source, const std::string& where) {
  if (m.host.empty() || m.path.empty())
    return FieldError(source, where, "needs both host and path");
  return absl::OkStatus();
}

const std::vector<Field<PveContainer>>& ContainerFields() {
  static const auto* fields = new std::vector<Field<PveContainer>>{
      MemberField("id", &PveContainer::id, Between(100, 999999999)),
      MemberField("role", &PveContainer::role, OneOf({"coordinator", "worker", "feeder"})),
      MemberField("ip", &PveContainer::ip, Ipv4WithPrefix()),
      MemberField("hostname", &PveContainer::hostname, SafeName("", "a host name", 63)),
      MemberField("cores", &PveContainer::cores, Between(1, 8192)),
      MemberField("memory_mb", &PveContainer::memory_mb, Between(256, 1 << 30)),
      MemberField("gpu", &PveContainer::gpu, Between(0, 255)),
      MemberListField<PveMount>("mounts", &PveContainer::mounts, &MountFields, &FinishMount),
  };
  return *fields;
}

// The fields every container names, its default host name.
absl::Status FinishContainer(PveContainer& c, const std::string& source, const std::string& where) {
  if (c.id == 0) return FieldError(source, where + ".id", "is required");
  if (c.role.empty()) return FieldError(source, where + ".role", "is required");
  if (c.ip.empty()) return FieldError(source, where + ".ip", "is required");
  if (c.role == "coordinator" && c.gpu >= 0) {
    return FieldError(source, where + ".gpu",
                      "is for workers and feeders only: the coordinator takes no GPU");
  }
  if (c.hostname.empty()) c.hostname = absl::StrCat("flashdraft-", c.id);
  return absl::OkStatus();
}

const std::vector<Field<PveCluster>>& ClusterFields() {
  static const auto* fields = new std::vector<Field<PveCluster>>{
      MemberField("host", &PveCluster::host, SafeName("@:", "an ssh destination")),
      MemberField("template", &PveCluster::ostemplate, SafeName(":/", "a container template")),
      MemberField("storage", &PveCluster::storage, SafeName("", "a storage name")),
      MemberField("disk_gb", &PveCluster::disk_gb, Between(1, 1 << 20)),
      MemberField("bridge", &PveCluster::bridge, SafeName("", "a bridge name")),
      MemberField("gateway", &PveCluster::gateway, Gateway()),
      MemberField("interface", &PveCluster::interface, SafeName("", "an interface name")),
      MemberField("port", &PveCluster::port, Between(1, 65535)),
      MemberField("feeder_port", &PveCluster::feeder_port, Between(1, 65535)),
      MemberField("metrics_port", &PveCluster::metrics_port, Between(0, 65535)),
      MemberField("gpu_passthrough", &PveCluster::gpu_passthrough, GpuPassthrough()),
      MemberField("shm_gb", &PveCluster::shm_gb, Between(0, 1 << 20)),
      MemberField("pve_config_dir", &PveCluster::pve_config_dir, AbsolutePath()),
      MemberListField<PveContainer>("containers", &PveCluster::containers, &ContainerFields,
                                    &FinishContainer),
  };
  return *fields;
}

// One coordinator, at least one worker, any number of feeders; ids, addresses, host names and GPUs
// each used once.
absl::Status CheckContainers(const PveCluster& c, const std::string& source) {
  int coordinators = 0, workers = 0;
  std::set<int> ids, gpus;
  std::set<std::string> ips, hostnames;
  for (size_t i = 0; i < c.containers.size(); ++i) {
    const PveContainer& ct = c.containers[i];
    const std::string where = absl::StrCat("containers[", i, "]");
    if (ct.role == "coordinator") ++coordinators;
    if (ct.role == "worker") ++workers;
    if (!ids.insert(ct.id).second) {
      return FieldError(source, where + ".id", absl::StrCat("= ", ct.id, " is used twice"));
    }
    if (!ips.insert(PveAddress(ct.ip)).second) {
      return FieldError(source, where + ".ip", absl::StrCat("= ", ct.ip, " is used twice"));
    }
    if (!hostnames.insert(ct.hostname).second) {
      return FieldError(source, where + ".hostname",
                        absl::StrCat("= ", ct.hostname, " is used twice"));
    }
    if (ct.gpu >= 0 && !gpus.insert(ct.gpu).second) {
      return FieldError(
          source, where + ".gpu",
          absl::StrCat("= ", ct.gpu, ": GPU ", ct.gpu, " is given to two containers"));
    }
  }
  if (coordinators != 1) {
    return FieldError(
        source, "containers",
        absl::StrCat("needs exactly one coordinator container, found ", coordinators));
  }
  if (workers == 0) return FieldError(source, "containers", "needs at least one worker container");
  return absl::OkStatus();
}

}  // namespace

bool IsSafePveName(const std::string& s, const std::string& extra) {
  if (s.empty() || s.size() > 200) return false;
  for (char c : s) {
    if (!isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' &&
        extra.find(c) == std::string::npos) {
      return false;
    }
  }
  return true;
}

std::string PveAddress(const std::string& ip_with_prefix) {
  return ip_with_prefix.substr(0, ip_with_prefix.find('/'));
}

absl::StatusOr<PveCluster> ParsePveCluster(const std::string& yaml_text,
                                           const std::string& source) {
  FD_ASSIGN_OR_RETURN(const YAML::Node root, LoadYaml(yaml_text, source));
  PveCluster c;
  FD_RETURN_IF_ERROR(ReadMapping(root, ClusterFields(), "", source, "", c));
  if (c.host.empty()) {
    return FieldError(source, "host", "is required (the Proxmox host's ssh destination)");
  }
  if (c.ostemplate.empty()) {
    return FieldError(source, "template",
                      "is required (a container template, e.g. "
                      "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst)");
  }
  FD_RETURN_IF_ERROR(CheckContainers(c, source));
  return c;
}

}  // namespace flashdraft
