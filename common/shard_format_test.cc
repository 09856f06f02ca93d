#include "common/shard_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

// `samples` samples of 3 + i tokens, F32 features of `feature_size` equal to the sample's index,
// in shards of 4; the writer's manifest as written.
void WriteSamples(const std::string& dir, int samples, int64_t feature_size,
                  int64_t teacher_size = 0) {
  ShardWriter writer(dir, feature_size, DType::kF32, 4);
  writer.SetTeacherSize(teacher_size);
  for (int i = 0; i < samples; ++i) {
    const int len = 3 + i;
    std::vector<int64_t> ids(len, i), mask(len, 1);
    std::vector<float> features(len * feature_size, static_cast<float>(i));
    ASSERT_TRUE(writer.Add(ids, mask, features.data()).ok());
  }
  writer.SetMetadata("drafter_config", "{\"hidden_size\": 8}");
  ASSERT_TRUE(writer.Finish().ok());
}

TEST(ShardFormatTest, WrittenShardsReadBackSampleBySample) {
  testing::TempDir dir;
  WriteSamples(dir.path(), 10, 2);
  absl::StatusOr<ShardManifest> m = ReadShardManifest(dir.path());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->feature_size, 2);
  EXPECT_EQ(m->feature_dtype, DType::kF32);
  EXPECT_EQ(m->num_samples, 10u);
  EXPECT_EQ(m->metadata.at("drafter_config"), "{\"hidden_size\": 8}");
  ASSERT_EQ(m->shards.size(), 3u);  // 4 + 4 + 2
  EXPECT_EQ(m->shards[0].file, ShardFileName(0));
  EXPECT_EQ(m->shards[2].num_samples, 2);
  EXPECT_EQ(m->shards[2].num_tokens, 11 + 12);
  absl::StatusOr<ShardFile> last = OpenShardFile(dir.path(), m->shards[2], 2, DType::kF32);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->offsets, (std::vector<int64_t>{0, 11, 23}));
  float feature;
  std::memcpy(&feature, last->features.data + (11 * 2) * 4, 4);  // sample 9's first feature
  EXPECT_EQ(feature, 9.0f);
  EXPECT_EQ(ShardManifestJson(*m), *ReadFile(dir.Join("manifest.json")));
}

// Shards with a teacher feature say so in the manifest (teacher_size); others say nothing.
TEST(ShardFormatTest, TheTeacherColumnsAreInTheManifest) {
  testing::TempDir dir;
  WriteSamples(dir.Join("teacher"), 5, 6, 2);
  absl::StatusOr<ShardManifest> m = ReadShardManifest(dir.Join("teacher"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->feature_size, 6);
  EXPECT_EQ(m->teacher_size, 2);
  EXPECT_EQ(ShardManifestJson(*m), *ReadFile(dir.Join("teacher/manifest.json")));
  WriteSamples(dir.Join("plain"), 5, 6);
  EXPECT_THAT(*ReadFile(dir.Join("plain/manifest.json")), ::testing::Not(HasSubstr("teacher")));
  m = ReadShardManifest(dir.Join("plain"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->teacher_size, 0);
}

TEST(ShardFormatTest, ResumeAdoptsTheCompleteShardsLeftBehind) {
  testing::TempDir dir;
  WriteSamples(dir.path(), 10, 2);
  ShardWriter again(dir.path(), 2, DType::kF32, 4);
  absl::StatusOr<int64_t> skip = again.ResumeExisting();
  ASSERT_TRUE(skip.ok()) << skip.status();
  EXPECT_EQ(*skip, 10);
  // Adopted shards are checked against the writer's shape.
  ShardWriter wider(dir.path(), 3, DType::kF32, 4);
  EXPECT_THAT(std::string(wider.ResumeExisting().status().message()),
              HasSubstr("tensor 'hidden_states'"));
}

TEST(ShardFormatTest, BadManifestsAreRefusedNamingTheFileAndKey) {
  const std::string ok_head = R"({"format": "flashdraft-shards-v1", "feature_size": 4, )";
  struct Case {
    std::string json, want;
  };
  const std::vector<Case> cases = {
      {"{", "m.json: not valid JSON"},
      {R"({"format": 3})", "m.json: \"format\" must be \"flashdraft-shards-v1\""},
      {R"({"format": "flashdraft-shards-v1", "feature_size": -4})",
       "\"feature_size\" must be a positive integer"},
      {ok_head + R"("feature_dtype": ["BF16"]})", "\"feature_dtype\" must be BF16, F16 or F32"},
      {ok_head + R"("feature_dtype": "I64"})", "\"feature_dtype\" must be BF16, F16 or F32"},
      {ok_head + R"("feature_dtype": "BF16"})", "missing \"shards\" list"},
      {ok_head + R"("feature_dtype": "BF16", "teacher_size": 4})",
       "\"teacher_size\" 4 must be a non-negative integer below \"feature_size\" 4"},
      {ok_head + R"("feature_dtype": "BF16", "teacher_size": 18446744073709551615})",
       "\"teacher_size\" 18446744073709551615 must be a non-negative integer below"},
      {ok_head + R"("feature_dtype": "BF16", "teacher_size": "2"})",
       "\"teacher_size\" \"2\" must be a non-negative integer"},
      {ok_head + R"("feature_dtype": "BF16", "shards": [{"file": "a"}]})",
       "bad shard entry {\"file\":\"a\"}"},
      {ok_head + R"("feature_dtype": "BF16", "shards": [{"file": "a", "num_samples": 1e30}]})",
       "bad shard entry"},
      {ok_head + R"("feature_dtype": "BF16", "shards": [{"file": "../a", "num_samples": 1}]})",
       "shard file '../a' must be in the folder"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ShardManifest> m = ParseShardManifest(c.json, "m.json");
    ASSERT_FALSE(m.ok()) << c.json;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr(c.want)) << c.json;
  }
}

TEST(ShardFormatTest, ShardFilesThatDisagreeWithTheirEntryAreNamed) {
  testing::TempDir dir;
  WriteSamples(dir.path(), 4, 2);
  ShardEntry entry{ShardFileName(0), 4, 0};
  EXPECT_TRUE(OpenShardFile(dir.path(), entry, 2, DType::kF32).ok());
  entry.num_samples = 5;
  EXPECT_THAT(std::string(OpenShardFile(dir.path(), entry, 2, DType::kF32).status().message()),
              HasSubstr("shard-00000.safetensors: tensor 'offsets'"));
  entry.num_samples = 4;
  EXPECT_THAT(std::string(OpenShardFile(dir.path(), entry, 2, DType::kBF16).status().message()),
              HasSubstr("tensor 'hidden_states'"));
  entry.file = "missing.safetensors";
  EXPECT_THAT(std::string(OpenShardFile(dir.path(), entry, 2, DType::kF32).status().message()),
              HasSubstr("missing.safetensors: cannot open"));
}

}  // namespace
}  // namespace flashdraft
