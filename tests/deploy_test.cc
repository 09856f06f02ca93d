// Deployment files as shipped (deploy/): the systemd units pass `systemd-analyze verify` without a
// single warning, and their command lines, run as systemd would run them (instance names,
// environment files), train a secured job.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::ReadSteps;
using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::StartProcess;
using ::flashdraft::testing::TempDir;
using ::flashdraft::testing::WaitForPortFile;
using ::testing::HasSubstr;

const std::string kBin = FLASHDRAFT_BIN_DIR;
const std::string kSource = FLASHDRAFT_SOURCE_DIR;
const std::string kUnits = kSource + "/deploy/systemd";

// A unit file with the binaries where this build put them.
std::string UnitWithBuildBinaries(const std::string& name) {
  return absl::StrReplaceAll(*ReadFile(kUnits + "/" + name), {{"/usr/local/bin", kBin}});
}

TEST(DeployTest, SystemdUnitsPassVerifyWithoutWarnings) {
  if (access("/usr/bin/systemd-analyze", X_OK) != 0) {
    GTEST_SKIP() << "needs systemd-analyze (package systemd)";
  }
  TempDir dir;
  std::string instances;
  for (const auto& [unit, instance] : std::vector<std::pair<std::string, std::string>>{
           {"flashdraft-coordinator@", "demo"}, {"flashdraft-worker@", "gpu0"}}) {
    ASSERT_TRUE(
        WriteFileAtomically(dir.Join(unit + ".service"), UnitWithBuildBinaries(unit + ".service"))
            .ok());
    std::filesystem::create_symlink(unit + ".service", dir.Join(unit + instance + ".service"));
    absl::StrAppend(&instances, " ", dir.Join(unit + instance + ".service"));
  }
  // An unknown key or a bad value only warns (exit 0): every line of output is a failure.
  auto r = RunCommand("systemd-analyze verify --man=no" + instances);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");
}

// The ExecStart= of a unit with %i, %H, the environment and the fixed paths filled in.
std::vector<std::string> ExecStart(const std::string& unit, const std::string& instance,
                                   const std::map<std::string, std::string>& env,
                                   const std::string& root) {
  std::string line;
  for (absl::string_view l : absl::StrSplit(*ReadFile(kUnits + "/" + unit), '\n')) {
    if (absl::ConsumePrefix(&l, "ExecStart=")) line = std::string(l);
  }
  EXPECT_FALSE(line.empty()) << unit;
  line = absl::StrReplaceAll(line, {{"%i", instance}, {"%H", "testhost"}});
  for (const auto& [name, value] : env) {
    line = absl::StrReplaceAll(line, {{"${" + name + "}", value}, {"$" + name, value}});
  }
  line = absl::StrReplaceAll(
      line,
      {{"/usr/local/bin", kBin}, {"/etc/flashdraft", root + "/etc"}, {"/run", root + "/run"}});
  return absl::StrSplit(line, ' ', absl::SkipEmpty());
}

TEST(DeployTest, TheUnitsCommandLinesTrainASecuredJob) {
  TempDir dir;
  const std::string root = dir.path();
  std::filesystem::create_directories(root + "/etc");
  std::filesystem::create_directories(root + "/run/flashdraft-demo");
  auto r =
      RunCommand(absl::StrCat(kBin, "/flashdraft make-shards --out ", root,
                              "/shards --samples 24 --seq 64 --vocab 48 --hidden 32 --seed 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunCommand(absl::StrCat(kSource, "/deploy/make-certs.sh ", root, "/etc/pki"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string pki = root + "/etc/pki";
  ASSERT_TRUE(WriteFileAtomically(
                  root + "/etc/demo.yaml",
                  absl::StrCat(
                      "output_dir: ", root, "/out\n",
                      "drafter: {num_hidden_layers: 1, block_size: 8, num_target_features: 2, "
                      "max_anchors: 8}\ndata: {source: shards, shards_dir: ",
                      root, "/shards, max_seq_len: 64}\n",
                      "train: {seed: 1, max_steps: 4, global_batch_size: 6}\n",
                      "security: {tls_cert: ", pki, "/coordinator.pem, tls_key: ", pki,
                      "/coordinator.key, tls_ca: ", pki, "/ca.pem, token_file: ", pki, "/token}\n"))
                  .ok());
  const std::vector<std::string> coordinator_argv = ExecStart(
      "flashdraft-coordinator@.service", "demo", {{"FLASHDRAFT_COORDINATOR_ARGS", ""}}, root);
  const int coordinator = StartProcess(coordinator_argv, root + "/coordinator.log");
  const int port = WaitForPortFile(root + "/run/flashdraft-demo/coordinator.port");
  ASSERT_GT(port, 0) << *ReadFile(root + "/coordinator.log");
  // worker.env as the example writes it, with this test's paths.
  std::map<std::string, std::string> env;
  for (absl::string_view l :
       absl::StrSplit(*ReadFile(kUnits + "/worker.env.example"), '\n', absl::SkipEmpty())) {
    if (l[0] == '#') continue;
    std::pair<std::string, std::string> kv = absl::StrSplit(l, absl::MaxSplits('=', 1));
    env[kv.first] = absl::StrReplaceAll(kv.second, {{"/etc/flashdraft", root + "/etc"}});
  }
  ASSERT_EQ(env.count("FLASHDRAFT_WORKER_ARGS"), 1u);
  env["FLASHDRAFT_COORDINATOR"] = absl::StrCat("127.0.0.1:", port);
  const int worker = StartProcess(ExecStart("flashdraft-worker@.service", "gpu0", env, root),
                                  root + "/worker.log");
  int status = 0;
  waitpid(coordinator, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << *ReadFile(root + "/coordinator.log");
  waitpid(worker, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << *ReadFile(root + "/worker.log");
  EXPECT_EQ(ReadSteps(root + "/out/steps.jsonl").size(), 4u);
  EXPECT_THAT(*ReadFile(root + "/coordinator.log"), HasSubstr("worker 'testhost-gpu0'"));
}

}  // namespace
}  // namespace flashdraft
