// Anchor sampling (DFLASH.md §4), torch-free so the coordinator can draw anchors without LibTorch.
// All randomness comes from (seed, step, sample id): the draw does not depend on which worker
// trains a sample or how the batch is split.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace flashdraft {

// Positions i in [0, S-2] with loss_mask[i] && loss_mask[i+1].
std::vector<int64_t> AnchorCandidates(absl::Span<const int64_t> loss_mask);

// min(max_anchors, candidates) distinct candidates, uniformly at random, sorted.
std::vector<int64_t> SampleAnchors(absl::Span<const int64_t> candidates, int64_t max_anchors,
                                   uint64_t seed, uint64_t step, uint64_t sample_id);

// A batch's anchors as a row-major [b, N] matrix with -1 for empty slots, N = min(max_anchors, the
// largest candidate count in the batch) (at least 1).
struct AnchorMatrix {
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> values;
};
AnchorMatrix SampleBatchAnchors(const std::vector<std::vector<int64_t>>& loss_masks,
                                int64_t max_anchors, uint64_t seed, uint64_t step,
                                absl::Span<const uint64_t> sample_ids);

// Samples with fewer than 2·B loss-mask tokens carry too little signal and are dropped (§4).
bool KeepSample(absl::Span<const int64_t> loss_mask, int64_t block_size);

// A 64-bit mix of its arguments (SplitMix64 steps), for seeding per-(seed, step, id) generators.
uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c);

}  // namespace flashdraft
