#include "common/shard_tree.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace flashdraft {
namespace {

using ::testing::ElementsAre;

TEST(ShardTreeTest, SplitsAtTheLargestPowerOfTwoBelowTheSize) {
  EXPECT_EQ(ShardTreeSplit(0, 2), 1);
  EXPECT_EQ(ShardTreeSplit(0, 3), 2);
  EXPECT_EQ(ShardTreeSplit(0, 4), 2);
  EXPECT_EQ(ShardTreeSplit(0, 5), 4);
  EXPECT_EQ(ShardTreeSplit(0, 8), 4);
  EXPECT_EQ(ShardTreeSplit(8, 11), 10);
}

TEST(ShardTreeTest, CoverIsTheMaximalNodesInsideARange) {
  EXPECT_THAT(ShardTreeCover(8, 0, 8), ElementsAre(ShardNode{0, 8}));
  EXPECT_THAT(ShardTreeCover(8, 0, 4), ElementsAre(ShardNode{0, 4}));
  EXPECT_THAT(ShardTreeCover(8, 2, 5), ElementsAre(ShardNode{2, 4}, ShardNode{4, 5}));
  EXPECT_THAT(ShardTreeCover(8, 5, 8), ElementsAre(ShardNode{5, 6}, ShardNode{6, 8}));
  EXPECT_THAT(ShardTreeCover(6, 0, 3), ElementsAre(ShardNode{0, 2}, ShardNode{2, 3}));
  EXPECT_TRUE(ShardTreeCover(8, 3, 3).empty());
  for (const ShardNode& n : ShardTreeCover(13, 3, 11)) EXPECT_TRUE(IsShardTreeNode(13, n));
  EXPECT_FALSE(IsShardTreeNode(8, {0, 5}));
  EXPECT_FALSE(IsShardTreeNode(8, {2, 6}));
}

TEST(ShardTreeTest, OffsetsGiveEveryRankAContiguousBalancedRange) {
  EXPECT_THAT(ShardOffsets(8, 1), ElementsAre(0, 8));
  EXPECT_THAT(ShardOffsets(8, 2), ElementsAre(0, 4, 8));
  EXPECT_THAT(ShardOffsets(8, 3), ElementsAre(0, 2, 5, 8));
  EXPECT_THAT(ShardOffsets(3, 3), ElementsAre(0, 1, 2, 3));
}

// The tree's value over float leaves, recursively: the definition the stack must reproduce.
float TreeSum(const std::vector<float>& leaves, int64_t lo, int64_t hi) {
  if (hi - lo == 1) return leaves[lo];
  const int64_t mid = ShardTreeSplit(lo, hi);
  return TreeSum(leaves, lo, mid) + TreeSum(leaves, mid, hi);
}

// Pushes `nodes` (values given) and applies the additions the stack asks for.
float StackSum(int64_t k, const std::vector<ShardNode>& nodes, const std::vector<float>& values) {
  ShardStack stack(k);
  std::vector<float> slots;
  for (size_t i = 0; i < nodes.size(); ++i) {
    slots.push_back(values[i]);
    for (const auto& [into, from] : stack.Push(nodes[i])) {
      EXPECT_EQ(from, into + 1);
      EXPECT_EQ(from, static_cast<int>(slots.size()) - 1);
      slots[into] += slots[from];
      slots.pop_back();
    }
  }
  EXPECT_EQ(stack.size(), 1);
  return slots.at(0);
}

// Whatever the number of ranks, local partial trees finished by the stack give the bits of the
// whole tree. The leaves span 40 binary orders of magnitude, so another order rounds differently
// (checked: a left-to-right sum differs for some K).
TEST(ShardTreeTest, EveryWorldSizeGivesTheSameBits) {
  std::mt19937 rng(3);
  int order_matters = 0;
  std::uniform_real_distribution<float> exponent(-20, 20);
  for (int64_t k : {1, 2, 3, 5, 8, 13, 16}) {
    std::vector<float> leaves;
    for (int64_t i = 0; i < k; ++i) leaves.push_back(std::ldexp(1.0f + 1e-3f * i, exponent(rng)));
    const float want = TreeSum(leaves, 0, k);
    float sequential = 0;
    for (float x : leaves) sequential += x;
    order_matters += sequential != want;
    for (int world = 1; world <= k; ++world) {
      const std::vector<int64_t> offsets = ShardOffsets(k, world);
      std::vector<ShardNode> all;
      std::vector<float> partials;
      for (int r = 0; r < world; ++r) {
        // The rank's own stack over its leaves leaves exactly its cover.
        ShardStack local(k);
        std::vector<float> slots;
        for (int64_t s = offsets[r]; s < offsets[r + 1]; ++s) {
          slots.push_back(leaves[s]);
          for (const auto& [into, from] : local.Push({s, s + 1})) {
            slots[into] += slots[from];
            slots.pop_back();
          }
        }
        EXPECT_EQ(local.nodes(), ShardTreeCover(k, offsets[r], offsets[r + 1]));
        all.insert(all.end(), local.nodes().begin(), local.nodes().end());
        partials.insert(partials.end(), slots.begin(), slots.end());
      }
      const float got = StackSum(k, all, partials);
      EXPECT_EQ(std::memcmp(&got, &want, sizeof(float)), 0)
          << "K " << k << " W " << world << ": " << got << " vs " << want;
    }
  }
  EXPECT_GT(order_matters, 0);
}

TEST(ShardTreeTest, PushingOutOfOrderIsABug) {
  ShardStack stack(4);
  stack.Push({0, 1});
  EXPECT_DEATH(stack.Push({2, 3}), "left to right");
}

}  // namespace
}  // namespace flashdraft
