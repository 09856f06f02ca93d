#include "common/shard_tree.h"

#include "glog/logging.h"

namespace flashdraft {

int64_t ShardTreeSplit(int64_t lo, int64_t hi) {
  CHECK_GE(hi - lo, 2);
  int64_t half = 1;
  while (half * 2 < hi - lo) half *= 2;
  return lo + half;
}

bool IsShardTreeNode(int64_t num_shards, ShardNode node) {
  int64_t lo = 0, hi = num_shards;
  while (true) {
    if (node.lo == lo && node.hi == hi) return true;
    if (hi - lo < 2 || node.lo < lo || node.hi > hi) return false;
    const int64_t mid = ShardTreeSplit(lo, hi);
    if (node.hi <= mid) {
      hi = mid;
    } else if (node.lo >= mid) {
      lo = mid;
    } else {
      return false;
    }
  }
}

namespace {
void Cover(int64_t lo, int64_t hi, int64_t a, int64_t b, std::vector<ShardNode>& out) {
  if (hi <= a || lo >= b || lo >= hi) return;
  if (a <= lo && hi <= b) {
    out.push_back({lo, hi});
    return;
  }
  const int64_t mid = ShardTreeSplit(lo, hi);
  Cover(lo, mid, a, b, out);
  Cover(mid, hi, a, b, out);
}
}  // namespace

std::vector<ShardNode> ShardTreeCover(int64_t num_shards, int64_t a, int64_t b) {
  std::vector<ShardNode> out;
  Cover(0, num_shards, a, b, out);
  return out;
}

std::vector<int64_t> ShardOffsets(int64_t num_shards, int world_size) {
  CHECK_GT(world_size, 0);
  std::vector<int64_t> offsets(world_size + 1);
  for (int r = 0; r <= world_size; ++r) offsets[r] = num_shards * r / world_size;
  return offsets;
}

std::vector<std::pair<int, int>> ShardStack::Push(ShardNode node) {
  CHECK(nodes_.empty() || nodes_.back().hi == node.lo)
      << "shard nodes must be pushed left to right without gaps";
  nodes_.push_back(node);
  std::vector<std::pair<int, int>> adds;
  while (nodes_.size() >= 2) {
    const ShardNode left = nodes_[nodes_.size() - 2], right = nodes_.back();
    const ShardNode parent{left.lo, right.hi};
    if (!IsShardTreeNode(num_shards_, parent) || ShardTreeSplit(parent.lo, parent.hi) != left.hi) {
      break;
    }
    nodes_.pop_back();
    nodes_.back() = parent;
    adds.emplace_back(size() - 1, size());
  }
  return adds;
}

}  // namespace flashdraft
