#include "coordinator/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <set>

#include "common/file_util.h"
#include "coordinator/sources/shard_source.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PackByTokensTest, BalancesTokensNotSamples) {
  struct Case {
    std::vector<int64_t> sizes;
    int bins;
    std::vector<int64_t> loads;  // expected per-bin token sums
  };
  const Case cases[] = {
      {{100, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10}, 2, {100, 100}},  // 1 long vs 10 short
      {{5, 5, 5, 5}, 2, {10, 10}},
      {{7, 6, 5, 4, 3, 2, 1}, 3, {9, 9, 10}},
      {{3}, 2, {3, 0}},  // fewer samples than ranks: an empty microbatch
      {{}, 1, {0}},
  };
  for (const Case& c : cases) {
    auto bins = PackByTokens(c.sizes, c.bins);
    ASSERT_EQ(static_cast<int>(bins.size()), c.bins);
    std::vector<int64_t> loads;
    std::set<size_t> seen;
    for (const auto& b : bins) {
      int64_t load = 0;
      for (size_t i : b) {
        load += c.sizes[i];
        EXPECT_TRUE(seen.insert(i).second) << "item " << i << " packed twice";
      }
      loads.push_back(load);
    }
    EXPECT_EQ(seen.size(), c.sizes.size());
    std::sort(loads.begin(), loads.end());
    std::vector<int64_t> expected = c.loads;
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(loads, expected);
  }
}

TEST(AnchorWeightSumTest, CountsValidLossSlotsWithDecay) {
  const std::vector<int64_t> mask = {0, 1, 1, 1, 0, 1};
  const int64_t anchors[] = {1, 4, -1};
  // B = 3: anchor 1 -> slots 2,3 (both masked in): 1 + e^-1/γ; anchor 4 -> slot 5 (1), slot 6 past
  // S.
  const double gamma = 2.0;
  EXPECT_NEAR(AnchorWeightSum(mask, anchors, 3, 3, gamma), 1 + std::exp(-0.5) + 1, 1e-6);
}

struct Data {
  ::flashdraft::testing::TempDir dir;
  std::unique_ptr<ShardSource> source;
};

std::unique_ptr<Data> MakeData(int samples, int feature_size) {
  auto d = std::make_unique<Data>();
  ShardWriter writer(d->dir.path(), feature_size, DType::kF32, 7);
  std::mt19937 rng(1);
  for (int i = 0; i < samples; ++i) {
    const int len = 40 + static_cast<int>(rng() % 60);
    std::vector<int64_t> ids(len), mask(len);
    for (int t = 0; t < len; ++t) {
      ids[t] = rng() % 50;
      mask[t] = t >= 5;
    }
    if (i == 3) std::fill(mask.begin(), mask.end(), 0);  // dropped: < 2B loss tokens
    std::vector<float> feats(len * feature_size, static_cast<float>(i));
    EXPECT_TRUE(writer.Add(ids, mask, feats.data()).ok());
  }
  writer.SetMetadata("note", "test");
  EXPECT_TRUE(writer.Finish().ok());
  auto source = ShardSource::Open(d->dir.path());
  EXPECT_TRUE(source.ok()) << source.status();
  d->source = std::move(*source);
  return d;
}

TEST(ShardSourceTest, RoundTripsSamplesAcrossShards) {
  auto d = MakeData(20, 4);
  EXPECT_EQ(d->source->num_samples(), 20u);
  EXPECT_EQ(d->source->metadata().at("note"), "test");
  for (uint64_t i : {0, 6, 7, 19}) {
    auto s = d->source->Get(i);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->length(), d->source->SampleLength(i));
    float f;
    std::memcpy(&f, s->features + (s->length() * 4 - 1) * 4, 4);
    EXPECT_EQ(f, static_cast<float>(i));  // the last feature of sample i belongs to sample i
  }
  EXPECT_EQ(d->source->Get(20).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(ShardSourceTest, BadManifestsAreNamed) {
  auto d = MakeData(8, 4);
  const std::string manifest = d->dir.Join("manifest.json");
  auto text = ReadFile(manifest);
  ASSERT_TRUE(text.ok());
  struct Case {
    std::string from, to;
    const char* error;
  };
  const Case cases[] = {
      {"flashdraft-shards-v1", "v0", "\"format\" must be \"flashdraft-shards-v1\""},
      {"\"num_samples\": 8", "\"num_samples\": 9", "says 9 samples but the shards hold 8"},
      {"shard-00001.safetensors", "shard-00009.safetensors",
       "shard-00009.safetensors: cannot open"},
      {"\"feature_size\": 4", "\"feature_size\": 5", "tensor 'hidden_states': shape is"},
  };
  for (const Case& c : cases) {
    std::string t = *text;
    const size_t at = t.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    t.replace(at, c.from.size(), c.to);
    ASSERT_TRUE(WriteFileAtomically(manifest, t).ok());
    auto source = ShardSource::Open(d->dir.path());
    ASSERT_FALSE(source.ok()) << c.from;
    EXPECT_THAT(std::string(source.status().message()), HasSubstr(c.error));
  }
}

TEST(SchedulerTest, PlansAreDeterministicAndIndependentOfWorldSize) {
  auto d = MakeData(30, 4);
  SchedulerOptions o;
  o.seed = 3;
  o.global_batch_size = 8;
  o.block_size = 8;
  o.max_anchors = 10;
  o.gamma = 4.0;
  o.max_seq_len = 64;
  Scheduler scheduler(*d->source, o);
  for (uint64_t step : {0, 1, 5}) {
    StepPlan one = scheduler.Plan(step, 1), two = scheduler.Plan(step, 2),
             three = scheduler.Plan(step, 3), again = scheduler.Plan(step, 2);
    std::multiset<uint64_t> s1(one.shards[0].samples.begin(), one.shards[0].samples.end());
    std::multiset<uint64_t> s2;
    for (const auto& mb : two.shards) s2.insert(mb.samples.begin(), mb.samples.end());
    EXPECT_EQ(s1, s2);
    EXPECT_NEAR(one.global_weight_sum, two.global_weight_sum, 1e-9);
    EXPECT_NEAR(one.global_weight_sum, three.global_weight_sum, 1e-9);
    EXPECT_EQ(two.shards[0].samples, again.shards[0].samples);
    EXPECT_EQ(one.tokens, two.tokens);
    EXPECT_THAT(three.shard_offsets, ElementsAre(0, 1, 2, 3));
    for (const auto& mb : one.shards) {
      for (int64_t len : mb.lengths) EXPECT_LE(len, 64);  // truncated to max_seq_len
    }
  }
  // Sample 3 has no loss tokens: never scheduled.
  for (uint64_t step = 0; step < 8; ++step) {
    for (const auto& mb : scheduler.Plan(step, 2).shards) {
      EXPECT_EQ(std::count(mb.samples.begin(), mb.samples.end(), 3u), 0);
    }
  }
}

// With train.virtual_shards the shards are the same whatever W is — samples, order, lengths and
// Σw to the bit — and only their assignment to ranks changes.
TEST(SchedulerTest, VirtualShardsDoNotDependOnWorldSize) {
  auto d = MakeData(30, 4);
  SchedulerOptions o;
  o.seed = 5;
  o.global_batch_size = 7;
  o.block_size = 8;
  o.max_anchors = 10;
  o.gamma = 4.0;
  o.max_seq_len = 64;
  o.virtual_shards = 4;
  Scheduler scheduler(*d->source, o);
  for (uint64_t step : {0, 3}) {
    const StepPlan one = scheduler.Plan(step, 1);
    ASSERT_EQ(one.shards.size(), 4u);
    EXPECT_THAT(one.shard_offsets, ElementsAre(0, 4));
    for (int world : {2, 3, 4}) {
      const StepPlan other = scheduler.Plan(step, world);
      ASSERT_EQ(other.shards.size(), 4u);
      for (size_t k = 0; k < 4; ++k) {
        EXPECT_EQ(other.shards[k].samples, one.shards[k].samples)
            << "W " << world << " shard " << k;
        EXPECT_EQ(other.shards[k].lengths, one.shards[k].lengths);
        EXPECT_EQ(std::memcmp(&other.shards[k].weight_sum, &one.shards[k].weight_sum, 8), 0);
      }
      EXPECT_EQ(std::memcmp(&other.global_weight_sum, &one.global_weight_sum, 8), 0);
      EXPECT_EQ(other.shard_offsets.size(), static_cast<size_t>(world + 1));
    }
  }
}

}  // namespace
}  // namespace flashdraft
