// Speculative decoding (DFLASH.md §5) against plain greedy decoding of the same target: the output
// is identical for every prompt and block size, whatever the drafter proposes; cycles accept
// between 1 and B tokens and account for every token after the first.
#include "model/speculative.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "model/generate.h"
#include "model/test_targets.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::RandomTarget;
using ::flashdraft::testing::SmallQwen3;

// An untrained drafter of `block` for the target, reading its layers 0 and 2.
Drafter RandomDrafter(const TargetModel& target, const TargetModelConfig& t, int64_t block) {
  DrafterModelConfig d = DrafterConfigForTarget(t, {0, 2}, 256, -1);
  d.block_size = block;
  Drafter drafter(d);
  drafter->InitWeights(2);
  drafter->SetFrozen(target.embed_tokens(), target.lm_head());
  return drafter;
}

TEST(SpeculativeTest, OutputEqualsGreedyDecodingForEveryBlockSize) {
  const TargetModelConfig t = SmallQwen3();
  auto target = RandomTarget(t, 1);
  ASSERT_NE(target, nullptr);
  Drafter drafter = RandomDrafter(*target, t, 6);
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

// z-lab's dflash_generate loop, written out as its Python reads (the reference for the cycles
// `tau_zlab` counts): output positions after the prompt, `start` the one holding the last known
// token; it verifies while start < max_new_tokens and checks for stop tokens after each cycle.
std::vector<int64_t> ZlabAcceptanceLengths(const TargetModel& target, DrafterImpl& drafter,
                                           const std::vector<int64_t>& prompt, int64_t max_new,
                                           int64_t block, const std::vector<int64_t>& stops) {
  torch::NoGradGuard no_grad;
  const std::vector<int>& layers = drafter.config().target_layer_ids;
  KvCache cache;
  DrafterContext context;
  // The prefill as SpeculativeGenerate's (the prompt but its last token, then the last token), so
  // that both see the same bits.
  const std::vector<int64_t> head(prompt.begin(), prompt.end() - 1);
  auto features = target.Forward(torch::tensor(head).unsqueeze(0), layers, false, &cache);
  drafter.ExtendContext(context, features->features);
  auto prefill = target.Forward(torch::tensor({prompt.back()}).unsqueeze(0), layers, true, &cache);
  drafter.ExtendContext(context, prefill->features);
  std::vector<int64_t> output = {prefill->logits.index({0, -1}).argmax().item<int64_t>()};
  std::vector<int64_t> lengths;
  int64_t start = 0;
  while (start < max_new) {
    std::vector<int64_t> ids = {output[static_cast<size_t>(start)]};
    for (int64_t t : drafter.Draft(context, ids[0], block)) ids.push_back(t);
    const int64_t before = cache.length();
    auto v = target.Forward(torch::tensor(ids).unsqueeze(0), layers, true, &cache);
    const torch::Tensor posterior = v->logits.squeeze(0).argmax(-1);
    int64_t a = 0;
    while (a < block - 1 && ids[a + 1] == posterior[a].item<int64_t>()) ++a;
    output.resize(static_cast<size_t>(start + a + 2));
    for (int64_t i = 0; i <= a; ++i) output[static_cast<size_t>(start + i)] = ids[i];
    output[static_cast<size_t>(start + a + 1)] = posterior[a].item<int64_t>();
    start += a + 1;
    for (size_t l = 0; l < cache.keys.size(); ++l) {
      cache.keys[l] = cache.keys[l].narrow(2, 0, before + a + 1);
      cache.values[l] = cache.values[l].narrow(2, 0, before + a + 1);
    }
    drafter.ExtendContext(context, v->features.narrow(1, 0, a + 1));
    lengths.push_back(a + 1);
    bool stopped = false;
    for (int64_t id : output) stopped |= std::find(stops.begin(), stops.end(), id) != stops.end();
    if (stopped) break;
  }
  return lengths;
}

// On the same decode, the cycles behind tau_zlab (`accepted` and the final cycle) are z-lab's
// loop's, for every max_new_tokens from 1 (where every decode landing exactly on it runs one more)
// and with stop tokens, the prefill's own token among them.
TEST(SpeculativeTest, TheFinalCycleMakesTheCyclesZlabsLoopCounts) {
  const TargetModelConfig t = SmallQwen3();
  auto target = RandomTarget(t, 1);
  ASSERT_NE(target, nullptr);
  Drafter drafter = RandomDrafter(*target, t, 4);
  const std::vector<int64_t> prompt = {3, 9, 27, 1, 40};
  auto greedy = GreedyGenerate(*target, prompt, 24, {});
  ASSERT_TRUE(greedy.ok());
  int final_cycles = 0;
  for (const std::vector<int64_t>& stops :
       {std::vector<int64_t>{}, {(*greedy)[0]}, {(*greedy)[6]}}) {
    for (int64_t max_new = 1; max_new <= 24; ++max_new) {
      SCOPED_TRACE(::testing::Message()
                   << "max_new_tokens " << max_new << ", " << stops.size() << " stop token(s)");
      SpeculativeOptions o;
      o.max_new_tokens = max_new;
      o.stop_ids = stops;
      o.zlab_final_cycle = true;
      auto spec = SpeculativeGenerate(*target, *drafter, prompt, o);
      ASSERT_TRUE(spec.ok()) << spec.status();
      std::vector<int64_t> counted = spec->accepted;
      if (spec->final_cycle) {
        counted.push_back(spec->final_cycle->accepted);
        ++final_cycles;
      }
      EXPECT_EQ(counted, ZlabAcceptanceLengths(*target, *drafter, prompt, max_new, 4, stops));
      o.zlab_final_cycle = false;
      auto plain = SpeculativeGenerate(*target, *drafter, prompt, o);
      ASSERT_TRUE(plain.ok());
      EXPECT_EQ(plain->tokens, spec->tokens);
      EXPECT_FALSE(plain->final_cycle);
    }
  }
  EXPECT_GT(final_cycles, 2) << "the test never reached the case it is about";
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

// The same decodes as z-lab's benchmark.py, vLLM and SGLang count them (docs/serving.md).
TEST(SpeculativeTallyTest, TheReferencesCountTheSameDecodesTheirWay) {
  SpeculativeTally tally(8);
  SpeculativeResult a, b, stopped_first;
  // 64 new tokens: the prefill's and 13 cycles that accepted 63, landing on max_new_tokens, so
  // z-lab verifies a 14th time (accepting 1).
  a.accepted = std::vector<int64_t>(13, 5);  // 11 x 5 + 2 x 4 = 63
  a.accepted[11] = a.accepted[12] = 4;
  a.tokens.assign(64, 1);
  a.final_cycle = FinalCycle{1, 0.0};
  // 9 new tokens from 2 cycles, the second cut at max_new_tokens 9 (it accepted 6, 3 kept).
  b.accepted = {3, 6};
  b.tokens.assign(9, 1);
  // The prefill's token was a stop token: no cycle here, one for z-lab.
  stopped_first.tokens = {2};
  stopped_first.final_cycle = FinalCycle{5, 0.0};
  tally.Add(a);
  tally.Add(b);
  tally.Add(stopped_first);
  EXPECT_NEAR(a.Tau(), 63.0 / 13, 1e-12);
  EXPECT_NEAR(a.TauZlab(), 64.0 / 14, 1e-12);
  EXPECT_DOUBLE_EQ(tally.Tau(), (63.0 / 13 + 9.0 / 2) / 2);
  EXPECT_DOUBLE_EQ(tally.TauZlab(), (64.0 / 14 + 9.0 / 2 + 5.0) / 3);
  EXPECT_DOUBLE_EQ(tally.TauPooled(), 1.0 + (63.0 - 13 + 9.0 - 2) / 15);
  EXPECT_DOUBLE_EQ(tally.TauSglang(), (64.0 / 13 + 9.0 / 2) / 2);
  EXPECT_DOUBLE_EQ(SpeculativeTally(8).TauZlab(), 0);
  EXPECT_DOUBLE_EQ(SpeculativeTally(8).TauPooled(), 0);
  EXPECT_DOUBLE_EQ(SpeculativeTally(8).TauSglang(), 0);
}

}  // namespace
}  // namespace flashdraft
