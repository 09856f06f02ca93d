// The acks of the steps in flight in one membership epoch (docs/ARCHITECTURE.md, the step
// protocol): each rank's ack of a step, checked against the epoch and the committed step, and the
// step's record once every rank acked, its shard results summed in shard order so that the record
// does not depend on which rank computed what.
//
// Pure logic, not thread-safe: the coordinator calls it under its lock.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/step_log.h"
#include "flashdraft/v1/coordinator.pb.h"

namespace flashdraft {

class StepLedger {
 public:
  // `slots`: accuracy slots per shard result (block_size - 1).
  explicit StepLedger(int64_t slots) : slots_(slots) {}

  // A new epoch of `world_size` ranks whose steps are split into shards as `shard_offsets` says
  // (rank r computes [offsets[r], offsets[r+1])): every ack of an earlier epoch is dropped.
  void Reset(uint64_t epoch, int world_size, std::vector<int64_t> shard_offsets);
  // Records `rank`'s ack; false (ignored) when it is stale: another epoch, a step before
  // `committed`, or a rank outside the epoch. A second ack of a step by a rank replaces the first.
  bool Add(int rank, uint64_t committed, const v1::StepAck& ack);
  // Every rank acked `step`.
  bool Complete(uint64_t step) const;
  // The record of `step` from its acks, which are forgotten: step, world size, the shard sums and
  // the mean phase timings (step_seconds, learning_rate and the epoch are the caller's). DATA_LOSS
  // when a shard is missing, acked twice, acked by a rank that does not own it or has the wrong
  // number of slots.
  absl::StatusOr<StepRecord> Take(uint64_t step);

  uint64_t epoch() const { return epoch_; }

 private:
  int64_t slots_;
  uint64_t epoch_ = 0;
  int world_size_ = 0;
  std::vector<int64_t> offsets_;
  std::map<uint64_t, std::map<int, v1::StepAck>> acks_;  // step -> rank -> ack
};

}  // namespace flashdraft
