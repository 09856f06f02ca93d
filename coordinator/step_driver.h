// The step protocol as a state machine, on the coordinator's Run() thread:
//
//   [Regenerate] -> AwaitWorkers -> FormEpoch -> Stream -> AwaitAcks -> Commit -> Stream ... ->
//   Finish
//        ^                                      |            |
//        +------------- membership changed -----+------------+
//
// Regenerate (data.regenerate with feeders, once) has the feeders answer the data set's chats
// before anything is planned; AwaitWorkers waits for min_workers (pausing a running job); FormEpoch
// gives ranks and sends the Reforms; Stream keeps `prefetch_steps` steps queued at every rank;
// AwaitAcks waits for every rank's ack of the oldest step in flight (ABORTED: the group changed,
// re-form); Commit commits it to every rank, records it, starts its checkpoint when due and lets
// leaving workers go; Finish waits for the last checkpoint, exports the drafter and shuts the
// workers down. Each state is a short method that returns the next one; every wait is the
// controller's wait on the injected Clock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/clock.h"
#include "coordinator/checkpoint.h"
#include "coordinator/checkpoint_pipeline.h"
#include "coordinator/feeder_pool.h"
#include "coordinator/membership_controller.h"
#include "coordinator/metrics.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/scheduler.h"
#include "coordinator/sources/hidden_state_source.h"
#include "coordinator/status_board.h"
#include "coordinator/step_encoder.h"
#include "coordinator/step_log.h"
#include "model/dflash_math.h"

namespace flashdraft {

struct StepDriverOptions {
  int64_t start_step = 0;  // > 0 when resumed
  int64_t total_steps = 0;
  LearningRatePlan learning_rate;  // total_steps as above
  int prefetch_steps = 1;
  // Shards carry the target's final hidden state (train.loss kl / mix; the source holds it).
  bool send_teacher = false;
  int checkpoint_every_steps = 0;
  double checkpoint_every_seconds = 0;
  std::string export_dir;  // the finished job's drafter (empty: not exported)
  // checkpoint.keep_best: the best evaluated checkpoint's drafter (empty: not exported).
  std::string export_best_dir;
  // Epochs started for one step without a commit in between before the job gives up on it.
  int max_reforms_per_step = 5;
  // With feeders (parts.feeders): how many the first epoch waits for, and how long.
  int min_feeders = 0;
  double join_timeout_seconds = 600;
};

// What the driver works with; all outlive it.
struct StepDriverParts {
  MembershipController* controller;
  CheckpointPipeline* checkpoints;
  StatusBoard* board;
  const HiddenStateSource* source;
  const Scheduler* scheduler;
  StepLog* step_log;
  CoordinatorMetrics* metrics;
  RendezvousStore* store;
  const Clock* clock;
  // Null: the source computes every shard's features. Otherwise feeders do: each shard goes to a
  // feeder as ShardWork and to its rank as a ShardRef (docs/ARCHITECTURE.md, "Feeders").
  FeederPool* feeders = nullptr;
  // With feeders: the data lines they regenerate before the first plan (null: none).
  DeferredReplies* replies = nullptr;
};

class StepDriver {
 public:
  enum class State {
    kRegenerate,
    kAwaitWorkers,
    kFormEpoch,
    kStream,
    kAwaitAcks,
    kCommit,
    kFinish
  };

  StepDriver(StepDriverOptions options, StepDriverParts parts);
  // Trains from start_step to total_steps (or a graceful stop); the job's result.
  absl::Status Run();
  // After Run() returned OK: whether a graceful stop ended it before the job's last step.
  bool stopped_early() const { return !stopped_.empty(); }

 private:
  State Regenerate();
  State AwaitWorkers();
  State FormEpoch();
  State Stream();
  State AwaitAcks();
  State Commit();
  absl::Status Finish();

  absl::Status SendStep(const StepPlan& plan);
  // Shard `shard` of `plan` to rank `to.rank` through a feeder; UNAVAILABLE when none is live.
  absl::Status SendShardByFeeder(const StepPlan& plan, int64_t shard, const ShardAddress& to);
  // With feeders: waits for them (min_feeders the first time, one later); `waited` says
  // whether it had to.
  absl::Status AwaitFeeders(bool* waited);
  // The committed step's record into steps.jsonl and /metrics (and a recovery, if one ended).
  void Record(StepRecord& record);
  void Report(const StepRecord& record);
  void FlushEvents();

  const StepDriverOptions options_;
  const StepDriverParts p_;
  CheckpointCadence cadence_;
  int64_t step_;        // the oldest step not committed
  int64_t sent_;        // the next step to send
  uint64_t epoch_ = 0;  // the epoch steps are sent in
  int world_size_ = 0;
  int reforms_at_step_ = 0;            // epochs started without a commit in between
  bool feeders_started_ = false;       // min_feeders were live once: one is enough from then
  double start_ = 0;                   // when Run began
  double step_start_ = 0;              // when the step being committed began
  double changed_at_ = 0;              // when the membership changed (0: not since the last commit)
  std::optional<StepPlan> next_plan_;  // made one step early so the source can start on it
  absl::Status result_;
  std::string stopped_;  // why the job stopped before its last step (a graceful stop)
};

}  // namespace flashdraft
