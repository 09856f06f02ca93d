#include "model/anchors.h"

#include <algorithm>
#include <random>

namespace flashdraft {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c) {
  return SplitMix64(SplitMix64(SplitMix64(a) ^ b) ^ c);
}

std::vector<int64_t> AnchorCandidates(absl::Span<const int64_t> loss_mask) {
  std::vector<int64_t> out;
  for (size_t i = 0; i + 1 < loss_mask.size(); ++i) {
    if (loss_mask[i] != 0 && loss_mask[i + 1] != 0) out.push_back(static_cast<int64_t>(i));
  }
  return out;
}

std::vector<int64_t> SampleAnchors(absl::Span<const int64_t> candidates, int64_t max_anchors,
                                   uint64_t seed, uint64_t step, uint64_t sample_id) {
  std::vector<int64_t> pool(candidates.begin(), candidates.end());
  const size_t k =
      std::min<size_t>(pool.size(), static_cast<size_t>(std::max<int64_t>(0, max_anchors)));
  // Partial Fisher-Yates with our own index draws: std::shuffle's output is library-specific.
  std::mt19937_64 rng(MixSeed(seed, step, sample_id));
  for (size_t i = 0; i < k; ++i) {
    const size_t j = i + static_cast<size_t>(rng() % (pool.size() - i));
    std::swap(pool[i], pool[j]);
  }
  pool.resize(k);
  std::sort(pool.begin(), pool.end());
  return pool;
}

AnchorMatrix SampleBatchAnchors(const std::vector<std::vector<int64_t>>& loss_masks,
                                int64_t max_anchors, uint64_t seed, uint64_t step,
                                absl::Span<const uint64_t> sample_ids) {
  std::vector<std::vector<int64_t>> picked;
  size_t widest = 1;
  for (size_t i = 0; i < loss_masks.size(); ++i) {
    picked.push_back(
        SampleAnchors(AnchorCandidates(loss_masks[i]), max_anchors, seed, step, sample_ids[i]));
    widest = std::max(widest, picked.back().size());
  }
  AnchorMatrix m;
  m.rows = static_cast<int64_t>(loss_masks.size());
  m.cols = static_cast<int64_t>(widest);
  m.values.assign(m.rows * m.cols, -1);
  for (size_t i = 0; i < picked.size(); ++i) {
    std::copy(picked[i].begin(), picked[i].end(), m.values.begin() + i * m.cols);
  }
  return m;
}

bool KeepSample(absl::Span<const int64_t> loss_mask, int64_t block_size) {
  int64_t n = 0;
  for (int64_t v : loss_mask) n += v != 0;
  return n >= 2 * block_size;
}

}  // namespace flashdraft
