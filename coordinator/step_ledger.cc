#include "coordinator/step_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flashdraft {

void StepLedger::Reset(uint64_t epoch, int world_size, std::vector<int64_t> shard_offsets) {
  epoch_ = epoch;
  world_size_ = world_size;
  offsets_ = std::move(shard_offsets);
  acks_.clear();
}

bool StepLedger::Add(int rank, uint64_t committed, const v1::StepAck& ack) {
  if (rank < 0 || rank >= world_size_ || ack.membership_epoch() != epoch_ ||
      ack.step() < committed) {
    return false;
  }
  acks_[ack.step()][rank] = ack;
  return true;
}

bool StepLedger::Complete(uint64_t step) const {
  auto it = acks_.find(step);
  return it != acks_.end() && static_cast<int>(it->second.size()) == world_size_;
}

absl::StatusOr<StepRecord> StepLedger::Take(uint64_t step) {
  std::map<int, v1::StepAck> acks;
  if (auto it = acks_.find(step); it != acks_.end()) {
    acks = std::move(it->second);
    acks_.erase(it);
  }
  StepRecord r;
  r.step = step;
  r.world_size = world_size_;
  r.slot_correct.assign(slots_, 0);
  r.slot_total.assign(slots_, 0);
  const int64_t num_shards = offsets_.empty() ? 0 : offsets_.back();
  std::vector<const v1::ShardResult*> results(num_shards, nullptr);
  for (const auto& [rank, ack] : acks) {
    for (const v1::ShardResult& shard : ack.shards()) {
      const int64_t k = shard.shard();
      if (k < offsets_[rank] || k >= offsets_[rank + 1] || results[k] != nullptr) {
        return absl::DataLossError(absl::StrCat(
            "worker rank ", rank, " acked shard ", k, " of step ", step, ", which is not its own (",
            offsets_[rank], "..", offsets_[rank + 1] - 1, ") or was acked twice"));
      }
      if (shard.slot_correct_size() != slots_ || shard.slot_total_size() != slots_) {
        return absl::DataLossError(absl::StrCat("worker rank ", rank, " acked shard ", k,
                                                " of step ", step, " with ",
                                                shard.slot_total_size(), " slots, not ", slots_));
      }
      results[k] = &shard;
    }
    const v1::PhaseTimings& t = ack.timings();
    r.wait_seconds += t.wait_seconds() / world_size_;
    r.forward_seconds += t.forward_seconds() / world_size_;
    r.backward_seconds += t.backward_seconds() / world_size_;
    r.allreduce_seconds += t.allreduce_seconds() / world_size_;
    r.optimizer_seconds += t.optimizer_seconds() / world_size_;
    r.max_wait_seconds = std::max(r.max_wait_seconds, t.wait_seconds());
    if (r.rank_compute_seconds.size() <= static_cast<size_t>(rank)) {
      r.rank_compute_seconds.resize(rank + 1, 0.0);
    }
    r.rank_compute_seconds[rank] =
        t.forward_seconds() + t.backward_seconds() + t.allreduce_seconds() + t.optimizer_seconds();
    r.collective_bytes += ack.collective_bytes();
  }
  for (int64_t k = 0; k < num_shards; ++k) {
    if (results[k] == nullptr) {
      return absl::DataLossError(absl::StrCat("no worker acked shard ", k, " of step ", step));
    }
    const v1::ShardResult& shard = *results[k];
    r.weighted_loss_sum += shard.weighted_loss_sum();
    r.weighted_kl_sum += shard.weighted_kl_sum();
    r.weight_sum += shard.weight_sum();
    r.tokens += static_cast<int64_t>(shard.tokens());
    for (int64_t i = 0; i < slots_; ++i) {
      r.slot_correct[i] += shard.slot_correct(static_cast<int>(i));
      r.slot_total[i] += shard.slot_total(static_cast<int>(i));
    }
  }
  r.loss = r.weight_sum > 0 ? r.weighted_loss_sum / r.weight_sum : 0.0;
  return r;
}

}  // namespace flashdraft
