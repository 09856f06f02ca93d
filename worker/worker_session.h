// One session of a worker with one coordinator process, after Join and FetchTensors: the Train
// stream's protocol (docs/ARCHITECTURE.md). Three threads: a reader (SessionInbox) turning the
// stream into whole microbatches, commits, re-forms and the shutdown; a heartbeat thread
// (SessionMonitor); and the training thread that runs Run(): for each membership epoch it forms the
// epoch's collective, then for each step computes its shards, reduces the gradients, acks, and
// applies the step only when the commit comes. The epoch's rank 0 uploads checkpoints from a side
// thread.
//
// It talks through a CoordinatorLink, keeps time with a Clock and forms its groups through a
// CollectiveFactory, so tests run it against a fake link (and a real single-process collective, or
// one of their own) without a network.
#pragma once

#include <torch/torch.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/job_config.h"
#include "flashdraft/v1/coordinator.pb.h"
#include "model/drafter.h"
#include "model/trainer.h"
#include "worker/checkpoint_uploader.h"
#include "worker/collective/collective_factory.h"
#include "worker/coordinator_link.h"
#include "worker/fault.h"
#include "worker/gradient_reducer.h"
#include "worker/leave_request.h"
#include "worker/session_inbox.h"
#include "worker/session_monitor.h"
#include "worker/worker_metrics.h"

namespace flashdraft {

struct SessionSetup {
  std::string worker_id;
  std::string session_token;
  JobConfig job;
  DrafterModelConfig drafter_config;
  // What FetchTensors brought: the frozen target tensors, the starting weights and, when resuming,
  // the optimizer state (moved into the model; emptied).
  std::map<std::string, torch::Tensor> fetched;
  // The rendezvous store; each epoch's group forms under the prefix its Reform names.
  c10::intrusive_ptr<c10d::Store> store;
  // Where collective traffic binds when cluster.collective_interface names no interface (the
  // worker passes the address it reaches the coordinator from); empty: loopback.
  std::string collective_address;
  // worker.device: cuda — this worker's GPU (an ordinal among the visible ones), which also
  // carries its NCCL communicator with cluster.backend: nccl.
  int cuda_device = 0;
  FaultPlan fault;
  // Where Prometheus scrapes this worker (host:port; empty: it serves no metrics): told to the
  // coordinator when the Train stream opens, for <output_dir>/prometheus/targets.json.
  std::string metrics_address;
};

struct SessionHooks {
  const Clock* clock = &RealClock::Get();
  // Set by SIGTERM: leave at the next step boundary. Null: never.
  const LeaveRequest* leave = nullptr;
  // Forms each membership epoch's group. Unset: the job's (cluster.backend, with the timeout,
  // interface or address and GPU of the setup; MakeCollectiveFactory).
  CollectiveFactory collective_factory;
  // The training thread is stuck and the coordinator is gone. Default: log and _exit(3), so that a
  // supervisor starts the worker again.
  std::function<void()> on_stuck;
  // The process's metrics (null: none); the session records into them.
  WorkerMetrics* metrics = nullptr;
  // Fetches the shards the coordinator sends as ShardRefs (target feeders); null: such a shard is
  // lost (reported as a failed step).
  ShardFetcher* shard_fetcher = nullptr;
};

// The optimizer settings of the job's train section.
OptimizerOptions OptimizerOptionsOf(const JobConfig& job);

class WorkerSession {
 public:
  // Builds the drafter and its optimizer from `setup.fetched`; errors name what the coordinator
  // sent wrong.
  static absl::StatusOr<std::unique_ptr<WorkerSession>> Create(SessionSetup setup,
                                                               SessionHooks hooks = {});
  ~WorkerSession();

  // Trains until a Shutdown (OK; the coordinator exports a finished job's drafter, workers write
  // nothing of the job's), the end of the stream (UNAVAILABLE: join again) or a fatal error (told
  // to the coordinator, returned), over the just-opened Train stream `link`, which it ends. Once.
  absl::Status Run(CoordinatorLink& link);
  // After Run() returned OK: whether the coordinator's Shutdown said the job trained all its steps
  // (not stopped early, nor this worker let go).
  bool job_finished() const { return job_finished_; }

  // The model, for tests (not while Run runs).
  DrafterImpl& drafter() { return *drafter_; }
  torch::optim::AdamW& optimizer() { return trainer_.optimizer(); }

 private:
  WorkerSession(SessionSetup setup, SessionHooks hooks);

  // Sends a message with this worker's id and token; false once the stream is gone. Any thread.
  bool Write(v1::WorkerMessage& message);
  // The next item: one put aside while waiting for a commit, else the inbox's.
  InboxItem Next();
  void End(absl::Status status);
  // A Shutdown or the end of the stream ends the session (true).
  bool EndsSession(const InboxItem& item);
  // The end of the job, or of this worker's part in it: logged; the session ends OK.
  void Shutdown(const InboxItem& item);

  // Membership: joins the group of a new epoch, leaving the old one (its uncommitted gradients
  // are dropped). OK, ABORTED (a newer epoch came meanwhile), UNAVAILABLE (the group could not
  // form) or a fatal error.
  absl::Status JoinGroup(const v1::Reform& reform);
  void HandleReform(const v1::Reform& reform);
  void LeaveGroup();
  void ReportCollectiveFailure(uint64_t step, const absl::Status& why);
  bool Superseded() const { return inbox_.newest_epoch() > epoch_; }

  // One step of this rank while it is computed: what it was told and what it acks.
  struct StepWork {
    v1::Microbatch first;          // the step's first microbatch's header
    std::vector<int64_t> offsets;  // this rank computes shards [offsets[rank], offsets[rank+1])
    v1::StepAck ack;
    double wait = 0, forward = 0, backward = 0, allreduce = 0;  // seconds
  };

  // A step whose first microbatch is `first` (already waited `wait` seconds for): this rank's
  // shards, the reduction, the ack, then the commit.
  void TrainStep(InboxItem first, double wait);
  // The step's shard layout checked, the reducer told; an error ends the session.
  absl::Status BeginStep(const v1::Microbatch& first, StepWork& work);
  // The step's next microbatch into `item`. False: something else came first (the step is dropped
  // and what came is handled next).
  bool NextShard(StepWork& work, InboxItem& item);
  // Forward and backward of `shard` (its gradients into the reducer's buckets), its numbers into
  // the ack. An error (a microbatch of another shard, a tensor missing) ends the session.
  absl::Status ComputeShard(const InboxItem& item, int64_t shard, StepWork& work);
  // The gradient exchange. False: the step is dropped (a newer epoch, or the collective failed).
  bool ReduceGradients(StepWork& work);
  // The phase times into the ack and the metrics.
  void RecordStep(StepWork& work);
  // Sends the ack; false when the stream is gone (the session has ended then).
  bool SendAck(StepWork& work);
  void AwaitCommit(const v1::Microbatch& step);

  void Heartbeats();

  SessionSetup setup_;
  CoordinatorLink* link_ = nullptr;  // Run's
  const Clock& clock_;
  SessionHooks hooks_;
  Drafter drafter_;
  DrafterTrainer trainer_;
  torch::Device device_{torch::kCPU};  // worker.device
  std::vector<torch::Tensor> params_;
  GradientReducerOptions reduction_;
  int64_t virtual_shards_ = 0;
  double gamma_ = 7.0;
  // train.loss's weight of cross-entropy: 1 is cross-entropy only, below it distils.
  double ce_weight_ = 1.0;

  SessionInbox inbox_;
  SessionProgress progress_;
  std::thread reader_, heartbeat_;
  absl::Notification stop_heartbeats_;

  // The training thread's own.
  uint64_t epoch_ = 0;  // 0: not a member yet
  int rank_ = -1, world_ = 0;
  bool broken_ = false;  // this epoch's collective failed: its steps are dropped until a Reform
  std::unique_ptr<Collective> collective_;
  std::unique_ptr<GradientReducer> reducer_;
  std::deque<InboxItem> deferred_;  // items that arrived while a step waited for its commit
  std::optional<absl::Status> end_;
  bool job_finished_ = false;  // the Shutdown's
  double last_optimizer_seconds_ = 0;
  uint64_t last_step_ = 0;
  // Rank 0's checkpoint uploads (last: its thread writes through this session's link).
  CheckpointUploader uploader_;
};

}  // namespace flashdraft
