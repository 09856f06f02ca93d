// The coordinator process (DESIGN.md §2): owns the data, the schedule, the membership and the step
// protocol; serves the flashdraft.v1.Coordinator gRPC service (callback API, one reactor per
// stream, one write in flight per stream, no blocking inside reactions).
#pragma once

#include <grpcpp/support/status.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/clock.h"
#include "common/job_config.h"
#include "common/numeric_env.h"
#include "common/safetensors.h"
#include "common/security.h"
#include "coordinator/checkpoint.h"
#include "coordinator/checkpoint_upload.h"
#include "coordinator/membership.h"
#include "coordinator/metrics.h"
#include "coordinator/numerics_group.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/scheduler.h"
#include "coordinator/sources/shard_source.h"
#include "coordinator/step_ledger.h"
#include "coordinator/step_log.h"
#include "flashdraft/v1/coordinator.pb.h"
#include "model/drafter_config.h"

namespace grpc {
class ByteBuffer;
class Server;
class Service;
}  // namespace grpc

namespace flashdraft {

class TrainSession;

// One tensor FetchTensors streams: `name` in `file`, sent as `wire_name`.
struct FetchEntry {
  std::shared_ptr<const SafetensorsModel> file;
  std::string name;
  std::string wire_name;
};

class Coordinator {
 public:
  // Opens the data (job.data.shards_dir: manifest, shards, target.safetensors) and plans the job.
  // `open_source` opens the job's data (data.source); the default opens offline shards. The
  // coordinator binary passes one that also runs a target online (coordinator/sources/
  // target_source.h), which keeps this library free of LibTorch.
  using SourceFactory = std::function<absl::StatusOr<SourceBundle>(const JobConfig&)>;
  // Writes the drafter's starting weights for the job's drafter (F32, under its parameter names)
  // and returns the file's path; workers fetch them with FetchTensors as kDrafterWeightPrefix +
  // name, so every rank starts from the same bytes. The binary's initializes them from train.seed
  // (coordinator/initial_weights.h); resuming will hand over a checkpoint's instead.
  using WeightsFactory =
      std::function<absl::StatusOr<std::string>(const JobConfig&, const DrafterModelConfig&)>;
  // Speculative decoding with a checkpoint's weights (eval.every_steps): the coordinator binary's
  // runs the target (coordinator/evaluator.h); null: the job does not evaluate.
  using Evaluator = std::function<absl::StatusOr<EvalSummary>(const std::string& checkpoint_dir)>;
  // `own_numerics`: this process's numeric environment (model/numeric_probe.h; the binary's), in
  // its log, /metrics and every checkpoint, compared with the checkpoint's on a resume.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(JobConfig job,
                                                             const WeightsFactory& initial_weights,
                                                             const SourceFactory& open_source = {},
                                                             NumericEnv own_numerics = {});
  // Before Start(): evaluates every eval.every_steps (the job must ask for it).
  void SetEvaluator(Evaluator evaluator) { evaluator_ = std::move(evaluator); }
  // data.source 'shards' (the default factory).
  static absl::StatusOr<SourceBundle> OpenShardSource(const JobConfig& job);
  ~Coordinator();

  // Starts the gRPC server on job.cluster.listen; port() is the bound port afterwards. With
  // metrics.enabled also /metrics on metrics.listen, its port in <output_dir>/metrics.port.
  absl::Status Start();
  const CoordinatorMetrics& metrics() const { return *metrics_; }
  int port() const { return port_; }

  // Waits for the workers, trains job.train.max_steps steps, sends Shutdown. Returns the job
  // result.
  absl::Status Run();
  // Ends Run() early with `reason` (signal, fatal error); safe from any thread.
  void Abort(absl::Status reason);
  // A graceful stop (SIGTERM): the step in flight commits, a checkpoint of it is written, the
  // workers are shut down and Run() returns OK; before the first epoch, Run() returns CANCELLED
  // (nothing to save). Safe from any thread.
  void RequestStop(const std::string& why);

  int64_t total_steps() const { return total_steps_; }
  const DrafterModelConfig& drafter_config() const { return drafter_config_; }

  // --- called by the gRPC reactors (never block); workers are named by their session token ---
  // Fills `reply`: admitted with a token (the rank comes with the epoch's Reform), or refused.
  void Join(const v1::JoinRequest& request, v1::JoinReply* reply);
  bool ValidToken(const std::string& token) const;
  // A Train stream opened; it must bind (send its first message) within
  // cluster.heartbeat_timeout_seconds or it is ended (DEADLINE_EXCEEDED).
  void StreamOpened(TrainSession* session);
  // Binds the token's Train stream: NOT_FOUND for an unknown or expired token, ALREADY_EXISTS when
  // it has a stream already.
  absl::Status SessionStarted(TrainSession* session, const std::string& token);
  void SessionEnded(TrainSession* session, const std::string& why);
  void OnAck(const std::string& token, const v1::StepAck& ack);
  void OnHeartbeat(const std::string& token, const v1::Heartbeat& heartbeat);
  // The worker asks to leave (SIGTERM): it goes at the next step boundary.
  void OnLeave(const std::string& token, const std::string& reason);
  // `flashdraft status --drain`: the worker named by rank or id leaves at the next step boundary.
  void Drain(const v1::DrainRequest& request, v1::DrainReply* reply);
  void OnWorkerError(const std::string& token, const std::string& error);
  void OnCollectiveFailure(const std::string& token, const v1::CollectiveFailure& failure);
  // The epoch's rank 0's checkpoint upload: the announcement, then its tensors' chunks.
  void OnCheckpointUpload(const std::string& token, const v1::CheckpointUpload& upload);
  void OnCheckpointChunk(const std::string& token, const v1::TensorChunk& chunk);
  RendezvousStore& store() { return store_; }
  // TLS credentials and the job secret every RPC must carry (security section, read at Create).
  ServerSecurity& security() { return *security_; }
  const SafetensorsModel& target() const { return *target_; }
  // Shared with gRPC slices that point into the mapped file while they are in flight.
  // What FetchTensors streams for `names` (empty: everything a worker starts from), or the error
  // naming a tensor the coordinator does not have.
  absl::StatusOr<std::vector<FetchEntry>> ResolveFetch(const std::vector<std::string>& names) const;
  void FillStatus(v1::StatusReply* reply) const;

  std::string job_yaml() const { return JobConfigToYaml(job_); }
  std::string drafter_config_json() const { return DrafterConfigToJson(drafter_config_); }

 private:
  Coordinator() = default;
  absl::Status SendStep(const StepPlan& plan);
  // The Microbatch header and tensor chunks of one shard of `plan`, for `rank`.
  absl::Status EncodeShard(const StepPlan& plan, int64_t shard, int rank, double learning_rate,
                           std::vector<grpc::ByteBuffer>* messages);
  // Waits for every rank's ack of `step`; ABORTED when the membership changed first (the step
  // is sent again in the next epoch).
  absl::Status WaitForAcks(uint64_t step);
  // Starts the next membership epoch at step `next_step` (pausing while fewer than min_workers
  // are available, up to join_timeout): new ranks, a Reform to every member.
  absl::Status StartEpoch(int64_t next_step);
  // Drops workers silent past the heartbeat (or bind) timeout, or stuck, like any loss.
  void ExpireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a lost worker: no longer a member, its stream ended with why.
  void DropSessionLocked(const std::string& token, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `token`'s Train stream if it has one, with `last` as its final message (none: null).
  void EndStreamLocked(const std::string& token, const grpc::Status& status,
                       const v1::CoordinatorMessage* last = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lets the workers that asked to leave go (a Shutdown, then their stream ends): all of them at a
  // step boundary, only those not training otherwise.
  void ReleaseLeavingLocked(bool at_step_boundary) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateWorkerMetricsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rewrites <output_dir>/prometheus/targets.json when the set of scrape targets changed: the
  // coordinator and every current member that serves /metrics.
  void UpdateScrapeTargetsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for `uploader` (the epoch's rank 0 when the commit asked) to upload the state after
  // `completed_steps` and writes the checkpoint, on a thread of its own while training goes on;
  // the checkpoint is skipped when the uploader leaves first. FinishCheckpoint waits for it.
  void StartCheckpoint(uint64_t completed_steps, const std::string& uploader);
  void FinishCheckpoint();
  // A finished job's <output_dir>/drafter, from the last step's checkpoint.
  absl::Status ExportFinalDrafter();
  absl::Status TakeCheckpoint(uint64_t completed_steps, const std::string& uploader);
  // eval.every_steps divides `completed_steps` and an evaluator is set.
  bool EvalDue(uint64_t completed_steps) const;
  // Evaluates the checkpoint just written (on the checkpoint thread): steps.jsonl and /metrics.
  void Evaluate(uint64_t completed_steps, const std::string& checkpoint_dir);
  // Resumes from the newest checkpoint (checkpoint.resume): its weights and optimizer state become
  // what FetchTensors serves, steps.jsonl keeps the records before it. False when there is none.
  absl::StatusOr<bool> Resume();
  // The workers' numeric environments are compared from now on; a resume under another
  // environment than the checkpoint's says so (log and steps.jsonl).
  void SetUpNumerics();
  // Why a Join is refused before admission (names, protocol, collectives, model shape, numerics
  // reported at all); empty: nothing against it.
  std::string CapabilityRefusal(const v1::JoinRequest& request) const;
  // The admitted worker's numerics in the log, /metrics and (queued for FlushEvents) steps.jsonl:
  // the group's when it is the first, a difference from the workers before, a mixed admission.
  void RecordAdmittedNumericsLocked(const std::string& worker, const NumericEnv& env,
                                    const NumericsDecision& decision)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the events reactions queued (Run's thread: a reaction never writes files).
  void FlushEvents();
  // `token` sent a broken checkpoint upload: it is dropped as failed, the checkpoint skipped.
  void FailUploadLocked(const std::string& token, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobConfig job_;
  DrafterModelConfig drafter_config_;
  std::unique_ptr<HiddenStateSource> source_;
  std::shared_ptr<const SafetensorsModel> target_;
  std::shared_ptr<const SafetensorsModel> initial_weights_;
  std::shared_ptr<const SafetensorsModel> optimizer_state_;  // when resumed from a checkpoint
  std::unique_ptr<CheckpointStore> checkpoints_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  Evaluator evaluator_;
  int64_t start_step_ = 0;  // the first step this run trains (> 0 when resumed)
  std::unique_ptr<Scheduler> scheduler_;
  double gamma_ = 7.0;
  // The epoch Run's thread sends in and its world size (Run's thread only; the reactors read the
  // guarded epoch_).
  uint64_t sending_epoch_ = 0;
  int world_size_ = 0;
  int reforms_at_step_ = 0;  // epochs started without a committed step in between
  int64_t total_steps_ = 0;
  int64_t warmup_steps_ = 0;
  RendezvousStore store_;
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<StepLog> step_log_;  // its own lock: Run, checkpoint and Join threads write
  NumericEnv own_numerics_;            // this process's (Create)
  RecordedNumerics resumed_numerics_;  // the checkpoint's this run resumed from (Resume)
  std::thread checkpoint_thread_;      // the checkpoint being taken (Run's thread starts/joins it)

  const Clock* clock_ = &RealClock::Get();
  std::unique_ptr<ServerSecurity> security_;
  // Train streams that have not sent their first message yet, and when they opened.
  std::map<TrainSession*, double> unbound_streams_ ABSL_GUARDED_BY(mu_);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<Membership> membership_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<NumericsGroup> numerics_ ABSL_GUARDED_BY(mu_);
  std::vector<nlohmann::json> pending_events_ ABSL_GUARDED_BY(mu_);     // for steps.jsonl, queued
  std::map<std::string, TrainSession*> sessions_ ABSL_GUARDED_BY(mu_);  // token -> Train stream
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // The acks of the steps in flight, of the current epoch only.
  std::unique_ptr<StepLedger> ledger_ ABSL_GUARDED_BY(mu_);
  // A worker of the current epoch reported a failed collective (0: none): unless a loss explains
  // it within a grace period, the epoch is re-formed with the same members.
  double collective_failed_at_ ABSL_GUARDED_BY(mu_) = 0;
  double last_arrival_ ABSL_GUARDED_BY(mu_) = 0;  // the last Join or stream bound
  // The checkpoint upload the last checkpoint commit asked for.
  std::unique_ptr<UploadReceiver> upload_ ABSL_GUARDED_BY(mu_);
  // Who left or came since the last epoch started, and why (the next membership event's
  // "changes").
  std::vector<std::pair<std::string, std::string>> changes_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::string stop_requested_ ABSL_GUARDED_BY(mu_);  // why; empty: none
  uint64_t committed_ ABSL_GUARDED_BY(mu_) = 0;
  StepRecord last_record_ ABSL_GUARDED_BY(mu_);
  double eta_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_checkpoint_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_checkpoint_dir_ ABSL_GUARDED_BY(mu_);  // verified: written or resumed from
  double last_checkpoint_at_ ABSL_GUARDED_BY(mu_) = -1;   // clock_ time; -1: the one resumed from
  // The coordinator's own /metrics (set by Start); empty: none.
  std::string metrics_address_ ABSL_GUARDED_BY(mu_);
  std::string scrape_targets_ ABSL_GUARDED_BY(mu_);     // what targets.json holds
  std::string state_ ABSL_GUARDED_BY(mu_) = "waiting";  // waiting, training, paused, done, failed
};

}  // namespace flashdraft
