#include "coordinator/coordinator.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/target_fingerprint.h"
#include "coordinator/feeder_control.h"
#include "coordinator/latest_file_writer.h"
#include "coordinator/server.h"
#include "coordinator/service.h"
#include "coordinator/sources/shard_source.h"
#include "glog/logging.h"
#include "model/dflash_math.h"

namespace flashdraft {
namespace {

// The source's rows: the drafter's n·H features, then the teacher's H when train.loss needs it (a
// source may hold a teacher the loss does not use: it stays off the wire).
absl::Status CheckFeatureWidths(const JobConfig& j, const SourceBundle& bundle,
                                const DrafterModelConfig& dc) {
  const HiddenStateSource& source = *bundle.source;
  const int64_t layers = source.feature_size() - source.teacher_size();
  if (layers != dc.feature_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(bundle.label, " hold features of width ", layers,
                     " but the drafter expects n·H = ", dc.feature_size()));
  }
  if (source.teacher_size() != 0 && source.teacher_size() != dc.hidden_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(bundle.label, " hold a teacher feature of width ", source.teacher_size(),
                     " but the target's hidden size is ", dc.hidden_size));
  }
  if (LossNeedsTeacher(j.train) && source.teacher_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.loss: ", j.train.loss, " needs the target's final hidden state, and ", bundle.label,
        " hold none: prepare the shards with `flashdraft prepare --teacher`, or use data.source: "
        "target"));
  }
  return absl::OkStatus();
}

// The job's drafter: the target's shape (from the data) with the job's drafter settings.
absl::StatusOr<DrafterModelConfig> JobDrafter(const JobConfig& j, const SourceBundle& bundle) {
  FD_ASSIGN_OR_RETURN(DrafterModelConfig dc,
                      ParseDrafterConfig(bundle.drafter_config_json, bundle.drafter_config_label));
  dc.num_hidden_layers = j.drafter.num_hidden_layers;
  dc.block_size = j.drafter.block_size;
  if (j.drafter.intermediate_size > 0) dc.intermediate_size = j.drafter.intermediate_size;
  if (j.drafter.mask_token_id >= 0) dc.mask_token_id = j.drafter.mask_token_id;
  // A validated job has a window exactly when some layer slides; otherwise all layers are full.
  dc.sliding_window = j.drafter.sliding_window;
  dc.layer_types = dc.sliding_window > 0 ? j.drafter.layer_types : std::vector<std::string>{};
  FD_RETURN_IF_ERROR(CheckFeatureWidths(j, bundle, dc));
  return dc;
}

SchedulerOptions JobSchedule(const JobConfig& j) {
  SchedulerOptions so;
  so.seed = j.train.seed;
  so.global_batch_size = j.train.global_batch_size;
  so.block_size = j.drafter.block_size;
  so.max_anchors = j.drafter.max_anchors;
  so.gamma = EffectiveLossDecayGamma(j);
  so.max_seq_len = j.data.max_seq_len;
  so.virtual_shards = EffectiveVirtualShards(j);
  return so;
}

LearningRatePlan JobLearningRatePlan(const TrainConfig& t, int64_t total_steps) {
  LearningRatePlan plan;
  const bool known = ParseLrSchedule(t.lr_schedule, &plan.schedule);
  CHECK(known) << "train.lr_schedule " << t.lr_schedule << " passed validation";
  plan.learning_rate = t.learning_rate;
  plan.warmup_steps = static_cast<int64_t>(std::llround(t.warmup_ratio * total_steps));
  plan.total_steps = total_steps;
  plan.decay_steps = static_cast<int64_t>(std::llround(t.decay_ratio * total_steps));
  plan.min_lr_ratio = t.min_lr_ratio;
  return plan;
}

ControllerOptions JobMembership(const JobConfig& j, const DrafterModelConfig& drafter) {
  ControllerOptions o;
  o.membership.min_workers = j.cluster.min_workers;
  o.membership.max_workers = j.cluster.max_workers;
  o.membership.heartbeat_timeout_seconds = j.cluster.heartbeat_timeout_seconds;
  o.membership.bind_timeout_seconds = j.cluster.join_timeout_seconds;
  o.membership.stall_timeout_seconds = j.cluster.stall_timeout_seconds;
  o.join_timeout_seconds = j.cluster.join_timeout_seconds;
  o.backend = j.cluster.backend;
  o.on_gpu = j.worker.device == "cuda";
  o.block_size = j.drafter.block_size;
  o.drafter = drafter;
  o.job_name = j.name;
  o.job_config_yaml = JobConfigToYaml(j);
  o.drafter_config_json = DrafterConfigToJson(drafter);
  return o;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options) {
  if (!options.initial_weights) {
    return absl::InvalidArgumentError("Coordinator::Create needs a drafter weight initializer");
  }
  std::unique_ptr<Coordinator> c(new Coordinator());
  c->job_ = options.job;
  c->own_numerics_ = options.own_numerics;
  c->clock_ = options.clock;
  FD_ASSIGN_OR_RETURN(c->security_, ServerSecurity::Create(c->job_.security, *c->clock_));
  FD_RETURN_IF_ERROR(c->OpenData(options));
  FD_RETURN_IF_ERROR(c->OpenCheckpoints(options));
  FD_RETURN_IF_ERROR(c->WireParts());
  return c;
}

absl::Status Coordinator::OpenData(const CoordinatorOptions& options) {
  const JobConfig& j = job_;
  FD_ASSIGN_OR_RETURN(SourceBundle bundle,
                      options.open_source ? options.open_source(j) : OpenShardBundle(j));
  FD_ASSIGN_OR_RETURN(drafter_config_, JobDrafter(j, bundle));
  deferred_replies_ = bundle.deferred_replies;
  source_ = std::move(bundle.source);
  FD_ASSIGN_OR_RETURN(target_, SafetensorsModel::Open(bundle.target_tensors_path));
  const std::vector<int64_t> table = {drafter_config_.vocab_size, drafter_config_.hidden_size};
  FD_RETURN_IF_ERROR(target_->GetChecked("embed_tokens.weight", DType::kF32, table).status());
  scheduler_ = std::make_unique<Scheduler>(*source_, JobSchedule(j));
  total_steps_ = j.train.max_steps > 0
                     ? j.train.max_steps
                     : static_cast<int64_t>(scheduler_->steps_per_epoch()) * j.train.epochs;
  std::error_code ec;
  std::filesystem::create_directories(j.output_dir, ec);
  metrics_ = std::make_unique<CoordinatorMetrics>(j.cluster.backend, total_steps_,
                                                  j.drafter.block_size, security_->description(),
                                                  NumericEnvLabels(own_numerics_));
  return absl::OkStatus();
}

absl::Status Coordinator::OpenCheckpoints(const CoordinatorOptions& options) {
  const JobConfig& j = job_;
  checkpoints_ = std::make_unique<CheckpointStore>(
      j.checkpoint.dir.empty() ? j.output_dir + "/checkpoints" : j.checkpoint.dir,
      j.checkpoint.keep_last, JobFingerprint(j), DrafterConfigToJson(drafter_config_));
  std::shared_ptr<const SafetensorsModel> weights, optimizer;
  if (j.checkpoint.resume) {
    FD_ASSIGN_OR_RETURN(resumed_, FindResumePoint(*checkpoints_, JobFingerprint(j), total_steps_));
  } else if (const std::vector<std::string> old = checkpoints_->Existing(); !old.empty()) {
    // A fresh run would prune the earlier run's checkpoints and a later --resume could mix them.
    return absl::FailedPreconditionError(absl::StrCat(
        checkpoints_->root(), " holds checkpoints of an earlier run (", old.back(),
        "): continue it with --resume (checkpoint.resume: true), or give this run another "
        "output_dir or checkpoint.dir"));
  }
  if (resumed_) {
    const CheckpointInfo& at = resumed_->checkpoint;
    FD_ASSIGN_OR_RETURN(weights, SafetensorsModel::Open(at.model_path));
    FD_ASSIGN_OR_RETURN(optimizer, SafetensorsModel::Open(at.optimizer_path));
    start_step_ = static_cast<int64_t>(at.completed_steps);  // steps.jsonl keeps those before
    LOG(INFO) << "resuming from " << at.dir << ": step " << start_step_ << " of " << total_steps_;
  } else {
    FD_ASSIGN_OR_RETURN(const std::string path, options.initial_weights(j, drafter_config_));
    FD_ASSIGN_OR_RETURN(weights, SafetensorsModel::Open(path));
  }
  // An upload holds the parameters, two AdamW moments per parameter and the step, with the
  // weights' dtypes and shapes: anything else is refused before it is allocated.
  std::vector<TensorSpec> parameters;
  for (const std::string& name : weights->names()) {
    FD_ASSIGN_OR_RETURN(const TensorView view, weights->Get(name));
    parameters.push_back({name, view.dtype, view.shape});
  }
  upload_specs_ = CheckpointUploadSpecs(parameters);
  catalog_ = std::make_unique<TensorCatalog>(target_, std::move(weights), std::move(optimizer));
  FD_ASSIGN_OR_RETURN(StepLog log, StepLog::Open(j.output_dir + "/steps.jsonl", start_step_));
  step_log_ = std::make_unique<StepLog>(std::move(log));
  return absl::OkStatus();
}

std::unique_ptr<NumericsGroup> Coordinator::SetUpNumerics() {
  LOG(INFO) << "numerics: " << DescribeNumericEnv(own_numerics_);
  const flashdraft::RecordedNumerics recorded = resumed_ ? resumed_->numerics : RecordedNumerics{};
  if (recorded.coordinator.has_value()) {
    const std::vector<std::string> differences =
        NumericDifferences(own_numerics_, *recorded.coordinator);
    if (!differences.empty()) {
      const std::string what = absl::StrJoin(differences, "; ");
      LOG(WARNING) << "the checkpoint resumed from was written by a coordinator of another numeric "
                      "environment ("
                   << what << "): the target's features may differ in their last bits";
      step_log_->WriteEvent({{"event", "numerics"},
                             {"coordinator_differs_from_checkpoint", what},
                             {"unix_time", UnixSeconds()}});
    }
  }
  metrics_->SetNumericsMixed(recorded.mixed);
  return std::make_unique<NumericsGroup>(job_.train.blas_kernel,
                                         job_.cluster.mixed_numerics == "admit", recorded.workers,
                                         recorded.mixed);
}

absl::Status Coordinator::SetUpFeeders() {
  FD_ASSIGN_OR_RETURN(feeders_, FeederPool::ForJob(job_, own_numerics_, *clock_));
  // A feeder lost with shards of steps in flight: they are sent again, to the others.
  feeders_->SetOnLostWork([this](const std::string& why) { controller_->RequestReform(why); });
  feeders_->ReportTo(metrics_.get());
  // Their /metrics in targets.json. Lock order: the controller, then the pool.
  FeederPool* pool = feeders_.get();
  controller_->AddScrapeTargets([pool] { return pool->ScrapeTargets(); });
  feeders_->SetOnScrapeTargetsChanged([this] { controller_->RefreshScrapeTargets(); });
  return absl::OkStatus();
}

absl::Status Coordinator::WireParts() {
  const JobConfig& j = job_;
  streams_ = std::make_unique<StreamRegistry>(*clock_);
  CheckpointPipeline::Options po;
  po.upload_timeout_seconds = j.cluster.collective_timeout_seconds;
  po.eval_every_steps = j.eval.every_steps;
  po.keep_best = j.checkpoint.keep_best;
  po.best_record = checkpoints_->root() + "/best.json";
  CheckpointStore* store = checkpoints_.get();
  pipeline_ = std::make_unique<CheckpointPipeline>(
      po, upload_specs_,
      [store](uint64_t steps, const std::vector<OwnedTensor>& tensors, const std::string& numerics,
              const std::vector<std::string>& in_use) {
        return store->Write(steps, tensors, numerics, in_use);
      },
      [this] {
        return controller_->NumericsRecord(own_numerics_, job_.train.precision,
                                           job_.train.intra_op_threads);
      },
      [this](absl::Status failure) { Abort(std::move(failure)); }, *metrics_, *step_log_, *clock_);
  if (resumed_) {
    FD_RETURN_IF_ERROR(
        pipeline_->Resumed(resumed_->checkpoint.completed_steps, resumed_->checkpoint.dir));
  }
  controller_ =
      std::make_unique<MembershipController>(JobMembership(j, drafter_config_), SetUpNumerics(),
                                             *streams_, *pipeline_, *metrics_, *clock_);
  StepDriverOptions d;
  d.start_step = start_step_;
  d.total_steps = total_steps_;
  d.learning_rate = JobLearningRatePlan(j.train, total_steps_);
  d.prefetch_steps = j.data.prefetch_steps;
  d.send_teacher = LossNeedsTeacher(j.train);
  d.checkpoint_every_steps = j.checkpoint.every_steps;
  d.checkpoint_every_seconds = j.checkpoint.every_seconds;
  d.export_dir = j.output_dir + "/drafter";
  if (j.checkpoint.keep_best) d.export_best_dir = j.output_dir + "/drafter-best";
  d.min_feeders = j.cluster.min_feeders;
  d.join_timeout_seconds = j.cluster.join_timeout_seconds;
  if (j.cluster.min_feeders > 0) FD_RETURN_IF_ERROR(SetUpFeeders());
  driver_ = std::make_unique<StepDriver>(
      d, StepDriverParts{controller_.get(), pipeline_.get(), &board_, source_.get(),
                         scheduler_.get(), step_log_.get(), metrics_.get(), &store_, clock_,
                         feeders_.get(), deferred_replies_});
  return absl::OkStatus();
}

Coordinator::~Coordinator() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

void Coordinator::SetEvaluator(CheckpointPipeline::Evaluator evaluator) {
  pipeline_->SetEvaluator(std::move(evaluator));
}

absl::Status Coordinator::Start() {
  ServiceParts parts{security_.get(), controller_.get(),
                     streams_.get(),  catalog_.get(),
                     &store_,         [this](v1::StatusReply* reply) { FillStatus(reply); }};
  service_ = NewCoordinatorService(std::move(parts));
  std::vector<grpc::Service*> services = {service_.get()};
  if (feeders_) {
    feeder_service_ = NewFeederControlService(*feeders_, *security_);
    services.push_back(feeder_service_.get());
  }
  FD_ASSIGN_OR_RETURN(server_, StartGrpcServer(job_, *security_, services, &port_));
  metrics_->health().Ready(true, absl::StrCat("serving on port ", port_));
  if (job_.metrics.enabled) {
    FD_ASSIGN_OR_RETURN(std::string address, StartMetricsListener(job_, *metrics_));
    controller_->PublishScrapeTargets(
        std::move(address),
        std::make_unique<LatestFileWriter>(job_.output_dir + "/prometheus/targets.json", *clock_));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::Run() {
  LOG(INFO) << "waiting for " << job_.cluster.min_workers << " worker(s) on port " << port_ << "; "
            << source_->num_samples() << " samples, " << total_steps_ << " steps";
  return driver_->Run();
}

void Coordinator::Abort(absl::Status reason) {
  pipeline_->Cancel(reason);
  if (feeders_) feeders_->Abort(reason);
  controller_->Abort(std::move(reason));
}

bool Coordinator::stopped_early() const { return driver_->stopped_early(); }

void Coordinator::RequestStop(const std::string& why) {
  controller_->RequestStop(why);
  // A wait for feeders ends too (as a wait for workers does: the job is paused, nothing to commit).
  if (feeders_) feeders_->Abort(absl::CancelledError(why));
}

void Coordinator::FillStatus(v1::StatusReply* reply) const {
  board_.Fill(reply);
  const absl::Status failure = controller_->failure();
  if (!failure.ok()) reply->set_state(JobStateName(JobState::kFailed));
  reply->set_total_steps(total_steps_);
  reply->set_job_name(job_.name);
  const CheckpointPipeline::Last last = pipeline_->last();
  reply->set_last_checkpoint_step(last.completed_steps);
  reply->set_last_checkpoint_age_seconds(last.at < 0 ? -1 : clock_->Now() - last.at);
  controller_->FillWorkers(board_.rank_compute_seconds(), reply);
  if (feeders_) feeders_->Fill(reply);
}

}  // namespace flashdraft
