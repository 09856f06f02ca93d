#include "coordinator/sources/regeneration_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(RegenerationCacheTest, RecordsSurviveReopeningAndAnotherKeyStartsOver) {
  testing::TempDir dir;
  const std::string path = dir.Join("regenerated-replies.bin");
  {
    auto cache = RegenerationCache::Open(path, "key A");
    ASSERT_TRUE(cache.ok()) << cache.status();
    EXPECT_EQ((*cache)->size(), 0u);
    EXPECT_EQ((*cache)->note(), "");
    ASSERT_TRUE((*cache)->Append(3, {5, 6, 7}, {0, 1, 1}).ok());
    ASSERT_TRUE((*cache)->Append(9, {}, {}).ok());
    EXPECT_FALSE((*cache)->Append(10, {1, 2}, {1}).ok());  // lengths differ
    EXPECT_FALSE((*cache)->Append(11, {1}, {2}).ok());     // a mask is 0 or 1
  }
  {
    auto cache = RegenerationCache::Open(path, "key A");
    ASSERT_TRUE(cache.ok()) << cache.status();
    ASSERT_EQ((*cache)->size(), 2u);
    std::optional<RegenerationCache::Entry> e = (*cache)->Take(3);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->ids, (std::vector<int64_t>{5, 6, 7}));
    EXPECT_EQ(e->mask, (std::vector<int64_t>{0, 1, 1}));
    EXPECT_FALSE((*cache)->Take(3).has_value());  // handed over, not kept
    EXPECT_TRUE((*cache)->Take(9).has_value());
    EXPECT_FALSE((*cache)->Take(4).has_value());
    EXPECT_EQ((*cache)->size(), 0u);
    ASSERT_TRUE((*cache)->Append(4, {8}, {1}).ok());
    EXPECT_EQ((*cache)->size(), 0u);  // written, not kept
  }
  EXPECT_EQ((*RegenerationCache::Open(path, "key A"))->size(), 3u);
  auto other = RegenerationCache::Open(path, "key B");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->size(), 0u);
  EXPECT_THAT((*other)->note(), HasSubstr("started over"));
}

TEST(RegenerationCacheTest, AnInterruptedOrCorruptRecordEndsWhatIsRead) {
  testing::TempDir dir;
  const std::string path = dir.Join("r.bin");
  {
    auto cache = RegenerationCache::Open(path, "k");
    ASSERT_TRUE(cache.ok());
    ASSERT_TRUE((*cache)->Append(1, {1, 2}, {1, 1}).ok());
    ASSERT_TRUE((*cache)->Append(2, {3, 4}, {1, 0}).ok());
  }
  const std::string whole = *ReadFile(path);
  // Cut inside the second record: the first is kept, the rest dropped, and appending goes on.
  ASSERT_TRUE(WriteFileAtomically(path, whole.substr(0, whole.size() - 5)).ok());
  {
    auto cache = RegenerationCache::Open(path, "k");
    ASSERT_TRUE(cache.ok());
    EXPECT_EQ((*cache)->size(), 1u);
    EXPECT_THAT((*cache)->note(), HasSubstr("dropped"));
    ASSERT_TRUE((*cache)->Append(2, {3, 4}, {1, 0}).ok());
  }
  EXPECT_EQ(*ReadFile(path), whole);
  // A flipped bit in the first record: nothing is taken from the file.
  std::string flipped = whole;
  flipped[flipped.size() / 2] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomically(path, flipped).ok());
  EXPECT_LT((*RegenerationCache::Open(path, "k"))->size(), 2u);
  // A count from the file far beyond its size is not allocated.
  std::string huge = whole.substr(0, whole.size());
  const size_t first_count = 8 + 4 + 1 + 8;  // magic, key length, "k", line number
  huge[first_count + 3] = '\x7f';
  ASSERT_TRUE(WriteFileAtomically(path, huge).ok());
  auto bad = RegenerationCache::Open(path, "k");
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ((*bad)->size(), 0u);
}

TEST(RegenerationCacheTest, TheKeyFollowsTheTargetItsWeightsTheDataTheTokenizerAndTheChatOptions) {
  testing::TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.Join("a.jsonl"), "{\"text\": \"x\"}\n").ok());
  ASSERT_TRUE(WriteFileAtomically(dir.Join("tokenizer.json"), "{}").ok());
  ASSERT_TRUE(WriteFileAtomically(dir.Join("model.safetensors"), "weights").ok());
  auto key = [&](const std::string& target, int64_t max_new_tokens,
                 const ChatRenderOptions& chat = {}) {
    return RegenerationKey(target, dir.path(), {dir.Join("a.jsonl")}, max_new_tokens,
                           dir.Join("tokenizer.json"), chat);
  };
  const std::string a = key("t on cpu", 64);
  EXPECT_EQ(a, key("t on cpu", 64));
  EXPECT_NE(a, key("t on cpu", 65));
  EXPECT_NE(a, key("t on cuda", 64));
  // The chat options: the defaults add nothing (keys written before them stay valid).
  EXPECT_THAT(a, Not(HasSubstr("thinking")));
  const std::string no_thinking = key("t on cpu", 64, {false, ""});
  const std::string system = key("t on cpu", 64, {true, "Be brief."});
  EXPECT_NE(a, no_thinking);
  EXPECT_NE(a, system);
  EXPECT_NE(no_thinking, system);
  ASSERT_TRUE(WriteFileAtomically(dir.Join("tokenizer.json"), "{ }").ok());
  const std::string b = key("t on cpu", 64);
  EXPECT_NE(a, b);
  ASSERT_TRUE(WriteFileAtomically(dir.Join("a.jsonl"), "{\"text\": \"y\"}\n").ok());
  const std::string c = key("t on cpu", 64);
  EXPECT_NE(b, c);
  // Other weights of the same layout (another size here; a rewrite changes the time too).
  ASSERT_TRUE(WriteFileAtomically(dir.Join("model.safetensors"), "other weights").ok());
  EXPECT_NE(c, key("t on cpu", 64));
  EXPECT_THAT(c, HasSubstr("model.safetensors 7 "));
  // A mix of files: their order counts (a line's number counts through them).
  ASSERT_TRUE(WriteFileAtomically(dir.Join("b.jsonl"), "{\"text\": \"z\"}\n").ok());
  auto mix = [&](const std::vector<std::string>& files) {
    return RegenerationKey("t", dir.path(), files, 64, dir.Join("tokenizer.json"), {});
  };
  const std::string ab = mix({dir.Join("a.jsonl"), dir.Join("b.jsonl")});
  EXPECT_NE(ab, mix({dir.Join("a.jsonl")}));
  EXPECT_NE(ab, mix({dir.Join("b.jsonl"), dir.Join("a.jsonl")}));
  EXPECT_EQ(ab, mix({dir.Join("a.jsonl"), dir.Join("b.jsonl")}));
}

}  // namespace
}  // namespace flashdraft
