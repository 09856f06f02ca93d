#include "common/bpe_trainer.h"

#include <gtest/gtest.h>

#include "common/tokenizer.h"

namespace flashdraft {
namespace {

TEST(BpeTrainerTest, MergesFrequentPairsAndRoundTrips) {
  const std::vector<std::string> texts = {"the cat and the hat", "the the the", "that then"};
  BpeTrainerOptions options;
  options.num_merges = 6;
  absl::StatusOr<std::string> json = TrainByteLevelBpe(texts, options);
  ASSERT_TRUE(json.ok()) << json.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromJson(*json, "trained");
  ASSERT_TRUE(t.ok()) << t.status();
  // "th" is the most frequent pair and becomes id 256; " the" ends up one token.
  EXPECT_EQ((*t)->TokenToId("th"), 256);
  const std::string space = ByteLevelChar(' ');
  ASSERT_TRUE((*t)->TokenToId(space + "the").has_value());
  EXPECT_EQ((*t)->Encode(" the"), std::vector<int32_t>{*(*t)->TokenToId(space + "the")});
  for (const std::string& text : texts) EXPECT_EQ((*t)->Decode((*t)->Encode(text)), text);
  // Added tokens follow the merges (fewer than asked: pairs seen once are not merged).
  const int32_t first = *(*t)->TokenToId("<|endoftext|>");
  EXPECT_GT(first, 257);
  EXPECT_LE(first, 256 + options.num_merges);
  EXPECT_EQ((*t)->TokenToId("</think>"), first + 4);
  EXPECT_EQ((*t)->vocab_size(), first + 5);
  EXPECT_TRUE((*t)->IsSpecial(first + 2));
  EXPECT_FALSE((*t)->IsSpecial(first + 3));
  // Deterministic.
  EXPECT_EQ(*TrainByteLevelBpe(texts, options), *json);
}

}  // namespace
}  // namespace flashdraft
