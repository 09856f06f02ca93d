// The fixed summation tree of the deterministic gradient reduction (issue "bitwise world-size
// invariance"). A step's K virtual shards are the leaves 0..K-1 of one binary tree that depends on
// K only: node [lo, hi) with n = hi - lo > 1 has the children [lo, mid) and [mid, hi), mid = lo +
// the largest power of two below n. The step's gradient is this tree's value, each inner node the
// float sum of its children. Float addition is commutative but not associative, so the tree fixes
// every rounding: whoever adds two nodes, the bits are the same.
//
// A rank that owns the contiguous shards [a, b) builds the maximal tree nodes inside [a, b) by
// itself (Cover); the ranks' covers partition [0, K) into nodes, from which any rank finishes the
// same tree. ShardStack is the bookkeeping for both halves: push nodes left to right, and it says
// which adjacent pairs to add, in which order.
// No LibTorch here: the worker's GradientReducer applies the additions to tensors; the scheduler
// lays the shards out with ShardOffsets.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace flashdraft {

struct ShardNode {
  int64_t lo = 0, hi = 0;  // the leaves [lo, hi)
  bool operator==(const ShardNode& o) const { return lo == o.lo && hi == o.hi; }
};

// The split point of node [lo, hi) (hi - lo >= 2).
int64_t ShardTreeSplit(int64_t lo, int64_t hi);

// Whether [lo, hi) is a node of the tree over [0, num_shards).
bool IsShardTreeNode(int64_t num_shards, ShardNode node);

// The maximal tree nodes inside [a, b), left to right (empty when a >= b).
std::vector<ShardNode> ShardTreeCover(int64_t num_shards, int64_t a, int64_t b);

// Contiguous shard ranges of W ranks: rank r owns [offsets[r], offsets[r+1]), as balanced as
// counts allow (K >= W: every rank owns at least one shard).
std::vector<int64_t> ShardOffsets(int64_t num_shards, int world_size);

// A stack of tree nodes pushed left to right. After each Push, the caller adds the pairs Push
// returns, in order: {i, i+1} means "slot i += slot i+1, then slot i+1 is gone" (slots are
// positions in the stack, bottom = 0). The pairs are exactly the tree's inner nodes that the pushed
// nodes complete.
class ShardStack {
 public:
  explicit ShardStack(int64_t num_shards) : num_shards_(num_shards) {}

  std::vector<std::pair<int, int>> Push(ShardNode node);
  const std::vector<ShardNode>& nodes() const { return nodes_; }
  int size() const { return static_cast<int>(nodes_.size()); }
  void Clear() { nodes_.clear(); }

 private:
  int64_t num_shards_;
  std::vector<ShardNode> nodes_;
};

}  // namespace flashdraft
