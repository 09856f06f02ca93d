// A job at a real model's shape, as a user runs it: `flashdraft make-target` makes a random-weight
// target with Qwen3-0.6B's layers and vocabulary (151,936; two of its 28 layers, so that it fits a
// 2-core machine), `flashdraft launch` trains a drafter of its hidden size on sequences of 2,048
// tokens with 2 workers, checkpoints, exports and evaluates; a resumed run equals the
// uninterrupted one; every process stays within its memory estimate, and a job too large for the
// machine is refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::FirstDifferentStep;
using ::flashdraft::testing::ReadSteps;
using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::TempDir;
using ::testing::HasSubstr;

const std::string kCli = FLASHDRAFT_CLI;

// "peak memory: N MiB" of each process in launch's prefixed output: {"coordinator": N, ...}.
std::map<std::string, int64_t> PeakMemoryMiB(const std::string& output) {
  std::map<std::string, int64_t> peaks;
  const std::regex line(R"(\[([a-z0-9-]+) *\] .*peak memory: ([0-9]+) MiB)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it) {
    peaks[(*it)[1]] = std::stoll((*it)[2]);
  }
  return peaks;
}

TEST(RealShapeTest, Qwen3ShapedJobTrainsCheckpointsResumesExportsAndEvaluates) {
  TempDir dir;
  const std::string target = dir.Join("qwen3-0.6b");
  auto made = RunCommand(absl::StrCat(kCli, " make-target --shape qwen3-0.6b --layers 2 --out ",
                                      target, " --max-seq-len 2048"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_THAT(made.output, HasSubstr("vocabulary of 151936"));
  ASSERT_TRUE(WriteFileAtomically(
                  dir.Join("job.yaml"),
                  absl::StrCat(R"(
output_dir: )",
                               dir.Join("run"), R"(
target: {path: )",
                               target, R"(, layer_ids: [0, 1]}
drafter: {num_hidden_layers: 1, block_size: 16, num_target_features: 2, max_anchors: 64}
data: {source: target, jsonl: )",
                               target, R"(/long-chats.jsonl, max_seq_len: 2048, prefetch_steps: 1}
train: {max_steps: 4, global_batch_size: 2, learning_rate: 0.0006, warmup_ratio: 0.25}
checkpoint: {every_steps: 2}
eval: {every_steps: 4, prompts: )",
                               target, R"(/heldout-chats.jsonl, limit: 1, max_new_tokens: 16}
)"))
                  .ok());
  auto run = RunCommand(absl::StrCat(kCli, " launch ", dir.Join("job.yaml"), " --workers 2"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("job finished: 4 steps"));
  const auto steps = ReadSteps(dir.Join("run/steps.jsonl"));
  ASSERT_EQ(steps.size(), 4u);
  // Every sample long enough for all 64 anchors: 2 x 64 blocks of 15 drafted tokens, nearly.
  for (const auto& s : steps) EXPECT_GT(s["tokens"].get<int64_t>(), 1800) << s.dump();
  EXPECT_LT(steps[3]["loss"].get<double>(), steps[0]["loss"].get<double>());

  // The exported drafter reads back as the target's shape, its tensors whole.
  const nlohmann::json config =
      nlohmann::json::parse(*ReadFile(dir.Join("run/drafter/config.json")));
  EXPECT_EQ(config["hidden_size"], 1024);
  EXPECT_EQ(config["vocab_size"], 151936);
  EXPECT_EQ(config["block_size"], 16);
  auto exported = SafetensorsModel::Open(dir.Join("run/drafter"));
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto fc = (*exported)->Get("fc.weight");
  ASSERT_TRUE(fc.ok()) << fc.status();
  EXPECT_EQ(fc->shape, (std::vector<int64_t>{1024, 2048}));  // 4 MiB in BF16: several chunks
  auto eval = RunCommand(absl::StrCat(
      kCli, " eval --target ", target, " --drafter ", dir.Join("run/drafter"), " --prompts ",
      target, "/heldout-chats.jsonl --limit 1 --max-new-tokens 16 --json 2>/dev/null"));
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  const nlohmann::json report = nlohmann::json::parse(eval.output, nullptr, false);
  ASSERT_TRUE(report.is_object()) << eval.output;
  EXPECT_EQ(report["lossless"], true);
  EXPECT_EQ(report["max_new_tokens"], 16);

  // Resumed from the checkpoint of step 2: the same steps and drafter, to the bit.
  const std::string resumed = dir.Join("resumed");
  std::filesystem::create_directories(resumed + "/checkpoints");
  std::filesystem::copy(dir.Join("run/checkpoints/step-00000002"),
                        resumed + "/checkpoints/step-00000002");
  std::filesystem::copy_file(dir.Join("run/steps.jsonl"), resumed + "/steps.jsonl");
  auto again =
      RunCommand(absl::StrCat(kCli, " launch ", dir.Join("job.yaml"),
                              " --workers 2 --resume --set eval.every_steps=0 --out ", resumed));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(FirstDifferentStep(steps, ReadSteps(resumed + "/steps.jsonl")), "");
  EXPECT_TRUE(*ReadFile(dir.Join("run/drafter/model.safetensors")) ==
              *ReadFile(resumed + "/drafter/model.safetensors"));

  // Memory: every process's peak against launch's estimate (rank 0's worker also uploads the
  // checkpoints: the others hold less).
  const auto peaks = PeakMemoryMiB(run.output);
  ASSERT_EQ(peaks.size(), 3u) << run.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(run.output, m,
                                std::regex("expected peak memory: coordinator ([0-9]+) MiB, each "
                                           "worker ([0-9]+) MiB")))
      << run.output;
  const double coordinator_estimate = std::stod(m[1]), worker_estimate = std::stod(m[2]);
  int64_t largest_worker = 0;
  for (const auto& [process, mib] : peaks) {
    RecordProperty(process + "_peak_mib", static_cast<int>(mib));
    const double estimate = process == "coordinator" ? coordinator_estimate : worker_estimate;
    EXPECT_LE(mib, 1.25 * estimate) << process << " estimate " << estimate;
    if (process != "coordinator") largest_worker = std::max(largest_worker, mib);
  }
  EXPECT_GE(peaks.at("coordinator"), 0.75 * coordinator_estimate);
  EXPECT_GE(largest_worker, 0.75 * worker_estimate);

  // A job that cannot fit this machine is refused before it starts, naming its largest part.
  auto huge = RunCommand(absl::StrCat(kCli, " launch ", dir.Join("job.yaml"),
                                      " --workers 2 --set drafter.max_anchors=65536 --set "
                                      "data.max_seq_len=1048576 --out ",
                                      dir.Join("huge")));
  EXPECT_EQ(huge.exit_code, 1) << huge.output;
  EXPECT_THAT(huge.output, HasSubstr("the largest part is the worker's"));
  EXPECT_THAT(huge.output, HasSubstr("lower drafter.max_anchors, data.max_seq_len"));
}

}  // namespace
}  // namespace flashdraft
