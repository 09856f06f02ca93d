#include "coordinator/scheduler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "common/shard_tree.h"
#include "glog/logging.h"

namespace flashdraft {

std::vector<std::vector<size_t>> PackByTokens(const std::vector<int64_t>& sizes, int bins) {
  CHECK_GT(bins, 0);
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<std::vector<size_t>> out(bins);
  std::vector<int64_t> load(bins, 0);
  for (size_t item : order) {
    const int bin = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    out[bin].push_back(item);
    load[bin] += sizes[item];
  }
  for (auto& b : out) std::sort(b.begin(), b.end());
  return out;
}

double AnchorWeightSum(const std::vector<int64_t>& loss_mask, const int64_t* anchors, int64_t count,
                       int64_t block_size, double gamma) {
  const int64_t s = static_cast<int64_t>(loss_mask.size());
  double sum = 0;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t a = anchors[j];
    if (a < 0) continue;
    for (int64_t k = 1; k < block_size && a + k < s; ++k) {
      // float, as the worker computes each weight, summed in double.
      if (loss_mask[a + k] != 0)
        sum += static_cast<float>(std::exp(-static_cast<float>(k - 1) / static_cast<float>(gamma)));
    }
  }
  return sum;
}

Scheduler::Scheduler(const HiddenStateSource& source, SchedulerOptions options)
    : source_(source), options_(options) {}

uint64_t Scheduler::steps_per_epoch() const {
  return std::max<uint64_t>(1, source_.num_samples() / options_.global_batch_size);
}

uint64_t Scheduler::SampleAt(uint64_t position, uint64_t* epoch) const {
  const uint64_t n = source_.num_samples();
  *epoch = position / n;
  absl::MutexLock lock(&mu_);
  if (cached_epoch_ != *epoch) {
    permutation_.resize(n);
    std::iota(permutation_.begin(), permutation_.end(), 0);
    std::mt19937_64 rng(MixSeed(options_.seed, *epoch, 0x0bde5));
    for (uint64_t i = n - 1; i > 0; --i) std::swap(permutation_[i], permutation_[rng() % (i + 1)]);
    cached_epoch_ = *epoch;
  }
  return permutation_[position % n];
}

void Scheduler::Truncate(Sample& sample) const {
  if (sample.length() > options_.max_seq_len) {
    sample.input_ids.resize(options_.max_seq_len);
    sample.loss_mask.resize(options_.max_seq_len);
  }
}

std::vector<int64_t> Scheduler::Anchors(const Sample& sample, uint64_t step) const {
  return SampleAnchors(AnchorCandidates(sample.loss_mask), options_.max_anchors, options_.seed,
                       step, sample.index);
}

StepPlan Scheduler::Plan(uint64_t step, int world_size) const {
  StepPlan plan;
  plan.step = step;
  std::vector<Sample> kept;
  for (int64_t i = 0; i < options_.global_batch_size; ++i) {
    uint64_t epoch;
    const uint64_t index = SampleAt(step * options_.global_batch_size + i, &epoch);
    if (i == 0) plan.epoch = epoch;
    absl::StatusOr<Sample> sample = source_.GetTokens(index);
    CHECK(sample.ok()) << sample.status();
    Truncate(*sample);
    if (!KeepSample(sample->loss_mask, options_.block_size)) continue;
    kept.push_back(std::move(*sample));
  }
  std::vector<int64_t> lengths;
  for (const Sample& s : kept) lengths.push_back(s.length());
  const int64_t num_shards = this->num_shards(world_size);
  CHECK_GE(num_shards, world_size) << "fewer virtual shards than workers";
  plan.shards.resize(num_shards);
  plan.shard_offsets = ShardOffsets(num_shards, world_size);
  const auto bins = PackByTokens(lengths, static_cast<int>(num_shards));
  // Σw in shard order, each shard's in sample order: the same double whatever W is.
  for (int64_t k = 0; k < num_shards; ++k) {
    MicrobatchPlan& mb = plan.shards[k];
    for (size_t item : bins[k]) {
      const Sample& s = kept[item];
      mb.samples.push_back(s.index);
      mb.lengths.push_back(s.length());
      mb.tokens += s.length();
      const std::vector<int64_t> anchors = Anchors(s, step);
      mb.weight_sum +=
          AnchorWeightSum(s.loss_mask, anchors.data(), static_cast<int64_t>(anchors.size()),
                          options_.block_size, options_.gamma);
    }
    plan.global_weight_sum += mb.weight_sum;
    plan.tokens += mb.tokens;
  }
  return plan;
}

}  // namespace flashdraft
