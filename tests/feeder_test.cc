// Target feeders (docs/ARCHITECTURE.md, "Feeders") on the README demo job: the same steps.jsonl
// numbers and the same exported drafter, to the bit, whether the coordinator runs the target or
// 1 or 3 flashdraft-feeder processes compute every shard and serve it to the workers; and a
// feeder killed with SIGKILL mid-run changes nothing in the result.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::FindProcess;
using ::flashdraft::testing::FirstDifferentStep;
using ::flashdraft::testing::HttpGet;
using ::flashdraft::testing::ReadSteps;
using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::StartProcess;
using ::flashdraft::testing::TempDir;
using ::testing::HasSubstr;

const std::string kBin = FLASHDRAFT_BIN_DIR;
const std::string kSource = FLASHDRAFT_SOURCE_DIR;
constexpr int kSteps = 40;

class FeederTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto made =
        RunCommand(absl::StrCat(kBin, "/flashdraft make-tiny-target --out ", dir_->Join("target"),
                                " --steps 150 --merges 256 --hidden 64 --layers 4"));
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }
  static void TearDownTestSuite() { delete dir_; }

  // `flashdraft launch` of the demo job with 2 workers and `feeders` feeders, as argv.
  static std::vector<std::string> Launch(int feeders, const std::string& out) {
    const std::string target = dir_->Join("target");
    return {kBin + "/flashdraft",
            "launch",
            kSource + "/deploy/examples/demo.yaml",
            "--workers",
            "2",
            "--feeders",
            std::to_string(feeders),
            "--out",
            out,
            "--max-restarts",
            "0",
            "--set",
            "target.path=" + target,
            "--set",
            "data.jsonl=" + target + "/chats.jsonl",
            "--set",
            absl::StrCat("train.max_steps=", kSteps),
            "--set",
            "checkpoint.every_steps=0"};
  }
  static std::string Joined(const std::vector<std::string>& argv) {
    std::string out;
    for (const std::string& a : argv) absl::StrAppend(&out, out.empty() ? "" : " ", a);
    return out;
  }
  // The run with the target in the coordinator, once.
  static const std::vector<nlohmann::json>& Reference() {
    static const std::vector<nlohmann::json>* steps = [] {
      const std::string out = dir_->Join("feeders0");
      auto run = RunCommand(Joined(Launch(0, out)));
      EXPECT_EQ(run.exit_code, 0) << run.output;
      return new std::vector<nlohmann::json>(ReadSteps(out + "/steps.jsonl"));
    }();
    return *steps;
  }
  static void ExpectSameAsReference(const std::string& out, const std::string& what) {
    ASSERT_EQ(Reference().size(), static_cast<size_t>(kSteps));
    const std::vector<nlohmann::json> steps = ReadSteps(out + "/steps.jsonl");
    EXPECT_EQ(steps.size(), static_cast<size_t>(kSteps)) << what;
    EXPECT_EQ(FirstDifferentStep(Reference(), steps), "") << what;
    const auto reference = ReadFile(dir_->Join("feeders0/drafter/model.safetensors"));
    const auto drafter = ReadFile(out + "/drafter/model.safetensors");
    ASSERT_TRUE(reference.ok() && drafter.ok()) << what;
    EXPECT_TRUE(*reference == *drafter) << what << ": the exported drafters differ";
  }

  // Each feeder's /metrics port by its id, as the job's targets.json lists them (role "feeder"),
  // waiting up to `seconds` for `feeders` of them.
  static std::map<std::string, int> FeederPorts(const std::string& out, int feeders,
                                                double seconds = 10) {
    std::map<std::string, int> ports;
    for (int i = 0; i < seconds * 100 && static_cast<int>(ports.size()) < feeders; ++i) {
      auto text = ReadFile(out + "/prometheus/targets.json");
      const nlohmann::json groups = nlohmann::json::parse(text.ok() ? *text : "", nullptr, false);
      for (const nlohmann::json& g : groups.is_array() ? groups : nlohmann::json::array()) {
        if (g["labels"]["role"] != "feeder") continue;
        const std::string address = g["targets"][0];
        ports[g["labels"]["feeder"]] = std::stoi(address.substr(address.rfind(':') + 1));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return ports;
  }

  // targets.json lists the job's `feeders` feeders (role "feeder"); the first one's /metrics
  // passes promtool and has every feeder metric the Grafana dashboard asks for.
  static void ExpectFeederMetrics(const std::string& out, int feeders) {
    const std::map<std::string, int> ports = FeederPorts(out, feeders);
    ASSERT_EQ(static_cast<int>(ports.size()), feeders) << "feeders in targets.json";
    auto scrape = HttpGet(ports.at("feeder-0"), "/metrics");
    ASSERT_TRUE(scrape.ok()) << scrape.status();
    const std::string& text = scrape->body;
    EXPECT_THAT(text, ::testing::ContainsRegex("\nflashdraft_feeder_samples_total [1-9]"));
    EXPECT_THAT(text, HasSubstr("\nflashdraft_feeder_max_bytes "));
    if (access("/usr/bin/promtool", X_OK) == 0) {
      ASSERT_TRUE(WriteFileAtomically(out + "/feeder.metrics", text).ok());
      auto lint = RunCommand("/usr/bin/promtool check metrics < " + out + "/feeder.metrics");
      EXPECT_EQ(lint.exit_code, 0) << lint.output;
      EXPECT_EQ(lint.output, "");
    }
    const auto dashboard = ReadFile(kSource + "/deploy/grafana/flashdraft.json");
    ASSERT_TRUE(dashboard.ok());
    const std::regex name("flashdraft_feeder_[a-z_]+");
    int names = 0;
    for (std::sregex_iterator it(dashboard->begin(), dashboard->end(), name), end; it != end;
         ++it, ++names) {
      std::string family = it->str();
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        if (absl::EndsWith(family, suffix)) family.resize(family.size() - strlen(suffix));
      }
      EXPECT_THAT(text, HasSubstr("\n# TYPE " + family + " ")) << it->str();
    }
    EXPECT_GE(names, 6);
  }

  // SIGKILL to feeder-1 of the launch `launch`, writing to `out`; the launch must still end well
  // and with the reference's numbers and drafter.
  static void KillFeederAndExpectTheSameRun(int launch, const std::string& out,
                                            const std::string& what) {
    // This launch's feeder-1, not another test's that ctest runs beside it: by its coordinator.
    int port = 0;
    std::ifstream(out + "/coordinator.port") >> port;
    ASSERT_GT(port, 0) << "no " << out << "/coordinator.port";
    const int victim =
        FindProcess({"flashdraft-feeder", absl::StrCat("127.0.0.1:", port, " --id feeder-1")});
    ASSERT_GT(victim, 0);
    ASSERT_EQ(kill(victim, SIGKILL), 0);
    int status = 0;
    waitpid(launch, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << *ReadFile(out + ".log");
    ExpectSameAsReference(out, what);
    EXPECT_THAT(*ReadFile(out + "/logs/coordinator.log"), HasSubstr("feeder 'feeder-1' lost"));
  }

  static TempDir* dir_;
};
TempDir* FeederTest::dir_ = nullptr;

TEST_F(FeederTest, TheDemoJobIsTheSameBitsWithZeroOneAndThreeFeeders) {
  ASSERT_EQ(Reference().size(), static_cast<size_t>(kSteps));
  // It trains: there are loss tokens and the loss falls.
  EXPECT_GT(Reference().front()["tokens"].get<int64_t>(), 0);
  EXPECT_LT(Reference().back()["loss"].get<double>(), Reference().front()["loss"].get<double>());
  for (int feeders : {1, 3}) {
    const std::string out = dir_->Join(absl::StrCat("feeders", feeders));
    // With 1 feeder, every process starts with other thread counts than the reference's
    // (scripts/test.sh runs it with OMP_NUM_THREADS=1): each takes the job's instead, whatever its
    // environment or its container's core count says. (On one core OpenBLAS runs one thread.)
    const std::string threads = feeders == 1 ? "OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 " : "";
    auto run = RunCommand(threads + Joined(Launch(feeders, out)));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    ExpectSameAsReference(out, absl::StrCat(feeders, " feeder(s)"));
    // The features came from the feeders: each served shards, the coordinator computed none.
    for (int f = 0; f < feeders; ++f) {
      const auto log = ReadFile(absl::StrCat(out, "/logs/feeder-", f, ".log"));
      ASSERT_TRUE(log.ok()) << log.status();
      EXPECT_THAT(*log, HasSubstr("joined job 'demo'"));
      EXPECT_THAT(*log, HasSubstr("regenerating the replies of data lines"));
      EXPECT_THAT(*log, HasSubstr("shut down by the coordinator: job finished"));
    }
    const auto coordinator = ReadFile(out + "/logs/coordinator.log");
    EXPECT_THAT(*coordinator, HasSubstr("every shard's features are computed by a feeder"));
    // The replies were regenerated by the feeders, not by the coordinator.
    EXPECT_THAT(*coordinator, HasSubstr("the feeders regenerate the replies of 256 line(s)"));
    EXPECT_THAT(*coordinator, ::testing::Not(HasSubstr("tokenizing and regenerating")));
  }
}

// A feeder whose shard computes longer than cluster.stall_timeout_seconds says so on its /healthz
// (the coordinator's stall watch drops it meanwhile): a scheduler's probe can restart it.
TEST_F(FeederTest, AFeederStuckInAShardFailsItsHealthz) {
  const std::string out = dir_->Join("stuck");
  std::filesystem::create_directories(out);
  std::vector<std::string> argv = Launch(1, out);
  for (const char* field : {"data.regenerate=false", "cluster.stall_timeout_seconds=2"}) {
    argv.insert(argv.end(), {"--set", field});
  }
  // Every shard's forward takes at least 10 s a sample: the first one outlasts the stall timeout.
  const int launch = StartProcess(argv, out + ".log", {"FLASHDRAFT_FAULT=slow-feeder:ms=10000"});
  const std::map<std::string, int> ports = FeederPorts(out, 1, 120);
  ASSERT_EQ(ports.size(), 1u) << *ReadFile(out + ".log");
  std::optional<testing::HttpResponse> stuck;
  for (int i = 0; i < 600 && !stuck; ++i) {
    auto probe = HttpGet(ports.begin()->second, "/healthz");
    if (probe.ok() && probe->status == 503) stuck = *probe;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(launch, SIGTERM);
  waitpid(launch, nullptr, 0);
  ASSERT_TRUE(stuck.has_value()) << "the feeder's /healthz never failed";
  EXPECT_THAT(stuck->body, ::testing::MatchesRegex("a shard has been computing for [0-9]+ s "
                                                   "\\(cluster.stall_timeout_seconds: 2\\)\n"));
}

// kill -9 one of two feeders while they regenerate the data set's replies: its lines go to the
// other, and the job ends with the numbers and drafter of a run without feeders.
TEST_F(FeederTest, AFeederKilledWhileRegeneratingChangesNothing) {
  const std::string out = dir_->Join("killed-regenerating");
  std::filesystem::create_directories(out);
  // At least 40 ms a line: the 256 lines take the feeders 5 s or more, however fast this host is.
  const int launch =
      StartProcess(Launch(2, out), out + ".log", {"FLASHDRAFT_FAULT=slow-feeder:ms=40"});
  const std::string coordinator_log = out + "/logs/coordinator.log";
  auto regenerating = [&] {
    auto log = ReadFile(coordinator_log);
    return log.ok() && absl::StrContains(*log, "the feeders regenerate the replies");
  };
  for (int i = 0; i < 12000 && !regenerating(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(regenerating()) << *ReadFile(out + ".log");
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // a fifth of the lines at most
  KillFeederAndExpectTheSameRun(launch, out, "a feeder killed while regenerating");
  EXPECT_THAT(*ReadFile(coordinator_log),
              HasSubstr("line(s) it was regenerating go to the other feeders"));
}

// kill -9 one of two feeders mid-run: its shards go to the other, the steps in flight are sent
// again, and the job ends with the numbers and drafter of an undisturbed run.
TEST_F(FeederTest, AFeederKilledMidRunChangesNothing) {
  const std::string out = dir_->Join("killed");
  std::filesystem::create_directories(out);
  const int launch = StartProcess(Launch(2, out), out + ".log");
  for (int i = 0; i < 12000 && ReadSteps(out + "/steps.jsonl").size() < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(ReadSteps(out + "/steps.jsonl").size(), 10u) << *ReadFile(out + ".log");
  ExpectFeederMetrics(out, 2);
  KillFeederAndExpectTheSameRun(launch, out, "a feeder killed");
}

}  // namespace
}  // namespace flashdraft
