#include "coordinator/membership_controller.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/file_util.h"
#include "common/security.h"
#include "coordinator/admission.h"
#include "coordinator/scrape_targets.h"
#include "glog/logging.h"

namespace flashdraft {

MembershipController::MembershipController(ControllerOptions options,
                                           std::unique_ptr<NumericsGroup> numerics,
                                           WorkerChannels& channels, UploadSink& uploads,
                                           CoordinatorMetrics& metrics, const Clock& clock)
    : options_(std::move(options)),
      channels_(channels),
      uploads_(uploads),
      metrics_(metrics),
      clock_(clock),
      membership_(options_.membership, clock),
      numerics_(std::move(numerics)),
      ledger_(options_.block_size - 1) {}

// ---------------------------------------------------------------------------------------------
// Reactions.

std::string MembershipController::JoinRefusalLocked(const v1::JoinRequest& request,
                                                    const NumericEnv& env, v1::JoinReply* reply) {
  if (membership_.Members().empty()) numerics_->GroupEmptied();
  const NumericsDecision numerics = numerics_->Consider(env);
  if (!numerics.admit) {
    reply->set_blas_kernel(numerics.blas_kernel);
    return numerics.refusal;
  }
  absl::StatusOr<std::string> token = membership_.Admit(request.worker_id());
  if (!token.ok()) return std::string(token.status().message());
  numerics_->Commit(env, numerics);
  last_arrival_ = clock_.Now();
  reply->set_accepted(true);
  reply->set_session_token(*token);
  reply->set_job_config_yaml(options_.job_config_yaml);
  reply->set_drafter_config_json(options_.drafter_config_json);
  LOG(INFO) << "worker '" << request.worker_id() << "' (" << request.capability().hostname() << ", "
            << request.capability().device() << ") joined";
  RecordAdmittedNumericsLocked(request.worker_id(), env, numerics);
  UpdateWorkerMetricsLocked();
  NotifyLocked();
  return "";
}

void MembershipController::Join(const v1::JoinRequest& request, v1::JoinReply* reply) {
  std::string why = CapabilityRefusal(request, options_.backend, options_.drafter);
  const NumericEnv env = NumericEnvFromProto(request.capability().numerics(), options_.on_gpu);
  if (why.empty()) {
    if (absl::Status s = ValidateNumericEnv(env, "Capability.numerics"); !s.ok()) {
      why = std::string(s.message());
    }
  }
  if (why.empty()) {
    absl::MutexLock lock(&mu_);
    why = JoinRefusalLocked(request, env, reply);
  }
  if (why.empty()) return;
  reply->set_accepted(false);
  reply->set_reason(why);
  LOG(WARNING) << "refused worker '" << Untrusted(request.worker_id()) << "': " << why;
}

void MembershipController::RecordAdmittedNumericsLocked(const std::string& worker,
                                                        const NumericEnv& env,
                                                        const NumericsDecision& decision) {
  std::vector<nlohmann::json> events;
  auto event = [&](nlohmann::json fields) {
    fields["event"] = "numerics";
    fields["worker"] = worker;
    fields["unix_time"] = UnixSeconds();
    events.push_back(std::move(fields));
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
    metrics_.SetNumericsMixed(true);
    event({{"mixed", decision.mixed}, {"reproducible", false}});
  }
  // Written by the driver (TakeEvents).
  for (nlohmann::json& e : events) events_.push_back(std::move(e));
}

bool MembershipController::Valid(const std::string& token) const {
  absl::MutexLock lock(&mu_);
  return membership_.Valid(token);
}

void MembershipController::StreamOpened() {
  absl::MutexLock lock(&mu_);
  NotifyLocked();
}

absl::Status MembershipController::Bind(const std::string& token,
                                        absl::FunctionRef<void()> attach) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = membership_.Bind(token); !s.ok()) return s;
  attach();
  last_arrival_ = clock_.Now();
  UpdateWorkerMetricsLocked();
  NotifyLocked();
  return absl::OkStatus();
}

void MembershipController::Lost(const std::string& token, const std::string& why) {
  absl::MutexLock lock(&mu_);
  DropLocked(token, why);
}

void MembershipController::DropLocked(const std::string& token, const std::string& why) {
  const MemberInfo* found = membership_.Find(token);
  const std::optional<MemberInfo> member = found ? std::optional<MemberInfo>(*found) : std::nullopt;
  const std::string who = member ? absl::StrCat("'", member->worker_id, "'")
                                 : absl::StrCat("token ", token.substr(0, 6));
  const int rank = membership_.RankOf(token);
  if (membership_.Remove(token) && !over_) {
    LOG(WARNING) << "worker " << who << " (rank " << rank << " of epoch " << membership_.epoch()
                 << ") lost: " << why;
    metrics_.WorkerFailed();
    changes_.emplace_back(member->worker_id, absl::StrCat("lost: ", why));
  } else if (member && !over_) {
    LOG(INFO) << "worker " << who << " left before training: " << why;
  }
  // A worker declared lost while its stream is open (hung, cut off) is told so and never
  // counted again: its token is gone.
  channels_.Close(
      token, grpc::Status(grpc::StatusCode::ABORTED, absl::StrCat("removed from the job: ", why)));
  uploads_.WorkerGone(token);
  UpdateWorkerMetricsLocked();
  PostScrapeTargetsLocked();
  NotifyLocked();
}

void MembershipController::Heard(const std::string& token) {
  absl::MutexLock lock(&mu_);
  membership_.Heard(token);
}

void MembershipController::OnAck(const std::string& token, const v1::StepAck& ack) {
  absl::MutexLock lock(&mu_);
  membership_.Heard(token);
  // Acks of another epoch, of a step that is not in flight, or from a non-member are stale.
  if (!ledger_.Add(membership_.RankOf(token), committed_, ack)) {
    VLOG(1) << "ignored a stale ack of step " << ack.step() << " epoch " << ack.membership_epoch();
    return;
  }
  NotifyLocked();
}

void MembershipController::OnHeartbeat(const std::string& token, const v1::Heartbeat& heartbeat) {
  absl::MutexLock lock(&mu_);
  membership_.Progress(token, heartbeat.progress(),
                       heartbeat.phase().empty() ? "idle" : heartbeat.phase(), heartbeat.step(),
                       heartbeat.busy());
  if (!heartbeat.metrics_address().empty() &&
      membership_.SetMetricsAddress(token, heartbeat.metrics_address())) {
    PostScrapeTargetsLocked();
  }
  NotifyLocked();  // its deadlines moved
}

void MembershipController::OnLeave(const std::string& token, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  membership_.Heard(token);
  if (!membership_.RequestLeave(token, absl::StrCat("the worker asked to leave (", reason, ")"))
           .ok()) {
    return;
  }
  LOG(INFO) << "worker '" << membership_.Find(token)->worker_id << "' asks to leave: " << reason;
  ReleaseLeavingLocked(/*at_step_boundary=*/false);
  NotifyLocked();
}

void MembershipController::Drain(const v1::DrainRequest& request, v1::DrainReply* reply) {
  absl::MutexLock lock(&mu_);
  const bool by_rank = request.worker_case() == v1::DrainRequest::kRank;
  const std::string token = by_rank ? membership_.TokenOfRank(static_cast<int>(request.rank()))
                                    : membership_.TokenOfWorker(request.worker_id());
  // A rank of the current epoch may belong to a worker already lost (paused, before the next
  // epoch forms): it is not in the job.
  if (token.empty() || request.worker_case() == v1::DrainRequest::WORKER_NOT_SET ||
      membership_.Find(token) == nullptr) {
    reply->set_accepted(false);
    reply->set_message(by_rank ? absl::StrCat("no worker has rank ", request.rank(),
                                              " in membership epoch ", membership_.epoch(), " (",
                                              membership_.world_size(), " worker(s))")
                               : absl::StrCat("no worker '", request.worker_id(), "' in the job"));
    return;
  }
  const MemberInfo& m = *membership_.Find(token);
  (void)membership_.RequestLeave(token, "drained (flashdraft status --drain)");
  reply->set_accepted(true);
  reply->set_message(
      m.state == MemberState::kActive
          ? absl::StrCat("worker '", m.worker_id, "' (rank ", m.rank, ") leaves after step ",
                         committed_, " commits")
          : absl::StrCat("worker '", m.worker_id, "' leaves now (it was not training)"));
  LOG(INFO) << reply->message();
  ReleaseLeavingLocked(/*at_step_boundary=*/false);
  NotifyLocked();
}

void MembershipController::ReleaseLeavingLocked(bool at_step_boundary) {
  for (const std::string& token : membership_.Leaving()) {
    const MemberInfo m = *membership_.Find(token);
    if (m.state == MemberState::kActive && !at_step_boundary) continue;
    v1::CoordinatorMessage shutdown;
    shutdown.mutable_shutdown()->set_reason(m.leave_reason);
    const grpc::ByteBuffer last = MessageToBuffer(shutdown);
    channels_.Close(token, grpc::Status::OK, &last);
    membership_.Remove(token);
    uploads_.WorkerGone(token);
    changes_.emplace_back(m.worker_id, absl::StrCat("left: ", m.leave_reason));
    LOG(INFO) << "worker '" << m.worker_id << "'"
              << (m.rank >= 0 ? absl::StrCat(" (rank ", m.rank, ")") : "")
              << " left: " << m.leave_reason;
  }
  UpdateWorkerMetricsLocked();
  PostScrapeTargetsLocked();
}

void MembershipController::OnCollectiveFailure(const std::string& token,
                                               const v1::CollectiveFailure& failure) {
  absl::MutexLock lock(&mu_);
  membership_.Heard(token);
  if (failure.membership_epoch() != membership_.epoch() || membership_.RankOf(token) < 0) return;
  LOG(WARNING) << "rank " << membership_.RankOf(token) << ": collective of step " << failure.step()
               << " failed: " << failure.error();
  if (collective_failed_at_ == 0) collective_failed_at_ = clock_.Now();
  NotifyLocked();
}

void MembershipController::RequestReform(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (membership_.epoch() == 0) return;  // nothing was sent yet
  LOG(WARNING) << why << "; re-forming the group to send the steps in flight again";
  changes_.emplace_back("(feeders)", why);
  membership_.RequestReform();
  NotifyLocked();
}

void MembershipController::OnCheckpointUpload(const std::string& token,
                                              const v1::CheckpointUpload& upload) {
  Heard(token);
  absl::Status s = uploads_.Begin(token, upload);
  if (absl::IsFailedPrecondition(s)) {
    LOG(WARNING) << "ignored a checkpoint upload: " << s.message();
  } else if (!s.ok()) {
    Lost(token, absl::StrCat("failed: sent a bad checkpoint upload: ", s.message()));
  }
}

void MembershipController::OnCheckpointChunk(const std::string& token,
                                             const v1::TensorChunk& chunk) {
  Heard(token);
  // Checked and copied under the upload's own lock: heartbeats and Status go on meanwhile.
  absl::Status s = uploads_.Add(token, chunk);
  if (s.ok() || absl::IsFailedPrecondition(s)) return;  // stale chunks are dropped
  Lost(token, absl::StrCat("failed: sent a bad checkpoint upload: ", s.message()));
}

void MembershipController::RequestStop(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (membership_.epoch() == 0) {
    if (failure_.ok()) failure_ = absl::CancelledError(why);
  } else if (stop_requested_.empty()) {
    stop_requested_ = why;
    LOG(WARNING) << why << ": stopping after the step in flight, with a checkpoint";
  }
  NotifyLocked();
}

void MembershipController::Abort(absl::Status reason) {
  absl::MutexLock lock(&mu_);
  if (failure_.ok()) failure_ = std::move(reason);
  NotifyLocked();
}

absl::Status MembershipController::failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

std::string MembershipController::stop_requested() const {
  absl::MutexLock lock(&mu_);
  return stop_requested_;
}

void MembershipController::PublishScrapeTargets(std::string address,
                                                std::unique_ptr<LatestFileWriter> writer) {
  absl::MutexLock lock(&mu_);
  metrics_address_ = std::move(address);
  scrape_writer_ = std::move(writer);
  PostScrapeTargetsLocked();
}

void MembershipController::AddScrapeTargets(std::function<std::vector<ScrapeTarget>()> more) {
  absl::MutexLock lock(&mu_);
  more_scrape_targets_ = std::move(more);
}

void MembershipController::RefreshScrapeTargets() {
  absl::MutexLock lock(&mu_);
  PostScrapeTargetsLocked();
}

void MembershipController::PostScrapeTargetsLocked() {
  if (metrics_address_.empty() || !scrape_writer_) return;
  std::vector<ScrapeTarget> targets = {{metrics_address_, "coordinator", ""}};
  std::vector<MemberInfo> members = membership_.Members();
  std::sort(members.begin(), members.end(),
            [](const MemberInfo& a, const MemberInfo& b) { return a.worker_id < b.worker_id; });
  for (const MemberInfo& m : members) {
    if (!m.metrics_address.empty()) targets.push_back({m.metrics_address, "worker", m.worker_id});
  }
  if (more_scrape_targets_) {
    for (ScrapeTarget& t : more_scrape_targets_()) targets.push_back(std::move(t));
  }
  std::string json = ScrapeTargetsJson(options_.job_name, targets);
  if (json == scrape_targets_) return;
  scrape_targets_ = json;
  scrape_writer_->Post(std::move(json));  // written on the writer's thread
}

void MembershipController::UpdateWorkerMetricsLocked() {
  metrics_.SetWorkers(
      membership_.Count(MemberState::kActive),
      membership_.Count(MemberState::kReady) + membership_.Count(MemberState::kJoined),
      membership_.epoch());
}

void MembershipController::FillWorkers(const std::vector<double>& rank_compute_seconds,
                                       v1::StatusReply* reply) const {
  absl::MutexLock lock(&mu_);
  reply->set_membership_epoch(membership_.epoch());
  reply->set_world_size(static_cast<uint32_t>(membership_.world_size()));
  const double now = clock_.Now();
  for (const MemberInfo& m : membership_.Members()) {
    v1::WorkerStatus* w = reply->add_workers();
    w->set_worker_id(m.worker_id);
    w->set_state(MemberStateName(m.state));
    w->set_rank(m.rank);
    w->set_seconds_since_heard(now - m.last_heard);
    w->set_phase(m.phase);
    w->set_step(m.step);
    w->set_leaving(!m.leave_reason.empty());
    w->set_metrics_address(m.metrics_address);
    if (m.rank >= 0 && static_cast<size_t>(m.rank) < rank_compute_seconds.size()) {
      w->set_step_seconds(rank_compute_seconds[m.rank]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The step driver's waits and steps.

struct MembershipController::Wake {
  const uint64_t* version;
  uint64_t seen;
  static bool Changed(Wake* w) { return *w->version != w->seen; }
};

double MembershipController::ExpireLocked() {
  for (const Expiry& expired : membership_.Expired()) DropLocked(expired.token, expired.why);
  unbound_expiry_ =
      channels_.CloseUnbound(clock_.Now(), options_.membership.heartbeat_timeout_seconds);
  return std::min(membership_.NextExpiry(), unbound_expiry_);
}

void MembershipController::WaitForChangeLocked(double deadline) {
  // Deadlines are due at exactly their moment (ExpireLocked drops everyone due by now), so the
  // next expiry is in the future; a caller's deadline already reached ends the wait at once.
  const double until = std::min(deadline, ExpireLocked());
  if (until <= clock_.Now()) return;
  Wake wake{&version_, version_};
  clock_.AwaitUntil(mu_, absl::Condition(&Wake::Changed, &wake), until);
  ExpireLocked();
}

bool MembershipController::ReadyForEpochLocked(double* settle_deadline) const {
  *settle_deadline = std::numeric_limits<double>::infinity();
  const int available = membership_.Available();
  if (available < options_.membership.min_workers) return false;
  // The first epoch waits for every worker on its way (joined, or joining shortly after another)
  // up to max_workers, so that a job launched with N workers starts with N.
  if (membership_.epoch() > 0 || available >= options_.membership.max_workers) return true;
  if (membership_.Count(MemberState::kJoined) > 0) return false;
  *settle_deadline = last_arrival_ + options_.start_settle_seconds;
  return clock_.Now() >= *settle_deadline;
}

absl::Status MembershipController::AwaitWorkers(absl::FunctionRef<void()> paused) {
  absl::MutexLock lock(&mu_);
  const double give_up = clock_.Now() + options_.join_timeout_seconds;
  const int min_workers = options_.membership.min_workers;
  bool said = false;
  while (failure_.ok()) {
    ReleaseLeavingLocked(/*at_step_boundary=*/true);  // nobody trains while waiting
    double settle = 0;
    if (ReadyForEpochLocked(&settle)) {
      metrics_.SetMissingWorkers(0);
      return absl::OkStatus();
    }
    if (!stop_requested_.empty()) {
      failure_ = absl::CancelledError(
          absl::StrCat(stop_requested_,
                       " while paused: no worker to checkpoint from; the last checkpoint "
                       "stands"));
      break;
    }
    const int missing = std::max(0, min_workers - membership_.Available());
    if (membership_.epoch() > 0) paused();
    metrics_.SetMissingWorkers(missing);
    if (!said && missing > 0) {
      LOG(WARNING) << (membership_.epoch() > 0 ? "paused: " : "") << "waiting for " << missing
                   << " more worker(s) (cluster.min_workers " << min_workers << ", up to "
                   << options_.join_timeout_seconds << " s)";
      said = true;
    }
    if (clock_.Now() >= give_up) {
      failure_ = absl::DeadlineExceededError(absl::StrCat(
          "only ", membership_.Available(), " of cluster.min_workers ", min_workers,
          " workers within cluster.join_timeout_seconds ", options_.join_timeout_seconds, " s"));
      break;
    }
    WaitForChangeLocked(std::min(give_up, settle));
  }
  return failure_;
}

void MembershipController::SendReformsLocked(const EpochPlan& plan, int64_t next_step,
                                             EpochStart* start) {
  for (size_t r = 0; r < plan.tokens.size(); ++r) {
    v1::CoordinatorMessage message;
    v1::Reform* reform = message.mutable_reform();
    reform->set_membership_epoch(plan.epoch);
    reform->set_rank(static_cast<uint32_t>(r));
    reform->set_world_size(static_cast<uint32_t>(plan.tokens.size()));
    reform->set_store_prefix(absl::StrCat("epoch/", plan.epoch));
    reform->set_next_step(static_cast<uint64_t>(next_step));
    reform->set_sync_state(plan.needs_state_sync);
    channels_.Send(plan.tokens[r], MessageToBuffer(message));
    start->worker_ids.push_back(membership_.Find(plan.tokens[r])->worker_id);
  }
}

EpochStart MembershipController::FormEpoch(
    int64_t next_step, const std::function<std::vector<int64_t>(int world_size)>& shard_offsets) {
  absl::MutexLock lock(&mu_);
  const std::vector<std::string> before = membership_.ranks();
  const EpochPlan plan = membership_.NextEpoch();
  EpochStart start;
  start.epoch = plan.epoch;
  start.world_size = static_cast<int>(plan.tokens.size());
  start.needs_state_sync = plan.needs_state_sync;
  ledger_.Reset(plan.epoch, start.world_size, shard_offsets(start.world_size));
  collective_failed_at_ = 0;
  SendReformsLocked(plan, next_step, &start);
  for (size_t r = 0; r < plan.tokens.size(); ++r) {
    if (plan.epoch > 1 && std::find(before.begin(), before.end(), plan.tokens[r]) == before.end()) {
      changes_.emplace_back(start.worker_ids[r], "joined");
    }
  }
  start.changes = nlohmann::json::array();
  for (const auto& [worker, why] : changes_) {
    start.changes.push_back({{"worker", worker}, {"why", why}});
  }
  changes_.clear();
  UpdateWorkerMetricsLocked();
  return start;
}

bool MembershipController::Changed() const {
  absl::MutexLock lock(&mu_);
  return membership_.Changed();
}

uint64_t MembershipController::SendToRank(int rank, std::vector<grpc::ByteBuffer> messages) {
  absl::MutexLock lock(&mu_);
  // A member lost meanwhile gets nothing; AwaitAcks sees the change.
  if (rank >= membership_.world_size()) return 0;
  const std::string& token = membership_.ranks()[rank];
  uint64_t bytes = 0;
  for (grpc::ByteBuffer& message : messages) {
    const uint64_t length = message.Length();
    if (!channels_.Send(token, std::move(message))) return bytes;
    bytes += length;
  }
  return bytes;
}

absl::Status MembershipController::AwaitAcks(uint64_t step) {
  absl::MutexLock lock(&mu_);
  ExpireLocked();
  while (failure_.ok()) {
    if (membership_.Changed()) {
      return absl::AbortedError(
          absl::StrCat("the membership changed before step ", step, " committed"));
    }
    if (ledger_.Complete(step)) return absl::OkStatus();
    double deadline = std::numeric_limits<double>::infinity();
    if (collective_failed_at_ > 0) {
      // A failed collective that no loss explains within the grace: re-form with the same members.
      deadline = collective_failed_at_ + options_.collective_failure_grace_seconds;
      if (clock_.Now() >= deadline) {
        membership_.RequestReform();
        return absl::AbortedError(absl::StrCat("a collective of step ", step, " failed"));
      }
    }
    WaitForChangeLocked(deadline);
  }
  return failure_;
}

CommittedStep MembershipController::Commit(uint64_t step, bool checkpoint) {
  absl::MutexLock lock(&mu_);
  CommittedStep out;
  v1::CoordinatorMessage commit;
  commit.mutable_commit()->set_step(step);
  commit.mutable_commit()->set_membership_epoch(membership_.epoch());
  commit.mutable_commit()->set_checkpoint(checkpoint);
  if (checkpoint) {
    out.uploader = membership_.ranks()[0];  // the epoch's rank 0 uploads the state after it
    uploads_.Expect(out.uploader, step + 1);
    // Lost after its ack (its token stays in the epoch's ranks until the next one forms): the
    // upload cannot come, and the sink's earlier notice was about the previous checkpoint.
    if (!membership_.Valid(out.uploader)) uploads_.WorkerGone(out.uploader);
  }
  const grpc::ByteBuffer bytes = MessageToBuffer(commit);
  for (const std::string& token : membership_.ranks()) channels_.Send(token, bytes);
  membership_.Committed();
  committed_ = step + 1;
  out.record = ledger_.Take(step);
  if (out.record.ok()) {
    out.record->membership_epoch = membership_.epoch();
    out.record->numerics_mixed = numerics_->mixed();
  }
  return out;
}

bool MembershipController::AnyLeaving() const {
  absl::MutexLock lock(&mu_);
  return !membership_.Leaving().empty();
}

void MembershipController::ReleaseLeaving() {
  absl::MutexLock lock(&mu_);
  ReleaseLeavingLocked(/*at_step_boundary=*/true);
  NotifyLocked();
}

std::vector<nlohmann::json> MembershipController::TakeEvents() {
  absl::MutexLock lock(&mu_);
  std::vector<nlohmann::json> events;
  events.swap(events_);
  return events;
}

std::string MembershipController::NumericsRecord(const NumericEnv& coordinator,
                                                 const std::string& precision,
                                                 int intra_op_threads) const {
  absl::MutexLock lock(&mu_);
  return RecordNumerics(numerics_->group(), coordinator, numerics_->mixed(), precision,
                        intra_op_threads);
}

void MembershipController::Finish(const grpc::ByteBuffer& shutdown) {
  absl::MutexLock lock(&mu_);
  over_ = true;
  channels_.CloseAll(grpc::Status::OK, &shutdown);
  NotifyLocked();
}

}  // namespace flashdraft
