#include "deploy/proxmox/pve_cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/file_util.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

TEST(PveClusterTest, TheShippedExampleReads) {
  const std::string path =
      std::string(FLASHDRAFT_SOURCE_DIR) + "/deploy/proxmox/cluster.example.yaml";
  absl::StatusOr<std::string> text = ReadFile(path);
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<PveCluster> c = ParsePveCluster(*text, path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "root@pve1.example.com");
  EXPECT_EQ(c->bridge, "vmbr1");
  EXPECT_EQ(c->shm_gb, 16);
  ASSERT_EQ(c->containers.size(), 5u);
  EXPECT_EQ(c->containers[0].role, "coordinator");
  ASSERT_EQ(c->containers[0].mounts.size(), 1u);
  EXPECT_EQ(c->containers[0].mounts[0].path, "/srv/flashdraft");
  EXPECT_TRUE(c->containers[0].mounts[0].read_only);
  EXPECT_EQ(c->containers[4].gpu, 3);
  EXPECT_EQ(c->containers[4].memory_mb, 65536);
}

TEST(PveClusterTest, DefaultsFillWhatTheFileLeavesOut) {
  absl::StatusOr<PveCluster> c = ParsePveCluster(
      "host: root@h\ntemplate: local:vztmpl/d.tar.zst\ncontainers:\n"
      "  - {id: 200, role: coordinator, ip: 10.0.0.10/24}\n"
      "  - {id: 201, role: worker, ip: 10.0.0.11/24,\n"
      "     mounts: [{host: /srv, path: /data, read_only: false}]}\n",
      "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->storage, "local-lvm");
  EXPECT_EQ(c->port, 7600);
  EXPECT_EQ(c->metrics_port, 9400);
  EXPECT_EQ(c->gpu_passthrough, "dev");
  EXPECT_EQ(c->pve_config_dir, "/etc/pve/lxc");
  EXPECT_EQ(c->containers[1].hostname, "flashdraft-201");
  EXPECT_EQ(c->containers[1].cores, 2);
  EXPECT_EQ(c->containers[1].gpu, -1);
  EXPECT_FALSE(c->containers[1].mounts[0].read_only);
}

// Every refusal names the file, the field (with its place in a list) and the value.
TEST(PveClusterTest, BadClusterFilesAreRefusedNamingTheFieldAndValue) {
  struct Case {
    std::string yaml, want;
  };
  const std::string ok_head = "host: root@pve1\ntemplate: local:vztmpl/d.tar.zst\n";
  const std::string coordinator = "  - {id: 200, role: coordinator, ip: 10.0.0.10/24}\n";
  const std::string worker = "  - {id: 201, role: worker, ip: 10.0.0.11/24}\n";
  const std::string two = "containers:\n" + coordinator + worker;
  const std::vector<Case> cases = {
      {"[", "not valid YAML"},
      {"- a\n", "the file must be a mapping"},
      {ok_head + "hots: x\n", "unknown field 'hots' (known: host, template, storage"},
      {ok_head + "containers:\n  - {id: 200, rol: worker}\n",
       "unknown field 'containers[0].rol' (known: id, role, ip, hostname"},
      {"template: t\ncontainers: []\n", "field 'host' is required"},
      {"host: root@h\n" + two, "field 'template' is required"},
      {ok_head + "containers:\n" + worker,
       "field 'containers' needs exactly one coordinator container, found 0"},
      {ok_head + "containers:\n" + coordinator,
       "field 'containers' needs at least one worker container"},
      {ok_head + "containers: 3\n", "field 'containers' must be a list"},
      {ok_head + "containers: [3]\n", "field 'containers[0]' must be a mapping"},
      {ok_head + "containers:\n" + coordinator + "  - {id: 201, role: worker, ip: 10.0.0.300/24}\n",
       "field 'containers[1].ip' = 10.0.0.300/24 is not an IPv4 address with a prefix"},
      {ok_head + "containers:\n" + coordinator + "  - {id: 200, role: worker, ip: 10.0.0.12/24}\n",
       "field 'containers[1].id' = 200 is used twice"},
      {ok_head + "containers:\n" + coordinator + "  - {id: 201, role: worker, ip: 10.0.0.10/24}\n",
       "field 'containers[1].ip' = 10.0.0.10/24 is used twice"},
      {ok_head + "containers:\n" + coordinator + worker +
           "  - {id: 202, role: worker, ip: 10.0.0.12/24, hostname: flashdraft-201}\n",
       "field 'containers[2].hostname' = flashdraft-201 is used twice"},
      {ok_head + "containers:\n" + coordinator +
           "  - {id: 201, role: worker, ip: 10.0.0.11/24, gpu: 0}\n"
           "  - {id: 202, role: worker, ip: 10.0.0.12/24, gpu: 0}\n",
       "field 'containers[2].gpu' = 0: GPU 0 is given to two containers"},
      {ok_head + "containers:\n  - {id: 200, role: coordinator, ip: 10.0.0.10/24, gpu: 0}\n" +
           worker,
       "field 'containers[0].gpu' is for workers and feeders only"},
      {ok_head + "containers:\n  - {role: worker, ip: 10.0.0.11/24}\n",
       "field 'containers[0].id' is required"},
      {ok_head + "containers:\n  - {id: 99, role: worker, ip: 10.0.0.11/24}\n",
       "field 'containers[0].id' = 99 must be in [100, 999999999]"},
      {ok_head + "containers:\n  - {id: two, role: worker}\n",
       "field 'containers[0].id' must be an integer, got 'two'"},
      {ok_head + "gpu_passthrough: vfio\n" + two,
       "field 'gpu_passthrough' = vfio must be dev (Proxmox 8.2+) or cgroup"},
      {"host: 'root@h; rm -rf /'\ntemplate: t\n" + two,
       "field 'host' = root@h; rm -rf / must be an ssh destination of letters, digits and - _ . @ "
       ":"},
      {ok_head + "bridge: [vmbr0]\n" + two, "field 'bridge' must be a string, got '[vmbr0]'"},
      {ok_head + "gateway: 10.0.0.256\n" + two,
       "field 'gateway' = 10.0.0.256 is not an IPv4 address"},
      {ok_head + "pve_config_dir: etc/pve\n" + two,
       "field 'pve_config_dir' = etc/pve must be an absolute path"},
      {ok_head + "containers:\n" + coordinator +
           "  - {id: 201, role: worker, ip: 10.0.0.11/24, mounts: [{host: data, path: /d}]}\n",
       "field 'containers[1].mounts[0].host' = data must be an absolute path"},
      {ok_head + "containers:\n" + coordinator +
           "  - {id: 201, role: worker, ip: 10.0.0.11/24, mounts: [{host: /data}]}\n",
       "field 'containers[1].mounts[0]' needs both host and path"},
      {ok_head + "containers:\n" + coordinator +
           "  - {id: 201, role: worker, ip: 10.0.0.11/24, mounts: [{host: /d, path: /d, "
           "read_only: maybe}]}\n",
       "field 'containers[1].mounts[0].read_only' must be true or false, got 'maybe'"},
      {ok_head + "containers:\n" + coordinator + "  - {id: 201, role: gpu, ip: 10.0.0.11/24}\n",
       "field 'containers[1].role' = gpu must be one of: coordinator, worker"},
      {ok_head + "containers:\n" + coordinator +
           "  - {id: 201, role: worker, ip: 10.0.0.11/24, hostname: a_very_long_host_name_that_"
           "goes_on_and_on_past_sixty_three_characters}\n",
       "field 'containers[1].hostname' = a_very_long"},
      {ok_head + "port: 70000\n" + two, "field 'port' = 70000 must be in [1, 65535]"},
      {ok_head + "shm_gb: -1\n" + two, "field 'shm_gb' = -1 must be in [0, 1048576]"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<PveCluster> parsed = ParsePveCluster(c.yaml, "cluster.yaml");
    ASSERT_FALSE(parsed.ok()) << c.yaml;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("cluster.yaml: " + c.want))
        << c.yaml;
  }
}

TEST(PveClusterTest, SafeNamesAndAddresses) {
  EXPECT_TRUE(IsSafePveName("flashdraft-201"));
  EXPECT_FALSE(IsSafePveName(""));
  EXPECT_FALSE(IsSafePveName("a b"));
  EXPECT_FALSE(IsSafePveName("a/b"));
  EXPECT_TRUE(IsSafePveName("a/b", "/"));
  EXPECT_FALSE(IsSafePveName(std::string(201, 'a')));
  EXPECT_EQ(PveAddress("10.0.0.1/24"), "10.0.0.1");
}

}  // namespace
}  // namespace flashdraft
