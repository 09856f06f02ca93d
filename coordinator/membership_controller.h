// The coordinator's reactions to its workers, and the waits of the step protocol on them. Every
// event a Train stream, Join, Drain or a signal brings lands here (Join, Bind, OnAck, OnHeartbeat,
// OnLeave, Drain, Lost, OnCollectiveFailure, uploads, RequestStop, Abort); the step driver
// (coordinator/step_driver.h) waits here for workers and acks, forms epochs and commits steps.
//
// One absl::Mutex guards the membership, the numerics group, the ledger of acks and the job's
// failure. No reaction blocks under it: messages are queued on WorkerChannels, Prometheus's
// targets.json is posted to a LatestFileWriter, steps.jsonl events are queued for the driver
// (TakeEvents), checkpoint chunks are checked and copied under the upload sink's own lock.
// Lock order: this controller, then the upload sink, WorkerChannels, a stream's write lock, the
// status board. The waits use one wait-for-change-or-deadline on the injected Clock; deadlines
// (heartbeats, binds, joins, collective grace) come from the clock, never from polling.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/numeric_env.h"
#include "coordinator/latest_file_writer.h"
#include "coordinator/membership.h"
#include "coordinator/metrics.h"
#include "coordinator/numerics_group.h"
#include "coordinator/scrape_targets.h"
#include "coordinator/step_ledger.h"
#include "coordinator/worker_channels.h"
#include "flashdraft/v1/coordinator.pb.h"
#include "model/drafter_config.h"

namespace flashdraft {

// Where a commit's checkpoint upload goes (CheckpointPipeline). Called without the controller's
// lock except WorkerGone and Expect, which must not call back.
class UploadSink {
 public:
  virtual ~UploadSink() = default;
  // The commit of `completed_steps - 1` asks `token` for the state after it.
  virtual void Expect(const std::string& token, uint64_t completed_steps) = 0;
  // FAILED_PRECONDITION: stale, ignored; another error: the worker is broken.
  virtual absl::Status Begin(const std::string& token, const v1::CheckpointUpload& upload) = 0;
  virtual absl::Status Add(const std::string& token, const v1::TensorChunk& chunk) = 0;
  // `token` is out of the job.
  virtual void WorkerGone(const std::string& token) = 0;
};

struct ControllerOptions {
  MembershipOptions membership;
  double join_timeout_seconds = 60;  // how long an epoch waits for min_workers
  std::string backend = "gloo";      // cluster.backend
  bool on_gpu = false;               // worker.device cuda
  int64_t block_size = 16;
  DrafterModelConfig drafter;
  std::string job_name;
  std::string job_config_yaml;      // JoinReply
  std::string drafter_config_json;  // JoinReply
  // A reported collective failure waits this long for a loss to explain it before the epoch is
  // re-formed with the same members.
  double collective_failure_grace_seconds = 2.0;
  // The first epoch starts this long after the last arrival when fewer than max_workers are there.
  double start_settle_seconds = 2.0;
};

// A new membership epoch, as the driver logs it.
struct EpochStart {
  uint64_t epoch = 0;
  int world_size = 0;
  std::vector<std::string> worker_ids;  // by rank
  nlohmann::json changes;               // who left or came since the last epoch, and why
  bool needs_state_sync = false;
};

// A committed step: its record from the acks, and who uploads its checkpoint (empty: none).
struct CommittedStep {
  absl::StatusOr<StepRecord> record;
  std::string uploader;
};

class MembershipController {
 public:
  MembershipController(ControllerOptions options, std::unique_ptr<NumericsGroup> numerics,
                       WorkerChannels& channels, UploadSink& uploads, CoordinatorMetrics& metrics,
                       const Clock& clock);

  // --- reactions (gRPC threads, signal thread); never block ---
  void Join(const v1::JoinRequest& request, v1::JoinReply* reply);
  bool Valid(const std::string& token) const;
  // A Train stream opened: its bind deadline counts from now.
  void StreamOpened();
  // Binds `token`'s stream, `attach` registering it (under this lock, so a Reform cannot miss
  // it): NOT_FOUND for an unknown or expired token, ALREADY_EXISTS when it has a stream.
  absl::Status Bind(const std::string& token, absl::FunctionRef<void()> attach);
  // The worker is out: its stream ended or broke, or it failed (`why` says which).
  void Lost(const std::string& token, const std::string& why);
  void OnAck(const std::string& token, const v1::StepAck& ack);
  void OnHeartbeat(const std::string& token, const v1::Heartbeat& heartbeat);
  void OnLeave(const std::string& token, const std::string& reason);
  void Drain(const v1::DrainRequest& request, v1::DrainReply* reply);
  void OnCollectiveFailure(const std::string& token, const v1::CollectiveFailure& failure);
  void OnCheckpointUpload(const std::string& token, const v1::CheckpointUpload& upload);
  void OnCheckpointChunk(const std::string& token, const v1::TensorChunk& chunk);
  // A graceful stop: the step in flight commits with a checkpoint; before the first epoch the
  // job fails as CANCELLED.
  void RequestStop(const std::string& why);
  // The next step boundary starts a new epoch with the same members, and the steps in flight are
  // sent again (a feeder holding their shards was lost: `why`).
  void RequestReform(const std::string& why);
  // The job fails with `reason` (the first reason wins); every wait ends.
  void Abort(absl::Status reason);
  // The coordinator serves /metrics at `address`: targets.json lists it and every worker that
  // serves its own, written by `writer`.
  void PublishScrapeTargets(std::string address, std::unique_ptr<LatestFileWriter> writer);
  // Further processes that serve /metrics (the feeders), asked each time the file is written.
  // `more` runs under this controller's lock: it must not call back into it.
  void AddScrapeTargets(std::function<std::vector<ScrapeTarget>()> more);
  // Writes the file again if its content changed (a feeder's /metrics came or went).
  void RefreshScrapeTargets() ABSL_LOCKS_EXCLUDED(mu_);
  // Membership epoch, world size and one row per worker (its last step's compute seconds from
  // `rank_compute_seconds`).
  void FillWorkers(const std::vector<double>& rank_compute_seconds, v1::StatusReply* reply) const;
  absl::Status failure() const;
  std::string stop_requested() const;

  // --- the step driver's thread ---
  // Waits until an epoch can start: min_workers available (the first epoch also waits for the
  // workers on their way, up to max_workers). `paused` is called while a later epoch waits.
  // The job's failure: join timeout, a stop while paused, Abort.
  absl::Status AwaitWorkers(absl::FunctionRef<void()> paused);
  // Starts the next epoch at `next_step` and sends every member its Reform; `shard_offsets`
  // lays a step's shards over a world size.
  EpochStart FormEpoch(int64_t next_step,
                       const std::function<std::vector<int64_t>(int world_size)>& shard_offsets);
  // Whether the next step boundary starts a new epoch.
  bool Changed() const;
  // Queues `messages` on the stream of the current epoch's `rank`; the bytes queued (0: the rank
  // is gone; the step is sent again in the next epoch).
  uint64_t SendToRank(int rank, std::vector<grpc::ByteBuffer> messages);
  // Every rank acked `step`: OK. ABORTED: the membership changed or a collective failed first (the
  // next epoch sends it again). The job's failure otherwise.
  absl::Status AwaitAcks(uint64_t step);
  // Commits `step` to every member (asking rank 0 for the state after it when `checkpoint`).
  CommittedStep Commit(uint64_t step, bool checkpoint);
  // Lets the workers that asked to leave go (at a step boundary: also the active ones).
  bool AnyLeaving() const;
  void ReleaseLeaving();
  // steps.jsonl events the reactions queued (admissions' numerics), in order.
  std::vector<nlohmann::json> TakeEvents();
  // The workers' numerics for a checkpoint.json (RecordNumerics).
  std::string NumericsRecord(const NumericEnv& coordinator, const std::string& precision,
                             int intra_op_threads) const;
  // The job is over: every stream gets `shutdown` and ends; losses are no longer failures.
  void Finish(const grpc::ByteBuffer& shutdown);

 private:
  struct Wake;
  // Waits for any event or `deadline` (or the next expiry), then expires who is due.
  void WaitForChangeLocked(double deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops workers (and closes streams) past their deadlines; returns the next deadline.
  double ExpireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropLocked(const std::string& token, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLeavingLocked(bool at_step_boundary) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether an epoch can start now, and when that may change by time alone (the settle delay).
  bool ReadyForEpochLocked(double* settle_deadline) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendReformsLocked(const EpochPlan& plan, int64_t next_step, EpochStart* start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string JoinRefusalLocked(const v1::JoinRequest& request, const NumericEnv& env,
                                v1::JoinReply* reply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordAdmittedNumericsLocked(const std::string& worker, const NumericEnv& env,
                                    const NumericsDecision& decision)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateWorkerMetricsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PostScrapeTargetsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Heard(const std::string& token);
  // Something a wait may be waiting for happened.
  void NotifyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++version_; }

  const ControllerOptions options_;
  WorkerChannels& channels_;
  UploadSink& uploads_;
  CoordinatorMetrics& metrics_;
  const Clock& clock_;

  mutable absl::Mutex mu_;
  Membership membership_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<NumericsGroup> numerics_ ABSL_GUARDED_BY(mu_);
  StepLedger ledger_ ABSL_GUARDED_BY(mu_);
  uint64_t committed_ ABSL_GUARDED_BY(mu_) = 0;  // steps committed
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;    // counts events (NotifyLocked)
  // A member of the current epoch reported a failed collective (0: none).
  double collective_failed_at_ ABSL_GUARDED_BY(mu_) = 0;
  double last_arrival_ ABSL_GUARDED_BY(mu_) = 0;    // the last Join or bind
  double unbound_expiry_ ABSL_GUARDED_BY(mu_) = 0;  // when the oldest unbound stream expires
  // Who left or came since the last epoch started, and why (its "changes").
  std::vector<std::pair<std::string, std::string>> changes_ ABSL_GUARDED_BY(mu_);
  std::vector<nlohmann::json> events_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::string stop_requested_ ABSL_GUARDED_BY(mu_);  // why; empty: none
  bool over_ ABSL_GUARDED_BY(mu_) = false;           // Finish() was called
  std::string metrics_address_ ABSL_GUARDED_BY(mu_);
  std::string scrape_targets_ ABSL_GUARDED_BY(mu_);  // what was last posted
  std::unique_ptr<LatestFileWriter> scrape_writer_ ABSL_GUARDED_BY(mu_);
  std::function<std::vector<ScrapeTarget>()> more_scrape_targets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashdraft
