#include "coordinator/coordinator.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/chunk_wire.h"
#include "common/file_util.h"
#include "common/grpc_options.h"
#include "common/net_util.h"
#include "common/security.h"
#include "common/shard_tree.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "coordinator/microbatch_packer.h"
#include "coordinator/scrape_targets.h"
#include "coordinator/service.h"
#include "glog/logging.h"
#include "model/dflash_math.h"
#include "model/drafter_export.h"

namespace flashdraft {
namespace {

// Peer-chosen names (worker ids, hosts) and FetchTensors requests are bounded.
constexpr size_t kMaxNameChars = 128;
constexpr size_t kMaxFetchNames = 1 << 16;

// How long a reported collective failure waits for a lost worker to explain it before the epoch
// is re-formed with the same members (a transient failure).
constexpr double kCollectiveFailureGraceSeconds = 2.0;
// The first epoch starts this long after the last worker arrived when fewer than max_workers are
// there (workers launched together arrive within about a second).
constexpr double kStartSettleSeconds = 2.0;
// Re-forms of one step without a loss before the job gives up on it.
constexpr int kMaxReformsPerStep = 5;

}  // namespace

// data.source 'shards': the manifest carries the drafter config, target.safetensors the tensors.
absl::StatusOr<SourceBundle> Coordinator::OpenShardSource(const JobConfig& j) {
  if (j.data.source != "shards") {
    return absl::UnimplementedError(
        absl::StrCat("data.source '", j.data.source,
                     "' needs the flashdraft-coordinator binary (this build "
                     "of the coordinator library reads offline shards only)"));
  }
  SourceBundle b;
  FD_ASSIGN_OR_RETURN(std::unique_ptr<ShardSource> shards, ShardSource::Open(j.data.shards_dir));
  auto config_it = shards->metadata().find("drafter_config");
  if (config_it == shards->metadata().end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(j.data.shards_dir,
                     "/manifest.json: metadata has no \"drafter_config\" (the target's shape)"));
  }
  b.drafter_config_json = config_it->second;
  b.drafter_config_label = j.data.shards_dir + "/manifest.json";
  b.target_tensors_path = j.data.shards_dir + "/target.safetensors";
  b.label = j.data.shards_dir + ": shards";
  b.source = std::move(shards);
  return b;
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    JobConfig job, const WeightsFactory& initial_weights, const SourceFactory& open_source,
    NumericEnv own_numerics) {
  if (!initial_weights) {
    return absl::InvalidArgumentError("Coordinator::Create needs a drafter weight initializer");
  }
  std::unique_ptr<Coordinator> c(new Coordinator());
  c->job_ = std::move(job);
  c->own_numerics_ = std::move(own_numerics);
  const JobConfig& j = c->job_;
  FD_ASSIGN_OR_RETURN(c->security_, ServerSecurity::Create(j.security, *c->clock_));
  FD_ASSIGN_OR_RETURN(SourceBundle bundle, open_source ? open_source(j) : OpenShardSource(j));
  c->source_ = std::move(bundle.source);
  FD_ASSIGN_OR_RETURN(c->drafter_config_,
                      ParseDrafterConfig(bundle.drafter_config_json, bundle.drafter_config_label));
  DrafterModelConfig& dc = c->drafter_config_;
  dc.num_hidden_layers = j.drafter.num_hidden_layers;
  dc.block_size = j.drafter.block_size;
  if (j.drafter.intermediate_size > 0) dc.intermediate_size = j.drafter.intermediate_size;
  if (j.drafter.mask_token_id >= 0) dc.mask_token_id = j.drafter.mask_token_id;
  if (dc.feature_size() != c->source_->feature_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(bundle.label, " hold features of width ", c->source_->feature_size(),
                     " but the drafter expects n·H = ", dc.feature_size()));
  }
  FD_ASSIGN_OR_RETURN(c->target_, SafetensorsModel::Open(bundle.target_tensors_path));
  const std::vector<int64_t> table = {dc.vocab_size, dc.hidden_size};
  FD_RETURN_IF_ERROR(c->target_->GetChecked("embed_tokens.weight", DType::kF32, table).status());
  c->gamma_ = EffectiveLossDecayGamma(j);
  SchedulerOptions so;
  so.seed = j.train.seed;
  so.global_batch_size = j.train.global_batch_size;
  so.block_size = j.drafter.block_size;
  so.max_anchors = j.drafter.max_anchors;
  so.gamma = c->gamma_;
  so.max_seq_len = j.data.max_seq_len;
  so.virtual_shards = EffectiveVirtualShards(j);
  c->scheduler_ = std::make_unique<Scheduler>(*c->source_, so);
  MembershipOptions mo;
  mo.min_workers = j.cluster.min_workers;
  mo.max_workers = j.cluster.max_workers;
  mo.heartbeat_timeout_seconds = j.cluster.heartbeat_timeout_seconds;
  mo.bind_timeout_seconds = j.cluster.join_timeout_seconds;
  mo.stall_timeout_seconds = j.cluster.stall_timeout_seconds;
  c->membership_ = std::make_unique<Membership>(mo, *c->clock_);
  c->ledger_ = std::make_unique<StepLedger>(j.drafter.block_size - 1);
  c->total_steps_ = j.train.max_steps > 0
                        ? j.train.max_steps
                        : static_cast<int64_t>(c->scheduler_->steps_per_epoch()) * j.train.epochs;
  c->warmup_steps_ = static_cast<int64_t>(std::llround(j.train.warmup_ratio * c->total_steps_));
  std::error_code ec;
  std::filesystem::create_directories(j.output_dir, ec);
  c->metrics_ = std::make_unique<CoordinatorMetrics>(
      j.cluster.backend, c->total_steps_, j.drafter.block_size, c->security_->description(),
      NumericEnvLabels(c->own_numerics_));
  c->checkpoints_ = std::make_unique<CheckpointStore>(
      j.checkpoint.dir.empty() ? j.output_dir + "/checkpoints" : j.checkpoint.dir,
      j.checkpoint.keep_last, JobFingerprint(j), DrafterConfigToJson(c->drafter_config_));
  bool resumed = false;
  if (j.checkpoint.resume) {
    FD_ASSIGN_OR_RETURN(resumed, c->Resume());
  } else if (const std::vector<std::string> old = c->checkpoints_->Existing(); !old.empty()) {
    // A fresh run would prune the earlier run's checkpoints and a later --resume could mix them.
    return absl::FailedPreconditionError(absl::StrCat(
        c->checkpoints_->root(), " holds checkpoints of an earlier run (", old.back(),
        "): continue it with --resume (checkpoint.resume: true), or give this run another "
        "output_dir or checkpoint.dir"));
  }
  if (!resumed) {
    FD_ASSIGN_OR_RETURN(const std::string weights_path, initial_weights(j, dc));
    FD_ASSIGN_OR_RETURN(c->initial_weights_, SafetensorsModel::Open(weights_path));
  }
  // An upload holds the parameters, two AdamW moments per parameter and the step, with the
  // weights' dtypes and shapes: anything else is refused before it is allocated.
  std::vector<TensorSpec> parameters;
  for (const std::string& name : c->initial_weights_->names()) {
    FD_ASSIGN_OR_RETURN(const TensorView view, c->initial_weights_->Get(name));
    parameters.push_back({name, view.dtype, view.shape});
  }
  c->upload_ = std::make_unique<UploadReceiver>(CheckpointUploadSpecs(parameters));
  FD_ASSIGN_OR_RETURN(StepLog log, StepLog::Open(j.output_dir + "/steps.jsonl", c->start_step_));
  c->step_log_ = std::make_unique<StepLog>(std::move(log));
  c->SetUpNumerics();
  return c;
}

void Coordinator::SetUpNumerics() {
  LOG(INFO) << "numerics: " << DescribeNumericEnv(own_numerics_);
  if (resumed_numerics_.coordinator.has_value()) {
    const std::vector<std::string> differences =
        NumericDifferences(own_numerics_, *resumed_numerics_.coordinator);
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
  std::lock_guard<std::mutex> lock(mu_);
  numerics_ = std::make_unique<NumericsGroup>(job_.train.blas_kernel,
                                              job_.cluster.mixed_numerics == "admit",
                                              resumed_numerics_.workers, resumed_numerics_.mixed);
  metrics_->SetNumericsMixed(resumed_numerics_.mixed);
}

Coordinator::~Coordinator() {
  if (checkpoint_thread_.joinable()) checkpoint_thread_.join();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

absl::Status Coordinator::Start() {
  service_ = NewCoordinatorService(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(job_.cluster.listen, security_->credentials(), &port_);
  ConfigureServer(builder);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", job_.cluster.listen));
  }
  const bool loopback = IsLoopbackListen(job_.cluster.listen);
  LOG(INFO) << "gRPC on " << job_.cluster.listen << ", port " << port_
            << (loopback ? " (this host only)" : "") << "; security: " << security_->description();
  if (!loopback && job_.security.insecure &&
      (job_.security.tls_cert.empty() || job_.security.token_file.empty())) {
    LOG(WARNING) << "INSECURE (security.insecure: true): anyone who reaches port " << port_
                 << " can join the job, read the target's and the drafter's weights and feed it "
                    "data";
  }
  if (job_.metrics.enabled) {
    FD_ASSIGN_OR_RETURN(const int metrics_port, metrics_->Serve(job_.metrics.listen));
    FD_RETURN_IF_ERROR(
        WriteFileAtomically(job_.output_dir + "/metrics.port", absl::StrCat(metrics_port, "\n")));
    // Prometheus's file_sd view of the job; workers are added as they tell where they serve.
    std::error_code ec;
    std::filesystem::create_directories(job_.output_dir + "/prometheus", ec);
    {
      std::lock_guard<std::mutex> lock(mu_);
      metrics_address_ = ScrapeAddress(job_.metrics.listen, metrics_port);
      UpdateScrapeTargetsLocked();
    }
    LOG(INFO) << "metrics on port " << metrics_port << " (/metrics"
              << (IsLoopbackListen(job_.metrics.listen)
                      ? ", this host only)"
                      : ", plain HTTP without authentication: keep it on a private network)");
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Coordinator::Resume() {
  FD_ASSIGN_OR_RETURN(std::optional<CheckpointInfo> latest, checkpoints_->Latest());
  if (!latest) {
    LOG(INFO) << "checkpoint.resume: no checkpoint in " << checkpoints_->root()
              << "; starting from step 0";
    return false;
  }
  if (!latest->job.empty() && latest->job != JobFingerprint(job_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        latest->dir, " was written by another job (fingerprint ", latest->job, ", this job's ",
        JobFingerprint(job_),
        "): its target, drafter, data or optimizer settings differ; resuming would mix two runs"));
  }
  if (static_cast<int64_t>(latest->completed_steps) > total_steps_) {
    return absl::InvalidArgumentError(absl::StrCat(latest->dir, " holds ", latest->completed_steps,
                                                   " completed steps, more than this job's ",
                                                   total_steps_));
  }
  FD_ASSIGN_OR_RETURN(resumed_numerics_,
                      ParseRecordedNumerics(latest->numerics, latest->dir + "/checkpoint.json"));
  FD_ASSIGN_OR_RETURN(initial_weights_, SafetensorsModel::Open(latest->model_path));
  FD_ASSIGN_OR_RETURN(optimizer_state_, SafetensorsModel::Open(latest->optimizer_path));
  // steps.jsonl keeps the records of the steps the checkpoint holds (StepLog::Open).
  start_step_ = static_cast<int64_t>(latest->completed_steps);
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_checkpoint_step_ = latest->completed_steps;  // its age is not known: -1
    last_checkpoint_dir_ = latest->dir;
  }
  LOG(INFO) << "resuming from " << latest->dir << ": step " << start_step_ << " of "
            << total_steps_;
  return true;
}

absl::StatusOr<std::vector<FetchEntry>> Coordinator::ResolveFetch(
    const std::vector<std::string>& names) const {
  std::vector<FetchEntry> out;
  if (names.empty()) {
    out.push_back({target_, "embed_tokens.weight", "embed_tokens.weight"});
    if (target_->Contains("lm_head.weight")) {
      out.push_back({target_, "lm_head.weight", "lm_head.weight"});
    }
    for (const std::string& name : initial_weights_->names()) {
      out.push_back({initial_weights_, name, kDrafterWeightPrefix + name});
    }
    if (optimizer_state_) {
      for (const std::string& name : optimizer_state_->names()) {
        out.push_back({optimizer_state_, name, kOptimizerStatePrefix + name});
      }
    }
    return out;
  }
  if (names.size() > kMaxFetchNames) {
    return absl::InvalidArgumentError(
        absl::StrCat("FetchTensors: ", names.size(), " names (at most ", kMaxFetchNames, ")"));
  }
  for (const std::string& wire_name : names) {
    std::shared_ptr<const SafetensorsModel> file = target_;
    std::string name = wire_name;
    for (const auto& [prefix, prefixed] :
         {std::pair<absl::string_view, const std::shared_ptr<const SafetensorsModel>*>{
              kDrafterWeightPrefix, &initial_weights_},
          {kOptimizerStatePrefix, &optimizer_state_}}) {
      if (absl::StartsWith(wire_name, prefix)) {
        file = *prefixed;
        name = wire_name.substr(prefix.size());
      }
    }
    // Names are looked up, never opened; errors echo the name, never a path of this host.
    if (!file) {
      return absl::NotFoundError(absl::StrCat("FetchTensors: no tensor '", Untrusted(wire_name),
                                              "' (this job did not resume from a checkpoint)"));
    }
    if (!file->Contains(name)) {
      return absl::NotFoundError(
          absl::StrCat("FetchTensors: no tensor '", Untrusted(wire_name), "'"));
    }
    out.push_back({file, name, wire_name});
  }
  return out;
}

namespace {

// The first field in which a worker's model shape differs from the job's, as "name a != b".
std::string ModelShapeDifference(const v1::ModelShape& s, const DrafterModelConfig& d) {
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"hidden_size", {s.hidden_size(), d.hidden_size}},
      {"num_hidden_layers", {s.num_hidden_layers(), d.num_hidden_layers}},
      {"num_attention_heads", {s.num_attention_heads(), d.num_attention_heads}},
      {"num_key_value_heads", {s.num_key_value_heads(), d.num_key_value_heads}},
      {"head_dim", {s.head_dim(), d.head_dim}},
      {"intermediate_size", {s.intermediate_size(), d.intermediate_size}},
      {"vocab_size", {s.vocab_size(), d.vocab_size}},
      {"block_size", {s.block_size(), d.block_size}},
  };
  for (const auto& [name, values] : fields) {
    if (values.first != values.second) {
      return absl::StrCat(name, " ", values.first, " != ", values.second);
    }
  }
  if (!std::equal(s.target_layer_ids().begin(), s.target_layer_ids().end(),
                  d.target_layer_ids.begin(), d.target_layer_ids.end())) {
    return "target_layer_ids";
  }
  return "";
}

}  // namespace

std::string Coordinator::CapabilityRefusal(const v1::JoinRequest& request) const {
  // The id and host are shown in logs, status and steps.jsonl: short printable text only.
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string*>{"worker_id", &request.worker_id()},
        {"hostname", &request.capability().hostname()},
        {"device", &request.capability().device()}}) {
    if (value->size() > kMaxNameChars || !IsPrintableAscii(*value)) {
      return absl::StrCat(field, " '", Untrusted(*value), "' must be at most ", kMaxNameChars,
                          " printable ASCII characters");
    }
  }
  if (request.protocol_version() != v1::PROTOCOL_VERSION_CURRENT) {
    return absl::StrCat("protocol version ", request.protocol_version(),
                        " is not this coordinator's version ",
                        static_cast<int>(v1::PROTOCOL_VERSION_CURRENT));
  }
  // A worker tells the collectives it was built with ("gloo" or "gloo,nccl"; none said: gloo).
  const std::string& offered =
      request.capability().backend().empty() ? "gloo" : request.capability().backend();
  if (!OffersBackend(offered, job_.cluster.backend)) {
    return absl::StrCat("the job sums gradients over ", job_.cluster.backend,
                        " (cluster.backend) and this worker has only '", Untrusted(offered), "'",
                        job_.cluster.backend == "nccl"
                            ? ": build it with -DFLASHDRAFT_WITH_CUDA=ON on a GPU machine"
                            : "");
  }
  if (request.has_model_shape()) {
    if (std::string d = ModelShapeDifference(request.model_shape(), drafter_config_); !d.empty()) {
      return absl::StrCat("model shape differs from the job's: ", d);
    }
  }
  if (!request.capability().has_numerics()) {
    return "the worker did not report its numeric environment (Capability.numerics)";
  }
  return "";
}

void Coordinator::Join(const v1::JoinRequest& request, v1::JoinReply* reply) {
  auto refuse = [&](std::string reason) {
    reply->set_accepted(false);
    reply->set_reason(reason);
    LOG(WARNING) << "refused worker '" << Untrusted(request.worker_id()) << "': " << reason;
  };
  if (std::string why = CapabilityRefusal(request); !why.empty()) return refuse(why);
  const NumericEnv env =
      NumericEnvFromProto(request.capability().numerics(), job_.worker.device == "cuda");
  if (absl::Status s = ValidateNumericEnv(env, "Capability.numerics"); !s.ok()) {
    return refuse(std::string(s.message()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (membership_->Members().empty()) numerics_->GroupEmptied();
  const NumericsDecision numerics = numerics_->Consider(env);
  if (!numerics.admit) {
    reply->set_blas_kernel(numerics.blas_kernel);
    return refuse(numerics.refusal);
  }
  absl::StatusOr<std::string> token = membership_->Admit(request.worker_id());
  if (!token.ok()) return refuse(std::string(token.status().message()));
  numerics_->Commit(env, numerics);
  last_arrival_ = clock_->Now();
  reply->set_accepted(true);
  reply->set_session_token(*token);
  reply->set_job_config_yaml(JobConfigToYaml(job_));
  reply->set_drafter_config_json(DrafterConfigToJson(drafter_config_));
  LOG(INFO) << "worker '" << request.worker_id() << "' (" << request.capability().hostname() << ", "
            << request.capability().device() << ") joined";
  RecordAdmittedNumericsLocked(request.worker_id(), env, numerics);
  UpdateWorkerMetricsLocked();
}

void Coordinator::RecordAdmittedNumericsLocked(const std::string& worker, const NumericEnv& env,
                                               const NumericsDecision& decision) {
  auto event = [&](nlohmann::json fields) {
    fields["event"] = "numerics";
    fields["worker"] = worker;
    fields["unix_time"] = UnixSeconds();
    pending_events_.push_back(std::move(fields));  // written by Run's thread (FlushEvents)
  };
  if (decision.first) {
    LOG(INFO) << "the workers' numeric environment (worker '" << worker
              << "'): " << DescribeNumericEnv(env);
    event({{"workers", NumericEnvToJson(env)}});
  }
  if (!decision.differs_from_previous.empty()) {
    LOG(WARNING) << "the workers' numeric environment differs from " << decision.previous << " ("
                 << decision.differs_from_previous
                 << "): the run goes on, but not to the bit as it would have on those";
    event({{"differs_from_previous", decision.differs_from_previous},
           {"previous", decision.previous}});
  }
  if (!decision.mixed.empty()) {
    LOG(WARNING) << "worker '" << worker
                 << "' computes in another numeric environment than the job's other workers ("
                 << decision.mixed
                 << "), admitted by cluster.mixed_numerics: admit: this job's numbers are no "
                    "longer reproducible to the bit";
    metrics_->SetNumericsMixed(true);
    event({{"mixed", decision.mixed}, {"reproducible", false}});
  }
}

void Coordinator::FlushEvents() {
  std::vector<nlohmann::json> events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events.swap(pending_events_);
  }
  for (const nlohmann::json& e : events) step_log_->WriteEvent(e);
}

bool Coordinator::ValidToken(const std::string& token) const {
  std::lock_guard<std::mutex> lock(mu_);
  return membership_->Valid(token);
}

void Coordinator::StreamOpened(TrainSession* session) {
  std::lock_guard<std::mutex> lock(mu_);
  unbound_streams_[session] = clock_->Now();
}

absl::Status Coordinator::SessionStarted(TrainSession* session, const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  unbound_streams_.erase(session);
  FD_RETURN_IF_ERROR(membership_->Bind(token));
  sessions_[token] = session;
  last_arrival_ = clock_->Now();
  UpdateWorkerMetricsLocked();
  cv_.notify_all();
  return absl::OkStatus();
}

void Coordinator::UpdateWorkerMetricsLocked() {
  metrics_->SetWorkers(
      membership_->Count(MemberState::kActive),
      membership_->Count(MemberState::kReady) + membership_->Count(MemberState::kJoined), epoch_);
}

void Coordinator::UpdateScrapeTargetsLocked() {
  if (metrics_address_.empty()) return;
  std::vector<ScrapeTarget> targets = {{metrics_address_, "coordinator", ""}};
  std::vector<MemberInfo> members = membership_->Members();
  std::sort(members.begin(), members.end(),
            [](const MemberInfo& a, const MemberInfo& b) { return a.worker_id < b.worker_id; });
  for (const MemberInfo& m : members) {
    if (!m.metrics_address.empty()) targets.push_back({m.metrics_address, "worker", m.worker_id});
  }
  std::string json = ScrapeTargetsJson(job_.name, targets);
  if (json == scrape_targets_) return;
  const std::string path = job_.output_dir + "/prometheus/targets.json";
  if (absl::Status s = WriteFileAtomically(path, json); !s.ok()) {
    LOG(WARNING) << "cannot update " << path << ": " << s.message();
    return;
  }
  scrape_targets_ = std::move(json);
}

void Coordinator::DropSessionLocked(const std::string& token, const std::string& why) {
  const MemberInfo* found = membership_->Find(token);
  const std::optional<MemberInfo> member = found ? std::optional<MemberInfo>(*found) : std::nullopt;
  const std::string who = member ? absl::StrCat("'", member->worker_id, "'")
                                 : absl::StrCat("token ", token.substr(0, 6));
  const int rank = membership_->RankOf(token);
  const bool over = state_ == "done" || state_ == "failed" || state_ == "stopped";
  if (membership_->Remove(token) && !over) {
    LOG(WARNING) << "worker " << who << " (rank " << rank << " of epoch " << epoch_
                 << ") lost: " << why;
    metrics_->WorkerFailed();
    changes_.emplace_back(member->worker_id, absl::StrCat("lost: ", why));
  } else if (member && !over) {
    LOG(INFO) << "worker " << who << " left before training: " << why;
  }
  // A worker declared lost while its stream is open (hung, cut off) is told so and never
  // counted again: its token is gone.
  EndStreamLocked(
      token, grpc::Status(grpc::StatusCode::ABORTED, absl::StrCat("removed from the job: ", why)));
  UpdateWorkerMetricsLocked();
  UpdateScrapeTargetsLocked();
  cv_.notify_all();
}

void Coordinator::EndStreamLocked(const std::string& token, const grpc::Status& status,
                                  const v1::CoordinatorMessage* last) {
  auto it = sessions_.find(token);
  if (it == sessions_.end()) return;
  if (last != nullptr) it->second->Send(MessageToBuffer(*last));
  it->second->FinishAfterWrites(status);
  sessions_.erase(it);
}

void Coordinator::SessionEnded(TrainSession* session, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  unbound_streams_.erase(session);
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->second == session) {
      const std::string token = it->first;
      sessions_.erase(it);  // the stream is already over: nothing to finish
      DropSessionLocked(token, why);
      return;
    }
  }
}

void Coordinator::ExpireLocked() {
  for (const Expiry& expired : membership_->Expired())
    DropSessionLocked(expired.token, expired.why);
  const double deadline = clock_->Now() - job_.cluster.heartbeat_timeout_seconds;
  for (auto it = unbound_streams_.begin(); it != unbound_streams_.end();) {
    if (it->second >= deadline) {
      ++it;
      continue;
    }
    it->first->FinishAfterWrites(
        grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                     absl::StrCat("no first message on the Train stream within ",
                                  job_.cluster.heartbeat_timeout_seconds, " s")));
    it = unbound_streams_.erase(it);
  }
}

void Coordinator::OnAck(const std::string& token, const v1::StepAck& ack) {
  std::lock_guard<std::mutex> lock(mu_);
  membership_->Heard(token);
  // Acks of another epoch, of a step that is not in flight, or from a non-member are stale.
  if (!ledger_->Add(membership_->RankOf(token), committed_, ack)) {
    VLOG(1) << "ignored a stale ack of step " << ack.step() << " epoch " << ack.membership_epoch();
    return;
  }
  cv_.notify_all();
}

void Coordinator::OnHeartbeat(const std::string& token, const v1::Heartbeat& heartbeat) {
  std::lock_guard<std::mutex> lock(mu_);
  membership_->Progress(token, heartbeat.progress(),
                        heartbeat.phase().empty() ? "idle" : heartbeat.phase(), heartbeat.step(),
                        heartbeat.busy());
  if (!heartbeat.metrics_address().empty() &&
      membership_->SetMetricsAddress(token, heartbeat.metrics_address())) {
    UpdateScrapeTargetsLocked();
  }
}

void Coordinator::OnLeave(const std::string& token, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  membership_->Heard(token);
  if (!membership_->RequestLeave(token, absl::StrCat("the worker asked to leave (", reason, ")"))
           .ok()) {
    return;
  }
  LOG(INFO) << "worker '" << membership_->Find(token)->worker_id << "' asks to leave: " << reason;
  ReleaseLeavingLocked(/*at_step_boundary=*/false);
  cv_.notify_all();
}

void Coordinator::Drain(const v1::DrainRequest& request, v1::DrainReply* reply) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string token = request.worker_case() == v1::DrainRequest::kRank
                                ? membership_->TokenOfRank(static_cast<int>(request.rank()))
                                : membership_->TokenOfWorker(request.worker_id());
  if (token.empty() || request.worker_case() == v1::DrainRequest::WORKER_NOT_SET) {
    reply->set_accepted(false);
    reply->set_message(request.worker_case() == v1::DrainRequest::kRank
                           ? absl::StrCat("no worker has rank ", request.rank(),
                                          " in membership epoch ", epoch_, " (",
                                          membership_->world_size(), " worker(s))")
                           : absl::StrCat("no worker '", request.worker_id(), "' in the job"));
    return;
  }
  const MemberInfo& m = *membership_->Find(token);
  (void)membership_->RequestLeave(token, "drained (flashdraft status --drain)");
  reply->set_accepted(true);
  reply->set_message(
      m.state == MemberState::kActive
          ? absl::StrCat("worker '", m.worker_id, "' (rank ", m.rank, ") leaves after step ",
                         committed_, " commits")
          : absl::StrCat("worker '", m.worker_id, "' leaves now (it was not training)"));
  LOG(INFO) << reply->message();
  ReleaseLeavingLocked(/*at_step_boundary=*/false);
  cv_.notify_all();
}

void Coordinator::ReleaseLeavingLocked(bool at_step_boundary) {
  for (const std::string& token : membership_->Leaving()) {
    const MemberInfo m = *membership_->Find(token);
    if (m.state == MemberState::kActive && !at_step_boundary) continue;
    v1::CoordinatorMessage shutdown;
    shutdown.mutable_shutdown()->set_reason(m.leave_reason);
    EndStreamLocked(token, grpc::Status::OK, &shutdown);
    membership_->Remove(token);
    changes_.emplace_back(m.worker_id, absl::StrCat("left: ", m.leave_reason));
    LOG(INFO) << "worker '" << m.worker_id << "'"
              << (m.rank >= 0 ? absl::StrCat(" (rank ", m.rank, ")") : "")
              << " left: " << m.leave_reason;
  }
  UpdateWorkerMetricsLocked();
}

void Coordinator::OnWorkerError(const std::string& token, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  DropSessionLocked(token, absl::StrCat("failed: ", error));
}

void Coordinator::OnCollectiveFailure(const std::string& token,
                                      const v1::CollectiveFailure& failure) {
  std::lock_guard<std::mutex> lock(mu_);
  membership_->Heard(token);
  if (failure.membership_epoch() != epoch_ || membership_->RankOf(token) < 0) return;
  LOG(WARNING) << "rank " << membership_->RankOf(token) << ": collective of step " << failure.step()
               << " failed: " << failure.error();
  if (collective_failed_at_ == 0) collective_failed_at_ = clock_->Now();
  cv_.notify_all();
}

void Coordinator::FailUploadLocked(const std::string& token, const std::string& why) {
  // A worker that sends a broken upload is broken: it leaves the job (the checkpoint waiting for
  // it is skipped, TakeCheckpoint) and the others go on.
  upload_->Reset();
  DropSessionLocked(token, absl::StrCat("failed: sent a bad checkpoint upload: ", why));
  cv_.notify_all();
}

void Coordinator::OnCheckpointUpload(const std::string& token, const v1::CheckpointUpload& upload) {
  std::lock_guard<std::mutex> lock(mu_);
  membership_->Heard(token);
  absl::Status s = upload_->Begin(token, upload);
  if (absl::IsFailedPrecondition(s)) {
    LOG(WARNING) << "ignored a checkpoint upload: " << s.message();
  } else if (!s.ok()) {
    FailUploadLocked(token, std::string(s.message()));
  }
}

void Coordinator::OnCheckpointChunk(const std::string& token, const v1::TensorChunk& chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  membership_->Heard(token);
  absl::Status s = upload_->Add(token, chunk);
  if (absl::IsFailedPrecondition(s)) return;  // of an upload that was given up: dropped
  if (!s.ok()) return FailUploadLocked(token, std::string(s.message()));
  if (!upload_->active()) cv_.notify_all();
}

void Coordinator::StartCheckpoint(uint64_t completed_steps, const std::string& uploader) {
  checkpoint_thread_ = std::thread([this, completed_steps, uploader] {
    absl::Status taken = TakeCheckpoint(completed_steps, uploader);
    if (absl::IsAborted(taken)) {
      LOG(WARNING) << "checkpoint skipped: " << taken.message();
    } else if (!taken.ok()) {
      Abort(taken);
    } else if (EvalDue(completed_steps)) {
      std::string dir;
      {
        std::lock_guard<std::mutex> lock(mu_);
        dir = last_checkpoint_dir_;
      }
      Evaluate(completed_steps, dir);
    }
  });
}

bool Coordinator::EvalDue(uint64_t completed_steps) const {
  return evaluator_ && job_.eval.every_steps > 0 &&
         completed_steps % static_cast<uint64_t>(job_.eval.every_steps) == 0;
}

void Coordinator::Evaluate(uint64_t completed_steps, const std::string& checkpoint_dir) {
  const double start = clock_->Now();
  absl::StatusOr<EvalSummary> eval = evaluator_(checkpoint_dir);
  if (!eval.ok()) {  // training goes on; the next evaluation may succeed
    LOG(WARNING) << "evaluation after step " << completed_steps
                 << " failed: " << eval.status().message();
    return;
  }
  eval->seconds = clock_->Now() - start;
  metrics_->RecordEval(*eval);
  std::vector<double> acceptance;
  for (int64_t n : eval->accepted_per_position) {
    acceptance.push_back(eval->drafts > 0 ? static_cast<double>(n) / eval->drafts : 0.0);
  }
  step_log_->WriteEvent({{"event", "eval"},
                         {"completed_steps", completed_steps},
                         {"tau", eval->tau},
                         {"prompts", eval->prompts},
                         {"num_drafts", eval->drafts},
                         {"num_draft_tokens", eval->draft_tokens},
                         {"num_accepted_tokens", eval->accepted_tokens},
                         {"acceptance_per_position", acceptance},
                         {"seconds", eval->seconds},
                         {"unix_time", UnixSeconds()}});
  LOG(INFO) << absl::StrFormat(
      "eval after step %d: tau %.2f on %d prompt(s) (acceptance at position 1: %.2f) in %.1f s",
      completed_steps, eval->tau, eval->prompts, acceptance.empty() ? 0.0 : acceptance[0],
      eval->seconds);
}

void Coordinator::FinishCheckpoint() {
  if (checkpoint_thread_.joinable()) checkpoint_thread_.join();
}

absl::Status Coordinator::TakeCheckpoint(uint64_t completed_steps, const std::string& uploader) {
  const double start = clock_->Now();
  std::vector<OwnedTensor> tensors;
  std::string numerics;  // what computed it (checkpoint.json)
  {
    std::unique_lock<std::mutex> lock(mu_);
    const double deadline = start + job_.cluster.collective_timeout_seconds;
    while (failure_.ok() && !upload_->Complete(completed_steps)) {
      // Run's thread expires silent workers. Other membership changes do not matter: the
      // uploader's state after a committed step is the group's.
      if (membership_->Find(uploader) == nullptr) {
        upload_->Reset();
        return absl::AbortedError(
            absl::StrCat("the uploading worker left before the checkpoint of "
                         "step ",
                         completed_steps, " arrived"));
      }
      if (clock_->Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("rank 0 did not upload the checkpoint of step ", completed_steps,
                         " within ", job_.cluster.collective_timeout_seconds, " s"));
      }
      cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
    if (!failure_.ok()) return failure_;
    tensors = upload_->Take();
    numerics = RecordNumerics(numerics_->group(), own_numerics_, numerics_->mixed(),
                              job_.train.precision, job_.train.intra_op_threads);
  }
  FD_ASSIGN_OR_RETURN(const CheckpointInfo info,
                      checkpoints_->Write(completed_steps, tensors, numerics));
  const double seconds = clock_->Now() - start;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_checkpoint_step_ = completed_steps;
    last_checkpoint_at_ = clock_->Now();
    last_checkpoint_dir_ = info.dir;
  }
  metrics_->RecordCheckpoint(seconds, UnixSeconds());
  LOG(INFO) << absl::StrFormat("checkpoint %s written in %.2f s", info.dir, seconds);
  return absl::OkStatus();
}

absl::Status Coordinator::ExportFinalDrafter() {
  // The checkpoint this process wrote (or resumed from, verified then): not read a second time.
  std::string last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (last_checkpoint_step_ == static_cast<uint64_t>(total_steps_)) last = last_checkpoint_dir_;
  }
  if (last.empty()) {
    return absl::DataLossError(absl::StrCat(
        "the checkpoint of the last step (", total_steps_,
        ") was not written, so the drafter was not exported; `flashdraft export --checkpoint "
        "DIR --out DIR` exports the newest checkpoint there is"));
  }
  const std::string dir = job_.output_dir + "/drafter";
  FD_RETURN_IF_ERROR(ExportCheckpoint(last, dir));
  LOG(INFO) << "exported the drafter to " << dir;
  return absl::OkStatus();
}

void Coordinator::RequestStop(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (epoch_ == 0) {
    if (failure_.ok()) failure_ = absl::CancelledError(why);
  } else if (stop_requested_.empty()) {
    stop_requested_ = why;
    LOG(WARNING) << why << ": stopping after the step in flight, with a checkpoint";
  }
  cv_.notify_all();
}

void Coordinator::Abort(absl::Status reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_.ok()) failure_ = std::move(reason);
  cv_.notify_all();
}

void Coordinator::FillStatus(v1::StatusReply* reply) const {
  std::lock_guard<std::mutex> lock(mu_);
  reply->set_state(!failure_.ok() ? "failed" : state_);
  reply->set_step(committed_);
  reply->set_total_steps(total_steps_);
  reply->set_membership_epoch(epoch_);
  reply->set_world_size(static_cast<uint32_t>(membership_->world_size()));
  reply->set_loss(last_record_.loss);
  reply->set_tau_estimate(last_record_.TauEstimate());
  reply->set_job_name(job_.name);
  reply->set_step_seconds(last_record_.step_seconds);
  reply->set_tokens_per_second(last_record_.step_seconds > 0
                                   ? static_cast<double>(last_record_.tokens) /
                                         last_record_.step_seconds
                                   : 0.0);
  reply->set_eta_seconds(eta_seconds_);
  const double now = clock_->Now();
  reply->set_last_checkpoint_step(last_checkpoint_step_);
  reply->set_last_checkpoint_age_seconds(last_checkpoint_at_ < 0 ? -1 : now - last_checkpoint_at_);
  for (const MemberInfo& m : membership_->Members()) {
    v1::WorkerStatus* w = reply->add_workers();
    w->set_worker_id(m.worker_id);
    w->set_state(MemberStateName(m.state));
    w->set_rank(m.rank);
    w->set_seconds_since_heard(now - m.last_heard);
    w->set_phase(m.phase);
    w->set_step(m.step);
    w->set_leaving(!m.leave_reason.empty());
    w->set_metrics_address(m.metrics_address);
    if (m.rank >= 0 && static_cast<size_t>(m.rank) < last_record_.rank_compute_seconds.size()) {
      w->set_step_seconds(last_record_.rank_compute_seconds[m.rank]);
    }
  }
}

absl::Status Coordinator::SendStep(const StepPlan& plan) {
  const double lr = CosineLearningRate(job_.train.learning_rate, warmup_steps_, total_steps_,
                                       static_cast<int64_t>(plan.step));
  for (int rank = 0; rank < world_size_; ++rank) {
    for (int64_t shard = plan.shard_offsets[rank]; shard < plan.shard_offsets[rank + 1]; ++shard) {
      std::vector<grpc::ByteBuffer> messages;
      FD_RETURN_IF_ERROR(EncodeShard(plan, shard, rank, lr, &messages));
      std::lock_guard<std::mutex> lock(mu_);
      // A member lost meanwhile gets nothing; WaitForAcks sees the change and the step is sent
      // again in the next epoch.
      if (rank >= membership_->world_size()) continue;
      auto it = sessions_.find(membership_->ranks()[rank]);
      if (it == sessions_.end()) continue;
      uint64_t bytes = 0;
      for (grpc::ByteBuffer& msg : messages) {
        bytes += msg.Length();
        it->second->Send(std::move(msg));
      }
      metrics_->AddStreamBytes(bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status Coordinator::EncodeShard(const StepPlan& plan, int64_t shard, int rank, double lr,
                                      std::vector<grpc::ByteBuffer>* messages) {
  const uint64_t step = plan.step;
  const MicrobatchPlan& mb = plan.shards[shard];
  v1::CoordinatorMessage header;
  v1::Microbatch* m = header.mutable_microbatch();
  m->set_step(step);
  m->set_membership_epoch(sending_epoch_);
  m->set_rank(rank);
  m->set_world_size(world_size_);
  m->set_global_weight_sum(plan.global_weight_sum);
  m->set_learning_rate(lr);
  m->set_num_tensors(MicrobatchPacker::kNumTensors);
  m->set_shard(static_cast<uint32_t>(shard));
  m->set_num_shards(static_cast<uint32_t>(plan.shards.size()));
  for (int64_t offset : plan.shard_offsets) m->add_shard_offsets(static_cast<uint32_t>(offset));
  messages->push_back(MessageToBuffer(header));

  // Right-padded [b, S] batch of the shard's samples, their features and anchors.
  int64_t s = 1;
  for (int64_t len : mb.lengths) s = std::max(s, len);
  MicrobatchPacker packer(static_cast<int64_t>(mb.samples.size()), s, source_->feature_size(),
                          source_->feature_dtype());
  for (uint64_t index : mb.samples) {
    FD_ASSIGN_OR_RETURN(Sample sample, source_->Get(index));
    scheduler_->Truncate(sample);
    std::vector<int64_t> anchors = scheduler_->Anchors(sample, step);
    FD_RETURN_IF_ERROR(packer.Add(sample, std::move(anchors)));
  }
  return packer.Encode(messages);
}

absl::Status Coordinator::WaitForAcks(uint64_t step) {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (!failure_.ok()) return failure_;
    ExpireLocked();
    if (membership_->Changed()) {
      return absl::AbortedError(
          absl::StrCat("the membership changed before step ", step, " committed"));
    }
    if (ledger_->Complete(step)) return absl::OkStatus();
    // A failed collective that no loss explains: re-form with the same members.
    if (collective_failed_at_ > 0 &&
        clock_->Now() - collective_failed_at_ > kCollectiveFailureGraceSeconds) {
      membership_->RequestReform();
      return absl::AbortedError(absl::StrCat("a collective of step ", step, " failed"));
    }
    cv_.wait_for(lock, std::chrono::milliseconds(100));
  }
}

absl::Status Coordinator::StartEpoch(int64_t next_step) {
  std::unique_lock<std::mutex> lock(mu_);
  const double start = clock_->Now();
  bool said = false;
  // The first epoch waits for every worker that is on its way (joined, or joining shortly after
  // another) up to max_workers, so that a job launched with N workers starts with N.
  auto starting_short = [&] {
    return epoch_ == 0 && membership_->Available() < job_.cluster.max_workers &&
           (membership_->Count(MemberState::kJoined) > 0 ||
            clock_->Now() - last_arrival_ < kStartSettleSeconds);
  };
  while (failure_.ok() &&
         (membership_->Available() < job_.cluster.min_workers || starting_short())) {
    if (!stop_requested_.empty()) {
      failure_ =
          absl::CancelledError(absl::StrCat(stop_requested_,
                                            " while paused: no worker to checkpoint from; the last "
                                            "checkpoint stands"));
      break;
    }
    const int missing = std::max(0, job_.cluster.min_workers - membership_->Available());
    if (epoch_ > 0) state_ = "paused";
    metrics_->SetMissingWorkers(missing);
    if (!said && missing > 0) {
      LOG(WARNING) << (epoch_ > 0 ? "paused: " : "") << "waiting for " << missing
                   << " more worker(s) (cluster.min_workers " << job_.cluster.min_workers
                   << ", up to " << job_.cluster.join_timeout_seconds << " s)";
      said = true;
    }
    if (clock_->Now() - start > job_.cluster.join_timeout_seconds) {
      failure_ = absl::DeadlineExceededError(
          absl::StrCat("only ", membership_->Available(), " of cluster.min_workers ",
                       job_.cluster.min_workers, " workers within cluster.join_timeout_seconds ",
                       job_.cluster.join_timeout_seconds, " s"));
      break;
    }
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    ExpireLocked();
    ReleaseLeavingLocked(/*at_step_boundary=*/true);  // nobody trains while paused
  }
  if (!failure_.ok()) return failure_;
  metrics_->SetMissingWorkers(0);
  const std::vector<std::string> before = membership_->ranks();
  const EpochPlan plan = membership_->NextEpoch();
  // The last epoch's group is abandoned: its rendezvous keys go.
  if (sending_epoch_ > 0) store_.DeletePrefix(absl::StrCat("epoch/", sending_epoch_, "/"));
  epoch_ = plan.epoch;
  sending_epoch_ = plan.epoch;
  world_size_ = static_cast<int>(plan.tokens.size());
  ledger_->Reset(plan.epoch, world_size_,
                 ShardOffsets(scheduler_->num_shards(world_size_), world_size_));
  collective_failed_at_ = 0;
  state_ = "training";
  std::vector<std::string> ids;
  for (size_t r = 0; r < plan.tokens.size(); ++r) {
    v1::CoordinatorMessage message;
    v1::Reform* reform = message.mutable_reform();
    reform->set_membership_epoch(plan.epoch);
    reform->set_rank(static_cast<uint32_t>(r));
    reform->set_world_size(static_cast<uint32_t>(world_size_));
    reform->set_store_prefix(absl::StrCat("epoch/", plan.epoch));
    reform->set_next_step(static_cast<uint64_t>(next_step));
    reform->set_sync_state(plan.needs_state_sync);
    auto it = sessions_.find(plan.tokens[r]);
    if (it != sessions_.end()) it->second->Send(MessageToBuffer(message));
    const MemberInfo& m = *membership_->Find(plan.tokens[r]);
    ids.push_back(m.worker_id);
    if (plan.epoch > 1 && std::find(before.begin(), before.end(), plan.tokens[r]) == before.end()) {
      changes_.emplace_back(m.worker_id, "joined");
    }
  }
  nlohmann::json changes = nlohmann::json::array();
  for (const auto& [worker, why] : changes_) changes.push_back({{"worker", worker}, {"why", why}});
  changes_.clear();
  UpdateWorkerMetricsLocked();
  LOG(INFO) << "membership epoch " << plan.epoch << ": " << world_size_ << " worker(s) ["
            << absl::StrJoin(ids, ", ") << "] from step " << next_step
            << (plan.needs_state_sync ? " (newcomers receive the state from rank 0)" : "");
  lock.unlock();
  FlushEvents();  // the admissions' numerics first
  step_log_->WriteEvent({{"event", "membership"},
                         {"membership_epoch", plan.epoch},
                         {"world_size", world_size_},
                         {"workers", ids},
                         {"changes", changes},
                         {"next_step", next_step},
                         {"unix_time", UnixSeconds()}});
  return absl::OkStatus();
}

absl::Status Coordinator::Run() {
  LOG(INFO) << "waiting for " << job_.cluster.min_workers << " worker(s) on port " << port_ << "; "
            << source_->num_samples() << " samples, " << total_steps_ << " steps";
  const int64_t prefetch = std::max(1, job_.data.prefetch_steps);
  int64_t sent = start_step_;
  const double start = clock_->Now();
  double step_start = start;
  double changed_at = 0;  // when the membership last changed (0: not since the last commit)
  absl::Status result;
  // The plan of the next step to send, made one step early so the source can start on it.
  std::optional<StepPlan> next_plan;
  CheckpointCadence cadence(job_.checkpoint.every_steps, job_.checkpoint.every_seconds,
                            total_steps_, *clock_);
  int64_t step = start_step_;
  std::string stopped;  // why the job stopped before its last step (a graceful stop)
  while (step < total_steps_) {
    bool changed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      changed = membership_->Changed();
    }
    if (changed) {
      // A new epoch at this step boundary: steps sent in the old one are sent again.
      if (sent > step) metrics_->StepsReissued(sent - step);
      if (sending_epoch_ > 0 && ++reforms_at_step_ > kMaxReformsPerStep) {
        result =
            absl::UnavailableError(absl::StrCat("step ", step, " failed in ", kMaxReformsPerStep,
                                                " membership epochs in a row; giving up"));
        break;
      }
      if (changed_at == 0 && sending_epoch_ > 0) changed_at = clock_->Now();
      result = StartEpoch(step);
      if (!result.ok()) break;
      sent = step;
      next_plan.reset();
      step_start = clock_->Now();
    }
    // Keep `prefetch` steps queued at every worker so none waits on the source.
    while (sent < total_steps_ && sent <= step + prefetch) {
      const StepPlan plan = next_plan && static_cast<int64_t>(next_plan->step) == sent
                                ? std::move(*next_plan)
                                : scheduler_->Plan(static_cast<uint64_t>(sent), world_size_);
      next_plan.reset();
      result = SendStep(plan);
      ++sent;
      if (!result.ok()) break;
      // The source may start on the step after the ones queued (an online target does).
      if (sent < total_steps_) {
        next_plan = scheduler_->Plan(static_cast<uint64_t>(sent), world_size_);
        std::vector<uint64_t> next;
        for (const MicrobatchPlan& mb : next_plan->shards) {
          next.insert(next.end(), mb.samples.begin(), mb.samples.end());
        }
        source_->Prefetch(next);
      }
    }
    if (!result.ok()) break;
    result = WaitForAcks(static_cast<uint64_t>(step));
    if (absl::IsAborted(result)) {
      LOG(WARNING) << result.message() << "; re-forming the group";
      result = absl::OkStatus();
      continue;
    }
    if (!result.ok()) break;
    std::string stop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop = stop_requested_;
    }
    v1::CoordinatorMessage commit;
    commit.mutable_commit()->set_step(step);
    commit.mutable_commit()->set_membership_epoch(sending_epoch_);
    const bool checkpoint =
        !stop.empty() || cadence.Due(step) || EvalDue(static_cast<uint64_t>(step + 1));
    commit.mutable_commit()->set_checkpoint(checkpoint);
    // One checkpoint at a time: the previous one is in before this commit asks for the next.
    if (checkpoint) FinishCheckpoint();
    std::string uploader;  // the epoch's rank 0 uploads the state after this step
    {
      const grpc::ByteBuffer bytes = MessageToBuffer(commit);
      std::lock_guard<std::mutex> lock(mu_);
      if (checkpoint) {
        uploader = membership_->ranks()[0];
        upload_->Expect(uploader, static_cast<uint64_t>(step + 1));
      }
      for (const std::string& token : membership_->ranks()) {
        auto it = sessions_.find(token);
        if (it != sessions_.end()) it->second->Send(bytes);
      }
      membership_->Committed();
    }
    reforms_at_step_ = 0;
    absl::StatusOr<StepRecord> aggregated;
    bool numerics_mixed = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aggregated = ledger_->Take(static_cast<uint64_t>(step));
      numerics_mixed = numerics_->mixed();
    }
    if (!aggregated.ok()) {
      result = aggregated.status();
      break;
    }
    StepRecord& r = *aggregated;
    r.membership_epoch = sending_epoch_;
    r.numerics_mixed = numerics_mixed;
    r.step_seconds = clock_->Now() - step_start;
    r.learning_rate = CosineLearningRate(job_.train.learning_rate, warmup_steps_, total_steps_,
                                         static_cast<int64_t>(step));
    // The record first: a crash while checkpointing must not lose the step from steps.jsonl.
    step_log_->Write(r);
    metrics_->RecordStep(r);
    if (changed_at > 0) {
      const double recovery = clock_->Now() - changed_at;
      metrics_->RecordRecovery(recovery);
      step_log_->WriteEvent({{"event", "recovered"},
                             {"membership_epoch", sending_epoch_},
                             {"committed_step", step},
                             {"recovery_seconds", recovery},
                             {"unix_time", UnixSeconds()}});
      changed_at = 0;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      committed_ = step + 1;
      last_record_ = r;
    }
    if (checkpoint) {
      // Written on its own thread: training goes on while rank 0 uploads and the files are
      // fsynced (a checkpoint still in progress is waited for before the next one).
      StartCheckpoint(static_cast<uint64_t>(step + 1), uploader);
      cadence.Taken();
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!membership_->Leaving().empty()) {
        // Workers leave at this boundary, once a checkpoint their upload may be part of is in.
        lock.unlock();
        FinishCheckpoint();
        lock.lock();
        ReleaseLeavingLocked(/*at_step_boundary=*/true);
      }
    }
    const double now = clock_->Now();
    step_start = now;
    const double elapsed = now - start;
    const double eta = elapsed / (step + 1 - start_step_) * (total_steps_ - step - 1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      eta_seconds_ = eta;
    }
    const int64_t print_every = std::max<int64_t>(1, total_steps_ / 20);
    if ((step + 1) % print_every == 0 || step == 0 || step + 1 == total_steps_) {
      LOG(INFO) << absl::StrFormat(
          "step %d/%d  loss %.4f  tau %.3f  acc@1 %.3f  %.0f tok/s  wait %.1f%%  W %d  ETA %.0fs",
          step + 1, total_steps_, r.loss, r.TauEstimate(),
          r.SlotAccuracy().empty() ? 0.0 : r.SlotAccuracy()[0],
          r.tokens / std::max(1e-9, r.step_seconds),
          100.0 * r.max_wait_seconds / std::max(1e-9, r.step_seconds), world_size_, eta);
    }
    ++step;
    if (!stop.empty()) {
      stopped = absl::StrCat(stop, ": stopped after step ", step, " of ", total_steps_,
                             " (resume with --resume)");
      break;
    }
  }
  FinishCheckpoint();  // the last checkpoint is on disk before the workers go
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (result.ok() && !failure_.ok()) result = failure_;  // e.g. that checkpoint failed
  }
  const bool finished = result.ok() && stopped.empty();
  if (finished) {
    // The export, from the last step's checkpoint: on the coordinator's disk, whichever host rank
    // 0 ran on.
    absl::Status exported = ExportFinalDrafter();
    if (!exported.ok()) result = exported;
  }
  v1::CoordinatorMessage shutdown;
  shutdown.mutable_shutdown()->set_reason(!result.ok() ? std::string(result.message())
                                          : finished   ? "job finished"
                                                       : stopped);
  shutdown.mutable_shutdown()->set_job_finished(finished);
  {
    const grpc::ByteBuffer bytes = MessageToBuffer(shutdown);
    std::lock_guard<std::mutex> lock(mu_);
    state_ = !result.ok() ? "failed" : finished ? "done" : "stopped";
    for (auto& [token, session] : sessions_) {
      session->Send(bytes);
      session->FinishAfterWrites(grpc::Status::OK);
    }
  }
  FlushEvents();  // admissions since the last epoch began
  if (finished) LOG(INFO) << "job finished: " << total_steps_ << " steps";
  if (result.ok() && !finished) LOG(WARNING) << stopped;
  return result;
}

}  // namespace flashdraft
