// A feeder's shards (docs/ARCHITECTURE.md, "Feeders"): the work the coordinator assigned, computed
// oldest step first by the feeder's compute threads, and held until the step commits, for the
// workers that fetch them by ticket.
//
// Memory is bounded: a compute thread starts a shard only when its features fit in `max_bytes`
// beside what is held. Two exceptions keep the job moving: a shard of the oldest step the feeder
// has (the one every worker waits for: it cannot commit without it, and nothing held is freed
// before it commits), and any shard while nothing is held (one larger than the budget). So the
// feeder holds at most `max_bytes` plus the oldest step's shards; a slow worker makes it stop
// computing, never grow. A shard's features go when
// the coordinator releases its step (ReleaseWork), whether fetched or not: a worker lost after a
// fetch gets the same bytes again under a new ticket.
//
// Thread-safe; nothing blocks but NextToCompute.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "flashdraft/v1/feeder.pb.h"

namespace flashdraft {

// A shard of a step as the plan cut it: the same (step, shard) of another shard count (a group
// re-formed with another number of workers, train.virtual_shards: 0) holds other samples.
struct ShardKey {
  uint64_t step = 0;
  uint32_t shard = 0;
  uint32_t num_shards = 0;
  friend bool operator<(const ShardKey& a, const ShardKey& b) {
    if (a.step != b.step) return a.step < b.step;
    return a.shard != b.shard ? a.shard < b.shard : a.num_shards < b.num_shards;
  }
  friend bool operator==(const ShardKey& a, const ShardKey& b) {
    return a.step == b.step && a.shard == b.shard && a.num_shards == b.num_shards;
  }
};

class ShardStore {
 public:
  // What a fetch gets: the Microbatch header message, then the tensors' chunk messages.
  using Ready = std::function<void(absl::StatusOr<std::vector<grpc::ByteBuffer>>)>;

  // A shard to compute: the work as assigned first (its samples; the header may be renewed).
  struct Pending {
    ShardKey key;
    v1::ShardWork work;
  };

  struct Stats {
    uint64_t held_bytes = 0;  // computed or being computed
    uint64_t pending = 0;     // assigned, not started
    uint64_t computed = 0;    // shards computed since the start
    uint64_t waiting = 0;     // fetches waiting for a shard
  };

  explicit ShardStore(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // A shard to compute, its features `feature_bytes` long, fetched with `work.ticket`. The same
  // shard assigned again (a re-formed group) adds the ticket with its new header and reuses what
  // was computed. An error for a ticket already known, a missing header, a step already released,
  // or the same shard assigned again with other samples.
  absl::Status Assign(v1::ShardWork work, uint64_t feature_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Every shard of the steps below `committed_steps` goes, with its tickets; fetches waiting on
  // them fail (NOT_FOUND).
  void Release(uint64_t committed_steps) ABSL_LOCKS_EXCLUDED(mu_);
  // No more work: NextToCompute returns nothing, waiting fetches fail with `why`.
  void Shutdown(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  // The oldest assigned shard (by step, then shard) once it may start; blocks. Nothing after
  // Shutdown.
  std::optional<Pending> NextToCompute() ABSL_LOCKS_EXCLUDED(mu_);
  // The same without waiting: nothing when no shard is assigned or the oldest may not start.
  std::optional<Pending> TryNextToCompute() ABSL_LOCKS_EXCLUDED(mu_);
  // The chunks computed for `key` (the tensors only, not the header), or why it failed.
  void Complete(const ShardKey& key, absl::StatusOr<std::vector<grpc::ByteBuffer>> chunks)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Calls `ready` with the shard of `ticket` (header first) once it is computed, at once when it
  // is. A ticket not assigned yet is waited for (its ShardWork may still be on its way), unless
  // `step` is released: NOT_FOUND. Returns an id for CancelWait. `ready` runs on the thread that
  // settles it, outside the store's lock.
  uint64_t WhenReady(const std::string& ticket, uint64_t step, Ready ready)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets a waiting `ready`; false when it already ran or runs now.
  bool CancelWait(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class State { kQueued, kComputing, kReady, kFailed };
  struct Entry {
    State state = State::kQueued;
    v1::ShardWork work;  // the first assignment (its samples)
    uint64_t bytes = 0;  // reserved while computing, then the chunks' size
    std::vector<grpc::ByteBuffer> chunks;
    absl::Status error;
    bool released = false;  // while computing: dropped once complete
  };
  struct Ticket {
    ShardKey key;
    grpc::ByteBuffer header;  // the CoordinatorMessage with this assignment's Microbatch
  };
  struct Waiter {
    std::string ticket;
    uint64_t step = 0;  // as the fetch said (for a ticket not assigned yet)
    Ready ready;
  };
  using Fired = std::vector<std::pair<Ready, absl::StatusOr<std::vector<grpc::ByteBuffer>>>>;

  bool CanStartLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<Pending> StartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The answer for `ticket` (of `step`) if its shard is settled (computed, failed or gone);
  // nothing while it is still to come.
  std::optional<absl::StatusOr<std::vector<grpc::ByteBuffer>>> AnswerLocked(
      const std::string& ticket, uint64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the waiters whose tickets are settled now, with their answers.
  Fired TakeSettledLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(std::map<ShardKey, Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Fire(Fired fired);

  const uint64_t max_bytes_;
  mutable absl::Mutex mu_;
  std::map<ShardKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Ticket> tickets_ ABSL_GUARDED_BY(mu_);
  std::set<ShardKey> queue_ ABSL_GUARDED_BY(mu_);  // kQueued entries, oldest step first
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t computed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t released_below_ ABSL_GUARDED_BY(mu_) = 0;  // steps below are gone for good
  absl::Status shutdown_ ABSL_GUARDED_BY(mu_);        // not OK once shut down
};

}  // namespace flashdraft
