// The coordinator process (docs/ARCHITECTURE.md): owns the data, the schedule, the membership and
// the step protocol, and serves flashdraft.v1.Coordinator. This class is the composition root: it
// opens the job's data and checkpoints, wires the parts below and runs the step driver.
//
//   service.h              gRPC reactors: parse, authenticate, hand over (never block)
//   stream_registry.h      the Train streams by token (WorkerChannels)
//   membership_controller  reactions to workers; the waits of the step protocol (its own lock)
//   admission.h            whether a JoinRequest may join (pure)
//   tensor_catalog.h       what FetchTensors serves; where a resumed job continues
//   step_encoder.h         a step's shards as messages (pure)
//   checkpoint_pipeline.h  uploads, the checkpoint writer thread, evaluations, the export
//   status_board.h         the job's state for `flashdraft status`
//   step_driver.h          the step protocol's state machine (Run's thread)
//   feeder_pool.h          target feeders: admission, Feed streams, shard assignment (its lock)
//   feeder_control.h       the FeederControl service in front of the pool
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/job_config.h"
#include "common/numeric_env.h"
#include "common/security.h"
#include "coordinator/checkpoint.h"
#include "coordinator/checkpoint_pipeline.h"
#include "coordinator/feeder_pool.h"
#include "coordinator/membership_controller.h"
#include "coordinator/metrics.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/scheduler.h"
#include "coordinator/sources/hidden_state_source.h"
#include "coordinator/status_board.h"
#include "coordinator/step_driver.h"
#include "coordinator/step_log.h"
#include "coordinator/stream_registry.h"
#include "coordinator/tensor_catalog.h"
#include "model/drafter_config.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace flashdraft {

struct CoordinatorOptions {
  JobConfig job;
  // Writes the drafter's starting weights for the job's drafter (F32, under its parameter names)
  // and returns the file's path; workers fetch them as kDrafterWeightPrefix + name, so every rank
  // starts from the same bytes (coordinator/initial_weights.h). Not called when resuming.
  std::function<absl::StatusOr<std::string>(const JobConfig&, const DrafterModelConfig&)>
      initial_weights;
  // Opens the job's data (data.source); empty: offline shards only (OpenShardBundle). The binary
  // passes one that also runs a target online (sources/target_source.h), which keeps this library
  // free of LibTorch.
  std::function<absl::StatusOr<SourceBundle>(const JobConfig&)> open_source;
  // This process's numeric environment (model/numeric_probe.h): in its log, /metrics and every
  // checkpoint, compared with the checkpoint's on a resume.
  NumericEnv own_numerics;
  // Every timeout and wait of the job.
  const Clock* clock = &RealClock::Get();
};

class Coordinator {
 public:
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options);
  ~Coordinator();

  // Before Start(): evaluates every eval.every_steps (the job must ask for it).
  void SetEvaluator(CheckpointPipeline::Evaluator evaluator);
  // Starts the gRPC server on job.cluster.listen; port() is the bound port afterwards. With
  // metrics.enabled also /metrics on metrics.listen, its port in <output_dir>/metrics.port.
  absl::Status Start();
  int port() const { return port_; }
  const CoordinatorMetrics& metrics() const { return *metrics_; }
  int64_t total_steps() const { return total_steps_; }

  // Waits for the workers, trains job.train.max_steps steps, sends Shutdown; the job's result.
  absl::Status Run();
  // Ends Run() early with `reason` (signal, fatal error); safe from any thread.
  void Abort(absl::Status reason);
  // A graceful stop (SIGTERM): the step in flight commits, a checkpoint of it is written, the
  // workers are shut down and Run() returns OK; before the first epoch, Run() returns CANCELLED.
  void RequestStop(const std::string& why);
  // After Run() returned OK: whether RequestStop() ended it before the job's last step.
  bool stopped_early() const;

 private:
  Coordinator() = default;
  absl::Status OpenData(const CoordinatorOptions& options);
  absl::Status OpenCheckpoints(const CoordinatorOptions& options);
  // The numerics group (a resumed job's, compared with this process's) and the parts.
  std::unique_ptr<NumericsGroup> SetUpNumerics();
  absl::Status WireParts();
  // The feeder pool of a job with cluster.min_feeders > 0.
  absl::Status SetUpFeeders();
  void FillStatus(v1::StatusReply* reply) const;

  JobConfig job_;
  DrafterModelConfig drafter_config_;
  NumericEnv own_numerics_;
  const Clock* clock_ = nullptr;
  int64_t total_steps_ = 0;
  int64_t start_step_ = 0;  // > 0 when resumed
  std::optional<ResumePoint> resumed_;
  std::unique_ptr<HiddenStateSource> source_;
  DeferredReplies* deferred_replies_ = nullptr;  // into source_: what feeders regenerate
  std::unique_ptr<Scheduler> scheduler_;
  std::shared_ptr<const SafetensorsModel> target_;
  std::unique_ptr<TensorCatalog> catalog_;
  std::vector<TensorSpec> upload_specs_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<CheckpointStore> checkpoints_;
  std::unique_ptr<StepLog> step_log_;
  std::unique_ptr<ServerSecurity> security_;
  RendezvousStore store_;
  std::unique_ptr<StreamRegistry> streams_;
  StatusBoard board_;
  std::unique_ptr<CheckpointPipeline> pipeline_;
  std::unique_ptr<MembershipController> controller_;
  std::unique_ptr<FeederPool> feeders_;  // cluster.min_feeders > 0 only
  std::unique_ptr<StepDriver> driver_;
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Service> feeder_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace flashdraft
