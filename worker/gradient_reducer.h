// Sums a step's gradients across ranks in buckets while backward is still running
// (docs/ARCHITECTURE.md), the way c10d's DDP reducer does:
//  - parameters are grouped, in reverse registration order (about the order backward produces
//    their gradients), into flat buckets of at most `bucket_bytes` per dtype;
//  - every parameter's .grad is an alias of its slice of its bucket, so autograd accumulates
//    straight into the bucket (no copy in, no copy out);
//  - a hook after each parameter's AccumulateGrad counts the bucket down; a bucket whose gradients
//    are all there starts its exchange on the collective's threads at once, while backward goes
//    on with the next layers. Buckets start in bucket order on every rank (collectives must match),
//    so a bucket that is ready early waits for the ones before it.
//
// Two ways to sum (GradientReducerOptions::ordered):
//  - plain: one shard per rank, each bucket all-reduced (Gloo's ring; the float summation order
//    depends on the world size);
//  - ordered: the step's K virtual shards are summed by the fixed tree of shard_tree.h, so the
//    result is the same bits whichever rank computed which shard and however many ranks there are.
//    Each local shard's gradient goes into its own bucket slot; sibling tree nodes are added as
//    soon as both exist (a rank keeps O(log K) slots, not K); after the last local shard each
//    bucket is cut into W slices, an all-to-all brings every rank's tree nodes of slice r to rank
//    r, which finishes the tree for its slice, and an all-gather returns the slices to everyone.
//    With K = W that moves the bytes of a ring all-reduce.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/shard_tree.h"
#include "worker/collective/collective.h"

namespace torch::autograd {
struct Node;
}

namespace flashdraft {

struct GradientReducerOptions {
  size_t bucket_bytes = 4 << 20;
  bool ordered = false;
};

class GradientReducer {
 public:
  // `collective` must outlive the reducer. Plain with one rank: nothing is hooked or reduced.
  // Destroying it does not wait for exchanges in flight (a superseded group's may never end); the
  // backend keeps their tensors alive.
  GradientReducer(std::vector<torch::Tensor> params, Collective* collective,
                  GradientReducerOptions options);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Ordered only, before a step: the step has `num_shards` shards and rank r owns the shards
  // [offsets[r], offsets[r+1]). Checks the layout (W+1 ascending offsets from 0 to num_shards,
  // every rank owning at least one shard).
  absl::Status BeginStep(int64_t num_shards, const std::vector<int64_t>& offsets);
  // Before each local shard's backward (plain: the one per step; ordered: each of the rank's
  // shards in shard order): makes every parameter's .grad an alias into a zeroed bucket slot and
  // rearms the buckets. One backward per Prepare; a shard with no backward contributes zeros.
  void Prepare();
  // After the last local shard: starts what has not started and waits for all. The parameters'
  // gradients then hold the sums over all shards of all ranks. ABORTED as soon as abort() says so
  // (the step is dropped: a new membership epoch superseded this group).
  absl::Status Finish(const AbortCheck& abort = nullptr);

  size_t num_buckets() const { return num_buckets_; }
  // How many buckets of the last step started before Finish(), i.e. overlapped with backward.
  int started_during_backward() const {
    absl::MutexLock lock(&mu_);
    return started_during_backward_;
  }
  // Gradient bytes this rank sent to other ranks in the last step (the ring all-reduce's
  // 2·(W-1)/W of each bucket in plain mode; the all-to-all and all-gather payloads when ordered).
  uint64_t bytes_sent() const {
    absl::MutexLock lock(&mu_);
    return bytes_sent_;
  }

 private:
  struct Bucket {
    std::vector<torch::Tensor> slots;  // ordered: one per stack slot; plain: one
    torch::TensorOptions options;
    int64_t numel = 0;
    int64_t slice = 0;    // ordered: elements per rank's slice (slots are W·slice long)
    size_t pending = 0;   // gradients of the current shard not accumulated yet
    bool merged = false;  // ordered: the current shard's tree additions are done
    torch::Tensor send, recv;
    std::unique_ptr<CollectiveWork> work;
  };
  void OnGradient(size_t param) ABSL_LOCKS_EXCLUDED(mu_);
  void StartReadyBuckets() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartBucket(Bucket& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The current shard's tree additions in `b`.
  void MergeShard(Bucket& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  torch::Tensor& Slot(Bucket& b, int slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const torch::Tensor& Alias(int slot, size_t param) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FinishOrdered(const AbortCheck& abort) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Fixed at construction.
  const std::vector<torch::Tensor> params_;
  const GradientReducerOptions options_;
  Collective* const collective_;
  size_t num_buckets_ = 0;
  std::vector<size_t> bucket_of_;
  std::vector<int64_t> offset_in_bucket_;  // -1: not reduced (no gradient)
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  // The training thread and autograd's hooks (one thread on CPU, not necessarily on GPUs) share
  // the rest.
  mutable absl::Mutex mu_;
  std::vector<Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<torch::Tensor>> aliases_ ABSL_GUARDED_BY(mu_);  // [slot][param]
  std::vector<bool> seen_ ABSL_GUARDED_BY(mu_);
  size_t next_to_start_ ABSL_GUARDED_BY(mu_) = 0;
  bool in_backward_ ABSL_GUARDED_BY(mu_) = false;
  int started_during_backward_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_sent_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  // Ordered: this step's layout and progress through the rank's shards.
  int64_t num_shards_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> offsets_ ABSL_GUARDED_BY(mu_);
  // Every rank's tree nodes left to right (the partition of [0, K) the tree is finished from),
  // and how many of them each rank sends.
  std::vector<ShardNode> step_nodes_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> nodes_per_rank_ ABSL_GUARDED_BY(mu_);
  int64_t next_shard_ ABSL_GUARDED_BY(mu_) = 0;  // the global index of the next local shard
  int current_slot_ ABSL_GUARDED_BY(mu_) = 0;    // where this shard's gradients accumulate
  ShardStack stack_ ABSL_GUARDED_BY(mu_){1};
  // The current shard's tree additions.
  std::vector<std::pair<int, int>> pending_adds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashdraft
