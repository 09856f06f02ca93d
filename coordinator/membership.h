// Who trains (docs/ARCHITECTURE.md, "Membership"). A worker gets a token at Join, binds it to its
// Train stream (ready), becomes a member with a rank when an epoch starts (active), and leaves as
// lost (stream broken, heartbeat missed, fatal error) or drained. Any change of the active set
// starts a new epoch at the next step boundary: the survivors keep their order and get ranks
// 0..k-1, ready workers follow, up to max_workers; below min_workers the job pauses instead of
// training. Ranks are leased to live streams: a token nobody binds within bind_timeout expires, and
// a worker that comes back simply joins again.
//
// Pure logic with an injected clock (tests use a FakeClock); not thread-safe: MembershipController
// (coordinator/membership_controller.h) calls it under its lock.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"

namespace flashdraft {

struct MembershipOptions {
  int min_workers = 1;
  int max_workers = 1;
  double heartbeat_timeout_seconds = 20;
  // A token not bound to a Train stream within this long is given back.
  double bind_timeout_seconds = 60;
  // An active member whose training thread reports no progress for this long while computing
  // (heartbeats still arriving) is stuck: lost.
  double stall_timeout_seconds = 300;
};

enum class MemberState { kJoined, kReady, kActive };
const char* MemberStateName(MemberState state);

struct MemberInfo {
  std::string token;
  std::string worker_id;
  MemberState state = MemberState::kJoined;
  int rank = -1;          // in the current epoch; -1 unless active
  double since = 0;       // when it entered its state
  double last_heard = 0;  // its last message
  bool trained = false;   // was active when a step committed (holds the group's state)
  uint64_t order = 0;     // join order: ready workers take ranks in it
  // What its training thread reported last (Heartbeat): progress counter, phase, step.
  uint64_t progress = 0;
  std::string phase = "idle";
  uint64_t step = 0;
  bool busy = false;
  double progress_at = 0;       // when `progress` last changed
  std::string leave_reason;     // non-empty: leaves at the next step boundary (drain, SIGTERM)
  std::string metrics_address;  // its /metrics (host:port), as it told; empty: none
};

// A member the coordinator must drop, and why.
struct Expiry {
  std::string token;
  std::string why;
};

// A new epoch: the members by rank, and whether any of them needs the group's state (a newcomer
// next to survivors that hold it).
struct EpochPlan {
  uint64_t epoch = 0;
  std::vector<std::string> tokens;  // by rank
  bool needs_state_sync = false;
};

class Membership {
 public:
  Membership(MembershipOptions options, const Clock& clock);

  // Join: a new token, or RESOURCE_EXHAUSTED when max_workers are already members or waiting.
  absl::StatusOr<std::string> Admit(const std::string& worker_id);
  // The worker's Train stream: NOT_FOUND for an unknown, expired or departed token, ALREADY_EXISTS
  // when the token has a stream already.
  absl::Status Bind(const std::string& token);
  // Joined, ready or active: may use the store and FetchTensors.
  bool Valid(const std::string& token) const;
  void Heard(const std::string& token);
  // A heartbeat: the worker is alive, and its training thread is at `progress` in `phase`.
  void Progress(const std::string& token, uint64_t progress, const std::string& phase,
                uint64_t step, bool busy);
  // Where the worker serves /metrics. True when that changed.
  bool SetMetricsAddress(const std::string& token, const std::string& address);
  // The worker asked (or was asked) to leave: it goes at the next step boundary (see Leaving()),
  // at once when it is not active. NOT_FOUND for an unknown token.
  absl::Status RequestLeave(const std::string& token, const std::string& reason);
  // Members that asked to leave, in join order.
  std::vector<std::string> Leaving() const;
  // The token of the worker with `rank` in the current epoch, or with `worker_id`; empty if none.
  std::string TokenOfRank(int rank) const;
  std::string TokenOfWorker(const std::string& worker_id) const;
  // The worker is out (stream ended, error, drained; the caller logs why). True when it was
  // active: the epoch must change.
  bool Remove(const std::string& token);
  // Ready or active members silent for longer than the heartbeat timeout, active members whose
  // training thread made no progress while computing for longer than the stall timeout, and
  // tokens not bound within the bind timeout: the caller removes them (and closes their streams)
  // like any loss.
  std::vector<Expiry> Expired() const;
  // The earliest time at which Expired() can name someone who is a member now (infinity: nobody):
  // when the waits of the step protocol must look again.
  double NextExpiry() const;
  // Makes the next step boundary start a new epoch with the same members (a failed collective
  // that no loss explains).
  void RequestReform() { reform_requested_ = true; }
  // The current epoch committed a step: its members now hold state a newcomer must receive.
  void Committed();

  // Whether the next step boundary must start a new epoch: an active member is gone, or ready
  // workers wait while W < max_workers.
  bool Changed() const;
  // Members that would train in the next epoch (active survivors + ready, up to max_workers).
  int Available() const;
  // Starts the next epoch (call when Changed() and Available() >= min_workers).
  EpochPlan NextEpoch();

  uint64_t epoch() const { return epoch_; }
  int world_size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<std::string>& ranks() const { return ranks_; }
  // The token's rank in the current epoch, -1 when it has none.
  int RankOf(const std::string& token) const;
  const MemberInfo* Find(const std::string& token) const;
  // Current (not departed) members, and how many are in each state.
  std::vector<MemberInfo> Members() const;
  int Count(MemberState state) const;
  const MembershipOptions& options() const { return options_; }

 private:
  MembershipOptions options_;
  const Clock& clock_;
  std::map<std::string, MemberInfo> members_;  // by token; departed members are erased
  std::vector<std::string> ranks_;             // the current epoch's members by rank
  uint64_t epoch_ = 0;
  bool lost_active_ = false;  // an active member left since the epoch started
  bool reform_requested_ = false;
  uint64_t next_order_ = 0;
};

}  // namespace flashdraft
