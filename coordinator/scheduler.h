// The coordinator's schedule (docs/ARCHITECTURE.md): global step s takes the next global batch in
// the (seed, epoch) order, drops samples with fewer than 2·B loss tokens, truncates to max_seq_len,
// packs the batch into K token-balanced virtual shards, draws every sample's anchors from (seed,
// step, sample) and computes Σw; rank r of W computes the contiguous shards [offsets[r],
// offsets[r+1]). With train.virtual_shards set, K is fixed and the shards — what each forward and
// backward sees, to the byte — do not depend on W (only their assignment to ranks does); without
// it K = W, one shard per rank. Everything is a pure function of (seed, step, K, W) and the data,
// so any step can be planned again verbatim (re-issue, resume).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/sources/hidden_state_source.h"
#include "model/anchors.h"

namespace flashdraft {

struct SchedulerOptions {
  uint64_t seed = 0;
  int64_t global_batch_size = 8;
  int64_t block_size = 16;
  int64_t max_anchors = 512;
  double gamma = 7.0;
  int64_t max_seq_len = 3072;
  // K, the fixed number of virtual shards per step; 0: one shard per rank (K = W).
  int64_t virtual_shards = 0;
};

// One virtual shard: the samples one forward/backward computes.
struct MicrobatchPlan {
  std::vector<uint64_t> samples;  // source indices, in the order they are batched
  std::vector<int64_t> lengths;   // after truncation
  int64_t tokens = 0;             // Σ lengths
  double weight_sum = 0;          // Σw of this microbatch
};

struct StepPlan {
  uint64_t step = 0;
  uint64_t epoch = 0;
  double global_weight_sum = 0;
  int64_t tokens = 0;
  std::vector<MicrobatchPlan> shards;  // K, in shard order
  std::vector<int64_t> shard_offsets;  // W + 1: rank r computes [shard_offsets[r], [r+1])
};

// Longest-processing-time bin packing: items sorted by size (ties by index), each to the lightest
// bin (ties to the lowest bin). Returns item indices per bin, each bin in ascending item order.
std::vector<std::vector<size_t>> PackByTokens(const std::vector<int64_t>& sizes, int bins);

// Σ over anchors and slots k = 1..B-1 of [a+k < S] · loss_mask[a+k] · exp(-(k-1)/γ); anchors < 0
// are empty slots.
double AnchorWeightSum(const std::vector<int64_t>& loss_mask, const int64_t* anchors, int64_t count,
                       int64_t block_size, double gamma);

class Scheduler {
 public:
  Scheduler(const HiddenStateSource& source, SchedulerOptions options);

  // K >= W is required (each rank computes at least one shard).
  StepPlan Plan(uint64_t step, int world_size) const;
  int64_t num_shards(int world_size) const {
    return options_.virtual_shards > 0 ? options_.virtual_shards : world_size;
  }
  // Anchors of one sample at one step (what the worker gets), after truncation.
  std::vector<int64_t> Anchors(const Sample& sample, uint64_t step) const;
  uint64_t steps_per_epoch() const;
  const SchedulerOptions& options() const { return options_; }

  // Truncates a sample to max_seq_len in place.
  void Truncate(Sample& sample) const;

 private:
  uint64_t SampleAt(uint64_t position, uint64_t* epoch) const ABSL_LOCKS_EXCLUDED(mu_);

  const HiddenStateSource& source_;
  SchedulerOptions options_;
  // The order of the last epoch asked for, kept for the next step.
  mutable absl::Mutex mu_;
  mutable uint64_t cached_epoch_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;
  mutable std::vector<uint64_t> permutation_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashdraft
