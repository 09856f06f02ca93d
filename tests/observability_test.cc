// Observability checked with Prometheus's own tools: the alert rules pass `promtool check rules`
// and their unit tests (`promtool test rules`), and a live scrape of a training coordinator passes
// `promtool check metrics` (exit 3 means lint problems: a failure here).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::CoordinatorProcess;
using ::flashdraft::testing::HttpGet;
using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::StartProcess;
using ::flashdraft::testing::TempDir;
using ::testing::HasSubstr;

const std::string kBin = FLASHDRAFT_BIN_DIR;
const std::string kSource = FLASHDRAFT_SOURCE_DIR;
const std::string kPromtool = "/usr/bin/promtool";

#define FD_SKIP_WITHOUT_PROMTOOL()                                                  \
  if (access(kPromtool.c_str(), X_OK) != 0) {                                       \
    GTEST_SKIP() << "needs promtool (package prometheus, --no-install-recommends; " \
                    "scripts/setup.sh installs it)";                                \
  }

TEST(PrometheusTest, AlertRulesPassPromtoolAndTheirUnitTests) {
  FD_SKIP_WITHOUT_PROMTOOL();
  const std::string dir = kSource + "/deploy/prometheus";
  auto check = RunCommand(absl::StrCat("cd ", dir, " && ", kPromtool, " check rules alerts.yml"));
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_THAT(check.output, HasSubstr("SUCCESS: 9 rules found"));
  auto test =
      RunCommand(absl::StrCat("cd ", dir, " && ", kPromtool, " test rules alerts_test.yml"));
  EXPECT_EQ(test.exit_code, 0) << test.output;
  EXPECT_THAT(test.output, HasSubstr("SUCCESS"));
}

TEST(PrometheusTest, ALiveCoordinatorScrapePassesPromtoolCheckMetrics) {
  FD_SKIP_WITHOUT_PROMTOOL();
  TempDir dir;
  auto made = RunCommand(absl::StrCat(kBin, "/flashdraft make-shards --out ", dir.Join("shards"),
                                      " --samples 24 --seq 64 --vocab 48 --hidden 32 --seed 2"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string job = dir.Join("job.yaml");
  ASSERT_TRUE(WriteFileAtomically(
                  job, absl::StrCat("output_dir: ", dir.Join("out"),
                                    "\ndrafter: {num_hidden_layers: 1, block_size: 8, "
                                    "num_target_features: 2, max_anchors: 8}\n"
                                    "data: {source: shards, shards_dir: ",
                                    dir.Join("shards"),
                                    ", max_seq_len: 64}\n"
                                    "train: {seed: 1, max_steps: 100000, global_batch_size: 6}\n"
                                    "metrics: {enabled: true, listen: '127.0.0.1:0'}\n"))
                  .ok());
  CoordinatorProcess coordinator(kBin, job, dir.Join("coordinator.log"));
  ASSERT_GT(coordinator.port(), 0) << *ReadFile(dir.Join("coordinator.log"));
  const int metrics_port = testing::WaitForPortFile(dir.Join("out/metrics.port"));
  ASSERT_GT(metrics_port, 0);
  const int worker = StartProcess({kBin + "/flashdraft-worker", "--coordinator",
                                   absl::StrCat("127.0.0.1:", coordinator.port())},
                                  dir.Join("worker.log"));
  // Scraped while it trains, after a few steps: every family has samples (histograms included).
  std::string text;
  for (int i = 0; i < 600 && text.empty(); ++i) {
    auto scrape = HttpGet(metrics_port, "/metrics");
    const std::string key = "\nflashdraft_steps_total ";
    const size_t at = scrape.ok() ? scrape->body.find(key) : std::string::npos;
    if (at != std::string::npos &&
        std::strtod(scrape->body.c_str() + at + key.size(), nullptr) >= 5) {
      text = scrape->body;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(worker, SIGKILL);
  waitpid(worker, nullptr, 0);
  ASSERT_FALSE(text.empty()) << *ReadFile(dir.Join("coordinator.log"));
  ASSERT_TRUE(WriteFileAtomically(dir.Join("scrape.txt"), text).ok());
  auto lint = RunCommand(absl::StrCat(kPromtool, " check metrics < ", dir.Join("scrape.txt")));
  EXPECT_EQ(lint.exit_code, 0) << lint.output;
  EXPECT_EQ(lint.output, "");
}

}  // namespace
}  // namespace flashdraft
