#include "worker/worker_session.h"

#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/cuda_util.h"
#include "common/shard_tree.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "model/precision.h"
#include "worker/training_state.h"

namespace flashdraft {
namespace {

// The shard layout a step's first Microbatch announces must be the job's: K virtual shards
// (train.virtual_shards) with the deterministic reduction, one shard per rank without it, laid out
// over the ranks as the scheduler lays them (ShardOffsets).
absl::Status CheckShardLayout(const v1::Microbatch& h, const std::vector<int64_t>& offsets,
                              int rank, int world, int64_t virtual_shards) {
  const int64_t want = virtual_shards > 0 ? virtual_shards : world;
  if (h.num_shards() != want || offsets != ShardOffsets(want, world) ||
      h.rank() != static_cast<uint32_t>(rank) || h.world_size() != static_cast<uint32_t>(world) ||
      h.shard() != static_cast<uint32_t>(offsets[rank])) {
    return absl::DataLossError(absl::StrCat(
        "step ", h.step(), ": the coordinator's shard layout (shard ", h.shard(), " of ",
        h.num_shards(), ", offsets [", absl::StrJoin(offsets, ", "), "], rank ", h.rank(), "/",
        h.world_size(), ") is not this job's (", want, " shards, rank ", rank, "/", world, ")"));
  }
  return absl::OkStatus();
}

// A microbatch's tensor `name`; DATA_LOSS naming it (and what came) when the coordinator did not
// send it.
absl::StatusOr<torch::Tensor> ShardTensor(const InboxItem& item, const std::string& name) {
  auto it = item.tensors.find(name);
  if (it != item.tensors.end() && it->second.defined()) return it->second;
  std::vector<std::string> sent;
  for (const auto& [n, t] : item.tensors) sent.push_back(n);
  return absl::DataLossError(absl::StrCat("step ", item.header.step(), " shard ",
                                          item.header.shard(), ": the coordinator sent no '", name,
                                          "' tensor (it sent [", absl::StrJoin(sent, ", "), "])"));
}

// A microbatch as the drafter takes it, on `device` (from pinned memory, queued on the default
// stream when it is a GPU); with `teacher`, the target's final hidden state too.
absl::StatusOr<DrafterBatch> ShardBatch(const InboxItem& item, const torch::Device& device,
                                        bool teacher) {
  DrafterBatch batch;
  FD_ASSIGN_OR_RETURN(batch.input_ids, ShardTensor(item, "input_ids"));
  FD_ASSIGN_OR_RETURN(batch.loss_mask, ShardTensor(item, "loss_mask"));
  FD_ASSIGN_OR_RETURN(batch.hidden_states, ShardTensor(item, "hidden_states"));
  FD_ASSIGN_OR_RETURN(batch.anchors, ShardTensor(item, "anchors"));
  if (teacher) {
    FD_ASSIGN_OR_RETURN(batch.teacher_hidden, ShardTensor(item, "teacher_hidden"));
  }
  if (!device.is_cpu()) {
    for (torch::Tensor* t : {&batch.input_ids, &batch.loss_mask, &batch.hidden_states,
                             &batch.anchors, &batch.teacher_hidden}) {
      if (t->defined()) *t = t->to(device, /*non_blocking=*/true);
    }
  }
  return batch;
}

// A shard without samples (a rank's part of a small step): nothing to compute.
bool NoSamples(const DrafterBatch& batch) {
  return batch.input_ids.dim() > 0 && batch.input_ids.size(0) == 0;
}

void SetShardResult(const DrafterLossResult& r, v1::ShardResult& out) {
  out.set_weighted_loss_sum(r.weighted_ce_sum);
  out.set_weighted_kl_sum(r.weighted_kl_sum);
  out.set_weight_sum(r.weight_sum);
  out.set_tokens(r.tokens);
  for (size_t k = 0; k < r.slot_total.size() && k < static_cast<size_t>(out.slot_total_size());
       ++k) {
    out.set_slot_correct(static_cast<int>(k), r.slot_correct[k]);
    out.set_slot_total(static_cast<int>(k), r.slot_total[k]);
  }
}

void ExitStuck() {
  LOG(ERROR) << "exiting (code 3) so that a supervisor starts this worker again";
  google::FlushLogFiles(google::GLOG_INFO);
  _exit(3);
}

}  // namespace

OptimizerOptions OptimizerOptionsOf(const JobConfig& job) {
  OptimizerOptions opt;
  opt.learning_rate = job.train.learning_rate;
  opt.beta1 = job.train.adam_beta1;
  opt.beta2 = job.train.adam_beta2;
  opt.eps = job.train.adam_eps;
  opt.weight_decay = job.train.weight_decay;
  opt.grad_clip_norm = job.train.grad_clip_norm;
  return opt;
}

WorkerSession::WorkerSession(SessionSetup setup, SessionHooks hooks)
    : setup_(std::move(setup)),
      clock_(hooks.clock != nullptr ? *hooks.clock : RealClock::Get()),
      hooks_(std::move(hooks)),
      drafter_(setup_.drafter_config),
      trainer_(drafter_, OptimizerOptionsOf(setup_.job)),
      uploader_([this](v1::WorkerMessage& m) { return Write(m); }, setup_.fault) {
  const JobConfig& job = setup_.job;
  params_ = drafter_->parameters();
  reduction_.bucket_bytes = static_cast<size_t>(job.cluster.allreduce_bucket_mib * (1 << 20));
  reduction_.ordered = job.train.deterministic_reduction;
  virtual_shards_ = EffectiveVirtualShards(job);
  gamma_ = EffectiveLossDecayGamma(job);
  ce_weight_ = LossCeWeight(job.train);
  if (!hooks_.on_stuck) hooks_.on_stuck = ExitStuck;
}

namespace {

// worker.device as a LibTorch device; errors say why it cannot be used here.
absl::StatusOr<torch::Device> WorkerDevice(const JobConfig& job, int cuda_device) {
  if (job.worker.device == "cpu") return torch::Device(torch::kCPU);
  if (!torch::cuda::is_available()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker.device is cuda, but this worker's LibTorch ",
        torch::cuda::device_count() == 0 && !at::hasCUDA()
            ? "was built without CUDA (Debian's libtorch is CPU-only: build against a CUDA "
              "LibTorch, scripts/gpu-check.sh shows how)"
            : "sees no CUDA device"));
  }
  if (cuda_device < 0 || cuda_device >= static_cast<int>(torch::cuda::device_count())) {
    return absl::FailedPreconditionError(absl::StrCat("worker.device cuda:", cuda_device,
                                                      " does not exist (",
                                                      torch::cuda::device_count(), " visible)"));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(cuda_device));
}

// The job's collective: cluster.backend with its timeout, on cluster.collective_interface or else
// the setup's address; NCCL on the setup's GPU.
absl::StatusOr<CollectiveFactory> JobCollectiveFactory(const SessionSetup& setup,
                                                       const Clock* clock) {
  const JobConfig& job = setup.job;
  CollectiveFactoryOptions o;
  o.backend = job.cluster.backend;
  o.timeout = std::chrono::milliseconds(
      static_cast<int64_t>(job.cluster.collective_timeout_seconds * 1000));
  o.interface = job.cluster.collective_interface;
  o.address = setup.collective_address;
  o.cuda_device = setup.cuda_device;
  if (clock != nullptr) o.clock = clock;
  return MakeCollectiveFactory(o);
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerSession>> WorkerSession::Create(SessionSetup setup,
                                                                     SessionHooks hooks) {
  FD_ASSIGN_OR_RETURN(torch::Device device, WorkerDevice(setup.job, setup.cuda_device));
  if (!hooks.collective_factory) {
    FD_ASSIGN_OR_RETURN(hooks.collective_factory, JobCollectiveFactory(setup, hooks.clock));
  }
  const torch::ScalarType compute = ComputeDtypeFromName(setup.job.train.precision);
  if (compute == torch::ScalarType::Undefined) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.precision '", setup.job.train.precision, "' is not fp32 or bf16"));
  }
  std::unique_ptr<WorkerSession> session(new WorkerSession(std::move(setup), std::move(hooks)));
  session->device_ = device;
  // Parameters keep their identity when moved (the optimizer holds them); its state is created
  // on their device.
  session->drafter_->MoveTo(device);
  session->drafter_->SetComputeDtype(compute);
  if (!device.is_cpu()) session->inbox_.PinReceiveBuffers();
  session->inbox_.ReportTo(session->hooks_.metrics);
  session->inbox_.FetchShardsWith(session->hooks_.shard_fetcher);
  auto& fetched = session->setup_.fetched;
  FD_RETURN_IF_ERROR(LoadFetchedModel(*session->drafter_, fetched));
  FD_RETURN_IF_ERROR(
      LoadOptimizerState(*session->drafter_, fetched, session->trainer_.optimizer()));
  fetched.clear();
  return session;
}

// Run joins its threads; a session that never ran has none. The uploader waits for its own.
WorkerSession::~WorkerSession() = default;

bool WorkerSession::Write(v1::WorkerMessage& message) {
  message.set_worker_id(setup_.worker_id);
  message.set_session_token(setup_.session_token);
  return link_->Write(message);
}

InboxItem WorkerSession::Next() {
  if (deferred_.empty()) return inbox_.Pop();
  InboxItem item = std::move(deferred_.front());
  deferred_.pop_front();
  return item;
}

void WorkerSession::End(absl::Status status) {
  if (!end_) end_ = std::move(status);
}

void WorkerSession::Shutdown(const InboxItem& item) {
  LOG(INFO) << "shutdown: " << item.text;
  job_finished_ = item.job_finished;
  End(absl::OkStatus());
}

bool WorkerSession::EndsSession(const InboxItem& item) {
  if (item.kind == InboxItem::kShutdown) {
    Shutdown(item);
    return true;
  }
  if (item.kind == InboxItem::kError) {
    End(absl::UnavailableError(item.text));
    return true;
  }
  return false;
}

// The old group is never destroyed: it may be stuck in a collective with a vanished peer, and its
// threads give up by themselves at the collective timeout.
// NCCL's is aborted instead (ncclCommAbort ends its kernels at once).
void WorkerSession::LeaveGroup() {
  trainer_.DiscardGradients();
  reducer_.reset();
  if (collective_ && collective_->AbortsWhenDestroyed()) {
    collective_.reset();
  } else {
    (void)collective_.release();
  }
}

void WorkerSession::ReportCollectiveFailure(uint64_t step, const absl::Status& why) {
  LOG(WARNING) << "epoch " << epoch_ << " step " << step << ": " << why.message()
               << "; waiting for the coordinator to re-form the group";
  v1::WorkerMessage m;
  v1::CollectiveFailure* f = m.mutable_collective_failure();
  f->set_step(step);
  f->set_membership_epoch(epoch_);
  f->set_error(std::string(why.message()));
  Write(m);
  broken_ = true;
  if (hooks_.metrics) hooks_.metrics->CollectiveError();
}

absl::Status WorkerSession::JoinGroup(const v1::Reform& r) {
  progress_.Enter("reform", r.next_step(), /*is_busy=*/false);
  LeaveGroup();
  epoch_ = r.membership_epoch();
  rank_ = static_cast<int>(r.rank());
  world_ = static_cast<int>(r.world_size());
  broken_ = false;
  const double start = clock_.Now();
  const AbortCheck superseded = [this] { return Superseded(); };
  // Each epoch's group forms under the prefix its Reform names.
  auto store = c10::make_intrusive<c10d::PrefixStore>(r.store_prefix(), setup_.store);
  FD_ASSIGN_OR_RETURN(collective_, hooks_.collective_factory(store, rank_, world_, superseded));
  reducer_ = std::make_unique<GradientReducer>(params_, collective_.get(), reduction_);
  FD_RETURN_IF_ERROR(
      SyncTrainingState(*drafter_, trainer_.optimizer(), *collective_, r.sync_state(), superseded));
  if (hooks_.metrics) hooks_.metrics->SetMembership(rank_, epoch_);
  LOG(INFO) << absl::StrFormat(
      "membership epoch %d: rank %d of %d from step %d%s (group formed in %.2f s)", epoch_, rank_,
      world_, r.next_step(), r.sync_state() ? ", state synchronized from rank 0" : "",
      clock_.Now() - start);
  return absl::OkStatus();
}

void WorkerSession::HandleReform(const v1::Reform& r) {
  absl::Status s = JoinGroup(r);
  if (s.ok() || absl::IsAborted(s)) return;  // aborted: the newer Reform is queued
  if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
    ReportCollectiveFailure(r.next_step(), s);
    return;
  }
  End(s);
}

void WorkerSession::TrainStep(InboxItem item, double wait) {
  StepWork work;
  work.wait = wait;
  if (absl::Status s = BeginStep(item.header, work); !s.ok()) return End(s);
  const int64_t begin = work.offsets[rank_], end = work.offsets[rank_ + 1];
  for (int64_t shard = begin; shard < end; ++shard) {
    if (shard > begin && !NextShard(work, item)) return;
    if (absl::Status s = ComputeShard(item, shard, work); !s.ok()) return End(s);
  }
  if (!ReduceGradients(work)) return;
  RecordStep(work);
  if (SendAck(work)) AwaitCommit(work.first);
}

absl::Status WorkerSession::BeginStep(const v1::Microbatch& first, StepWork& work) {
  work.first = first;
  work.offsets.assign(first.shard_offsets().begin(), first.shard_offsets().end());
  FD_RETURN_IF_ERROR(CheckShardLayout(first, work.offsets, rank_, world_, virtual_shards_));
  if (reduction_.ordered) FD_RETURN_IF_ERROR(reducer_->BeginStep(first.num_shards(), work.offsets));
  last_step_ = first.step();
  work.ack.set_step(first.step());
  work.ack.set_membership_epoch(first.membership_epoch());
  return absl::OkStatus();
}

bool WorkerSession::NextShard(StepWork& work, InboxItem& item) {
  const double wait_start = clock_.Now();
  item = Next();
  work.wait += clock_.Now() - wait_start;
  if (item.kind == InboxItem::kBatch) return true;
  // A Reform, Shutdown or error mid-step: the step cannot finish in this epoch. Drop it and handle
  // what interrupted it.
  trainer_.DiscardGradients();
  deferred_.push_front(std::move(item));
  return false;
}

absl::Status WorkerSession::ComputeShard(const InboxItem& item, int64_t shard, StepWork& work) {
  const v1::Microbatch& h = item.header;
  const uint64_t step = work.first.step();
  if (h.step() != step || h.shard() != shard ||
      h.membership_epoch() != work.first.membership_epoch()) {
    return absl::DataLossError(absl::StrCat("expected shard ", shard, " of step ", step,
                                            ", the coordinator sent shard ", h.shard(), " of step ",
                                            h.step()));
  }
  v1::ShardResult* out = work.ack.add_shards();
  out->set_shard(static_cast<uint32_t>(shard));
  for (int k = 1; k < setup_.job.drafter.block_size; ++k) {
    out->add_slot_correct(0);
    out->add_slot_total(0);
  }
  FD_ASSIGN_OR_RETURN(DrafterBatch batch,
                      ShardBatch(item, device_, LossNeedsTeacher(setup_.job.train)));
  // Gradients accumulate into the reducer's buckets, whose exchanges start during the last
  // shard's backward.
  reducer_->Prepare();
  if (NoSamples(batch)) return absl::OkStatus();
  try {
    double t = clock_.Now();
    progress_.Enter("forward", step, true);
    DrafterLossResult r = drafter_->Loss(batch, gamma_, h.global_weight_sum(), ce_weight_);
    work.forward += clock_.Now() - t;
    if (shard == work.offsets[rank_]) MaybeFault(setup_.fault, "forward", step, rank_, epoch_);
    t = clock_.Now();
    progress_.Enter("backward", step, true);
    r.loss.backward();
    work.backward += clock_.Now() - t;
    SetShardResult(r, *out);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("step ", step, " shard ", shard, ": forward/backward failed: ", e.what()));
  }
  return absl::OkStatus();
}

// Every rank takes part in every reduction. What is timed is the part of the exchange that
// backward did not hide.
bool WorkerSession::ReduceGradients(StepWork& work) {
  const uint64_t step = work.first.step();
  const double t = clock_.Now();
  progress_.Enter("reduce", step, false);                   // waits for its peers
  MaybeFault(setup_.fault, "reduce", step, rank_, epoch_);  // its buckets are in flight
  const absl::Status reduced = reducer_->Finish([this] { return Superseded(); });
  if (!reduced.ok()) {
    trainer_.DiscardGradients();
    if (!absl::IsAborted(reduced)) ReportCollectiveFailure(step, reduced);
    return false;
  }
  work.allreduce = clock_.Now() - t;
  return true;
}

void WorkerSession::RecordStep(StepWork& work) {
  v1::PhaseTimings* timings = work.ack.mutable_timings();
  timings->set_wait_seconds(work.wait);
  timings->set_forward_seconds(work.forward);
  timings->set_backward_seconds(work.backward);
  timings->set_allreduce_seconds(work.allreduce);
  timings->set_optimizer_seconds(last_optimizer_seconds_);  // the previous step's
  work.ack.set_collective_bytes(reducer_->bytes_sent());
  if (hooks_.metrics == nullptr) return;
  if (device_.is_cuda()) {
    if (absl::StatusOr<CudaMemory> m = CudaMemoryInfo(device_.index()); m.ok()) {
      hooks_.metrics->SetDeviceMemory(m->total_bytes - m->free_bytes, m->total_bytes);
    }
  }
  hooks_.metrics->RecordStep(
      work.first.step(),
      {timings->wait_seconds(), timings->forward_seconds(), timings->backward_seconds(),
       timings->allreduce_seconds(), timings->optimizer_seconds()},
      work.ack.collective_bytes());
}

bool WorkerSession::SendAck(StepWork& work) {
  v1::WorkerMessage m;
  *m.mutable_ack() = std::move(work.ack);
  if (Write(m)) return true;
  // The coordinator ended the stream; a Shutdown it sent before says whether that is the end (a
  // step computed while the job was stopping is simply not acked).
  while (!EndsSession(Next())) {
  }
  return false;
}

// Only the commit makes the step real (docs/ARCHITECTURE.md): until then gradients stay aside.
void WorkerSession::AwaitCommit(const v1::Microbatch& step) {
  progress_.Enter("idle", step.step(), false);
  while (true) {
    InboxItem next = inbox_.Pop();
    switch (next.kind) {
      case InboxItem::kBatch:  // the next step's, sent ahead
        deferred_.push_back(std::move(next));
        continue;
      case InboxItem::kCommit: {
        if (next.step != step.step() || next.epoch != epoch_) continue;  // of another epoch
        const double t = clock_.Now();
        progress_.Enter("optimizer", step.step(), true);
        trainer_.ApplyWithLearningRate(step.learning_rate());
        last_optimizer_seconds_ = clock_.Now() - t;
        if (next.checkpoint && rank_ == 0) {  // training goes on while a copy is sent
          uploader_.Finish();  // the previous one, before its snapshot has a second one beside it
          progress_.Enter("snapshot", step.step(), true);
          uploader_.Start(SnapshotState(*drafter_, trainer_.optimizer()), step.step() + 1, rank_,
                          epoch_);
        }
        return;
      }
      case InboxItem::kReform:
        // The step will not commit in this epoch: every member drops it (leaving the group
        // discards its gradients), and every step of older epochs with it.
        deferred_.clear();
        HandleReform(next.reform);
        return;
      case InboxItem::kShutdown:
        trainer_.DiscardGradients();
        LOG(INFO) << "shutdown before the commit of step " << step.step();
        Shutdown(next);
        return;
      case InboxItem::kError:
        End(absl::UnavailableError(next.text));
        return;
      case InboxItem::kShardLost:  // of a step sent ahead: handled after this commit
        deferred_.push_back(std::move(next));
        continue;
    }
  }
}

// The heartbeat thread: a SessionMonitor tick every 100 ms until the session ends.
void WorkerSession::Heartbeats() {
  MonitorOptions options;
  options.heartbeat_interval_seconds = setup_.job.cluster.heartbeat_interval_seconds;
  options.stall_timeout_seconds = setup_.job.cluster.stall_timeout_seconds;
  options.heartbeat_timeout_seconds = setup_.job.cluster.heartbeat_timeout_seconds;
  SessionMonitor monitor(
      clock_, options, progress_, [this](v1::WorkerMessage& m) { return Write(m); },
      hooks_.on_stuck, hooks_.metrics != nullptr ? &hooks_.metrics->health() : nullptr);
  do {
    monitor.Tick(hooks_.leave != nullptr && hooks_.leave->requested(), inbox_.stream_lost());
    if (hooks_.metrics) {  // the bytes received are counted as they arrive (SessionInbox)
      hooks_.metrics->SetQueuedMicrobatches(inbox_.queued_batches());
    }
  } while (!stop_heartbeats_.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
}

absl::Status WorkerSession::Run(CoordinatorLink& link) {
  link_ = &link;
  {
    v1::WorkerMessage hello;  // binds the stream to this session
    hello.mutable_heartbeat()->set_unix_millis(0);
    hello.mutable_heartbeat()->set_metrics_address(setup_.metrics_address);
    if (!Write(hello)) {
      link.Cancel();
      link.Finish();
      return absl::UnavailableError("the coordinator closed the Train stream");
    }
  }
  reader_ = std::thread([this] { inbox_.ReadAll(*link_); });
  heartbeat_ = std::thread([this] { Heartbeats(); });
  while (!end_) {
    progress_.Enter("idle", last_step_, /*is_busy=*/false);
    const double wait_start = clock_.Now();
    InboxItem item = Next();
    const double wait = clock_.Now() - wait_start;
    if (EndsSession(item)) break;
    if (item.kind == InboxItem::kReform) {
      HandleReform(item.reform);
      continue;
    }
    if (item.kind == InboxItem::kShardLost) {
      // The step cannot train in this epoch: the coordinator hears it as a failed step and sends
      // it again in the next (as it does when a feeder is lost).
      if (item.epoch == epoch_ && !broken_) {
        ReportCollectiveFailure(item.step, absl::UnavailableError(item.text));
      }
      continue;
    }
    // A step of another epoch, or of one whose collective failed, is dropped: the coordinator
    // sends it again in the next epoch. (So is a commit of a step this worker did not compute.)
    if (item.kind != InboxItem::kBatch || item.header.membership_epoch() != epoch_ || broken_ ||
        !reducer_) {
      continue;
    }
    TrainStep(std::move(item), wait);
  }
  const absl::Status result = *end_;
  if (!result.ok()) {
    v1::WorkerMessage m;
    m.set_error(std::string(result.message()));
    Write(m);
  }
  // Live while the session winds down (an upload may still be writing): no heartbeat thread
  // watches.
  if (hooks_.metrics) hooks_.metrics->health().Alive(HealthState::kForever, "the session's end");
  stop_heartbeats_.Notify();
  heartbeat_.join();
  if (!result.ok()) link.Cancel();
  uploader_.Finish();
  link.WritesDone();
  reader_.join();
  link.Finish();
  // A group that may be stuck with a vanished peer is left to its own threads.
  reducer_.reset();
  (void)collective_.release();
  return result;
}

}  // namespace flashdraft
