// `flashdraft prepare` on a real (tiny, random) Hugging Face target written by the Python
// reference, then training on what it wrote.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::TempDir;
using ::testing::HasSubstr;

const std::string kBin = FLASHDRAFT_BIN_DIR;
const std::string kTargetReference = FLASHDRAFT_SOURCE_DIR "/tests/reference/target_reference.py";

TEST(PrepareTest, ShardsFromARealTargetTrainAndResume) {
  FD_SKIP_WITHOUT_REFERENCE_PYTHON();
  TempDir dir;
  auto made =
      RunCommand(absl::StrCat(::flashdraft::testing::kReferencePython, " ", kTargetReference, " ",
                              dir.path(), " --arch qwen3 --layers 4 --ids-layers 1"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  // 40 samples with a prompt (loss_mask 0) then a response (1); line 5 is broken.
  std::ofstream data(dir.Join("data.jsonl"));
  std::mt19937 rng(3);
  for (int i = 0; i < 41; ++i) {
    if (i == 4) {
      data << R"({"input_ids": [1, 2, 999], "loss_mask": [0, 1, 1]})"
           << "\n";
      continue;
    }
    const int len = 30 + static_cast<int>(rng() % 30), prompt = 5;
    nlohmann::json j;
    for (int t = 0; t < len; ++t) {
      j["input_ids"].push_back(static_cast<int>(rng() % 101));
      j["loss_mask"].push_back(t >= prompt ? 1 : 0);
    }
    data << j.dump() << "\n";
  }
  data.close();
  const std::string prepare = absl::StrCat(
      kBin, "/flashdraft prepare --target ", dir.Join("model"), " --data ", dir.Join("data.jsonl"),
      " --out ", dir.Join("shards"), " --layers 1,3 --float32 --samples-per-shard 16");
  auto strict = RunCommand(prepare);
  EXPECT_EQ(strict.exit_code, 1);
  EXPECT_THAT(strict.output,
              HasSubstr("data.jsonl:5: input_ids entry 999 is not a token id in [0, 101)"));

  auto r = RunCommand(prepare + " --skip-bad-lines");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("1 bad line(s) skipped"));
  auto manifest = nlohmann::json::parse(*ReadFile(dir.Join("shards/manifest.json")));
  EXPECT_EQ(manifest["num_samples"], 40);
  EXPECT_EQ(manifest["feature_size"], 64);

  // The features of sample 0 are the target's layers 1 and 3 for its ids.
  auto shard = SafetensorsFile::Open(dir.Join("shards/shard-00000.safetensors"));
  ASSERT_TRUE(shard.ok());
  const TensorView offsets = *(*shard)->Get("offsets");
  int64_t len;
  std::memcpy(&len, offsets.data + 8, 8);
  const TensorView ids = *(*shard)->Get("input_ids");
  SafetensorsWriter ids_writer;
  ASSERT_TRUE(ids_writer.Add("input_ids", DType::kI64, {1, len}, ids.data, len * 8).ok());
  ASSERT_TRUE(ids_writer.Write(dir.Join("ids0.safetensors")).ok());
  auto f = RunCommand(absl::StrCat(kBin, "/flashdraft debug target-features --target ",
                                   dir.Join("model"), " --ids ", dir.Join("ids0.safetensors"),
                                   " --layers 1,3 --out ", dir.Join("f0.safetensors")));
  ASSERT_EQ(f.exit_code, 0) << f.output;
  auto expected = SafetensorsFile::Open(dir.Join("f0.safetensors"));
  ASSERT_TRUE(expected.ok());
  const TensorView want = *(*expected)->Get("hidden_states");
  const TensorView got = *(*shard)->Get("hidden_states");
  ASSERT_EQ(want.nbytes, static_cast<size_t>(len * 64 * 4));
  EXPECT_EQ(std::memcmp(want.data, got.data, want.nbytes), 0);

  // An interrupted run: the manifest and the last shard are gone; a rerun keeps the rest.
  std::filesystem::remove(dir.Join("shards/manifest.json"));
  std::filesystem::remove(dir.Join("shards/shard-00002.safetensors"));
  auto resumed = RunCommand(prepare + " --skip-bad-lines");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("resuming: 32 samples already in complete shards"));
  EXPECT_EQ(nlohmann::json::parse(*ReadFile(dir.Join("shards/manifest.json")))["num_samples"], 40);

  // And the drafter trains on them: coordinator + 2 workers.
  ASSERT_TRUE(WriteFileAtomically(dir.Join("job.yaml"), absl::StrCat(R"(
output_dir: )",
                                                                     dir.Join("run"), R"(
drafter: {num_hidden_layers: 1, block_size: 8, num_target_features: 2, max_anchors: 8}
data: {source: shards, shards_dir: )",
                                                                     dir.Join("shards"), R"(}
train: {max_steps: 8, global_batch_size: 4}
)"))
                  .ok());
  auto run =
      RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir.Join("job.yaml"), " --workers 2"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("job finished: 8 steps"));
}

TEST(PrepareTest, MissingInputsAreNamed) {
  TempDir dir;
  auto r = RunCommand(absl::StrCat(kBin, "/flashdraft prepare --target ", dir.Join("nope"),
                                   " --data ", dir.Join("d.jsonl"), " --out ", dir.Join("o")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("nope/config.json: cannot open"));
}

}  // namespace
}  // namespace flashdraft
