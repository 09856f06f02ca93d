// Speculative decoding (DFLASH.md §5) against plain greedy decoding of the same target: the output
// is identical for every prompt and block size, whatever the drafter proposes; cycles accept
// between 1 and B tokens and account for every token after the first.
#include "model/speculative.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>

#include "model/generate.h"
#include "model/test_targets.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::RandomTarget;
using ::flashdraft::testing::SmallQwen3;

TEST(SpeculativeTest, OutputEqualsGreedyDecodingForEveryBlockSize) {
  const TargetModelConfig t = SmallQwen3();
  auto target = RandomTarget(t, 1);
  ASSERT_NE(target, nullptr);
  DrafterModelConfig d = DrafterConfigForTarget(t, {0, 2}, 256, -1);
  d.block_size = 6;
  Drafter drafter(d);
  drafter->InitWeights(2);
  drafter->SetFrozen(target->embed_tokens(), target->lm_head());
  const std::vector<std::vector<int64_t>> prompts = {{7}, {3, 9, 27, 1, 40}, {5, 5, 5, 5, 5, 5, 5}};
  for (const auto& prompt : prompts) {
    auto greedy = GreedyGenerate(*target, prompt, 40, {});
    ASSERT_TRUE(greedy.ok()) << greedy.status();
    for (int64_t block : {2, 4, 6}) {
      SCOPED_TRACE(::testing::Message() << "prompt of " << prompt.size() << ", block " << block);
      SpeculativeOptions o;
      o.max_new_tokens = 40;
      o.block_size = block;
      auto spec = SpeculativeGenerate(*target, *drafter, prompt, o);
      ASSERT_TRUE(spec.ok()) << spec.status();
      EXPECT_EQ(spec->tokens, *greedy);
      ASSERT_FALSE(spec->accepted.empty());
      for (int64_t a : spec->accepted) {
        EXPECT_GE(a, 1);
        EXPECT_LE(a, block);
      }
      // Every token after the first came from a cycle (the last cycle may be cut at the limit).
      const int64_t total =
          std::accumulate(spec->accepted.begin(), spec->accepted.end(), int64_t{0});
      EXPECT_GE(total, 39);
      EXPECT_LT(total - spec->accepted.back(), 39);
    }
  }
  // A stop token ends both the same way, and is included.
  auto greedy = GreedyGenerate(*target, prompts[1], 40, {});
  ASSERT_TRUE(greedy.ok());
  const int64_t stop = (*greedy)[9];
  auto stopped = GreedyGenerate(*target, prompts[1], 40, {stop});
  SpeculativeOptions o;
  o.max_new_tokens = 40;
  o.stop_ids = {stop};
  auto spec = SpeculativeGenerate(*target, *drafter, prompts[1], o);
  ASSERT_TRUE(spec.ok() && stopped.ok());
  EXPECT_EQ(spec->tokens, *stopped);
  EXPECT_EQ(spec->tokens.back(), stop);

  o.block_size = 7;  // beyond the drafter's
  EXPECT_THAT(SpeculativeGenerate(*target, *drafter, prompts[1], o).status().message(),
              ::testing::HasSubstr("block size 7 must be in 2 .. 6"));
}

}  // namespace
}  // namespace flashdraft

namespace flashdraft {
namespace {

// τ is the mean over prompts that had cycles; a cycle that accepted a tokens accepted the drafts
// at positions 1 .. a-1; vLLM's counters count B-1 drafted tokens per cycle.
TEST(SpeculativeTallyTest, FiguresOfManyPrompts) {
  SpeculativeTally tally(4);
  SpeculativeResult a, b, none;
  a.accepted = {4, 1, 2};  // τ 7/3
  b.accepted = {3};        // τ 3
  tally.Add(a);
  tally.Add(b);
  tally.Add(none);  // no cycle: counted as a prompt, not in τ
  EXPECT_EQ(tally.prompts(), 3);
  EXPECT_EQ(tally.cycles(), 4);
  EXPECT_DOUBLE_EQ(tally.Tau(), (7.0 / 3 + 3.0) / 2);
  EXPECT_EQ(tally.histogram(), (std::vector<int64_t>{0, 1, 1, 1, 1}));
  EXPECT_EQ(tally.AcceptedPerPosition(), (std::vector<int64_t>{3, 2, 1}));
  EXPECT_EQ(tally.AcceptancePerPosition(), (std::vector<double>{0.75, 0.5, 0.25}));
  EXPECT_EQ(tally.draft_tokens(), 12);
  EXPECT_EQ(tally.accepted_tokens(), 3 + 0 + 1 + 2);
  EXPECT_DOUBLE_EQ(SpeculativeTally(4).Tau(), 0);
}

}  // namespace
}  // namespace flashdraft
