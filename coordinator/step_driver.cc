#include "coordinator/step_driver.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/chunk_wire.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "common/random_token.h"
#include "common/shard_tree.h"
#include "common/status_macros.h"
#include "coordinator/step_encoder.h"
#include "glog/logging.h"
#include "model/dflash_math.h"

namespace flashdraft {

StepDriver::StepDriver(StepDriverOptions options, StepDriverParts parts)
    : options_(std::move(options)),
      p_(parts),
      cadence_(options_.checkpoint_every_steps, options_.checkpoint_every_seconds,
               options_.total_steps, *parts.clock),
      step_(options_.start_step),
      sent_(options_.start_step) {}

absl::Status StepDriver::Run() {
  start_ = p_.clock->Now();
  step_start_ = start_;
  State state = State::kFinish;
  if (step_ < options_.total_steps) {
    state =
        p_.replies != nullptr && p_.feeders != nullptr ? State::kRegenerate : State::kAwaitWorkers;
  }
  while (state != State::kFinish) {
    switch (state) {
      case State::kRegenerate:
        state = Regenerate();
        break;
      case State::kAwaitWorkers:
        state = AwaitWorkers();
        break;
      case State::kFormEpoch:
        state = FormEpoch();
        break;
      case State::kStream:
        state = Stream();
        break;
      case State::kAwaitAcks:
        state = AwaitAcks();
        break;
      case State::kCommit:
        state = Commit();
        break;
      case State::kFinish:
        break;
    }
  }
  return Finish();
}

StepDriver::State StepDriver::Regenerate() {
  DeferredReplies& replies = *p_.replies;
  std::vector<v1::RegenerateWork> lines;
  for (DeferredReplies::Line& l : replies.TakePending()) {
    v1::RegenerateWork& w = lines.emplace_back();
    w.set_line(static_cast<uint64_t>(l.line_no));
    w.set_text(std::move(l.text));
    w.set_max_new_tokens(static_cast<uint32_t>(replies.max_new_tokens()));
    w.set_disable_thinking(!replies.chat_options().enable_thinking);
    w.set_system_prompt(replies.chat_options().system_prompt);
  }
  bool waited = false;
  result_ = AwaitFeeders(&waited);
  if (!result_.ok()) return State::kFinish;
  LOG(INFO) << "the feeders regenerate the replies of " << lines.size() << " line(s)";
  const double start = p_.clock->Now();
  Progress progress = Progress::ForLog("regenerating replies on the feeders",
                                       static_cast<double>(lines.size()), "lines");
  result_ = p_.feeders->Regenerate(
      lines, options_.join_timeout_seconds,
      [&replies](v1::RegeneratedLine& answer) {
        std::vector<int64_t> ids, mask;
        FD_RETURN_IF_ERROR(RegeneratedTokens(answer, ids, mask));
        return replies.Complete(static_cast<int64_t>(answer.line()), std::move(ids),
                                std::move(mask));
      },
      [&progress](size_t accepted) { progress.Update(static_cast<double>(accepted)); });
  if (absl::IsDeadlineExceeded(result_)) {
    result_ = absl::DeadlineExceededError(
        absl::StrCat(result_.message(), " (cluster.join_timeout_seconds)"));
  }
  if (!result_.ok()) return State::kFinish;
  progress.Finish(absl::StrFormat("in %.1f s", p_.clock->Now() - start), /*always=*/true);
  return State::kAwaitWorkers;
}

StepDriver::State StepDriver::AwaitWorkers() {
  // A new epoch at this step boundary: steps sent in the old one are sent again.
  if (sent_ > step_) p_.metrics->StepsReissued(sent_ - step_);
  if (epoch_ > 0 && ++reforms_at_step_ > options_.max_reforms_per_step) {
    result_ = absl::UnavailableError(absl::StrCat("step ", step_, " failed in ",
                                                  options_.max_reforms_per_step,
                                                  " membership epochs in a row; giving up"));
    return State::kFinish;
  }
  if (changed_at_ == 0 && epoch_ > 0) changed_at_ = p_.clock->Now();
  // Waiting lets the workers that asked to leave go, its uploader among them maybe: the
  // checkpoint in flight is in first (or given up, when its uploader is lost).
  p_.checkpoints->Wait();
  // Workers and feeders both, at once: workers lost while feeders were awaited are awaited again.
  bool waited_for_feeders = true;
  while (waited_for_feeders) {
    result_ = p_.controller->AwaitWorkers([this] { p_.board->SetState(JobState::kPaused); });
    if (result_.ok()) result_ = AwaitFeeders(&waited_for_feeders);
    if (!result_.ok()) return State::kFinish;
  }
  return State::kFormEpoch;
}

absl::Status StepDriver::AwaitFeeders(bool* waited) {
  *waited = false;
  if (p_.feeders == nullptr) return absl::OkStatus();
  // min_feeders to start (the regeneration or the first epoch), one to go on.
  const int count = feeders_started_ ? 1 : std::max(1, options_.min_feeders);
  absl::Status s = p_.feeders->AwaitLive(
      count, p_.clock->Now() + options_.join_timeout_seconds, [this, count, waited] {
        *waited = true;
        LOG(WARNING) << "paused: waiting for " << count << " feeder(s)";
        if (epoch_ > 0) p_.board->SetPaused("no feeder");
      });
  feeders_started_ = feeders_started_ || s.ok();
  return s;
}

StepDriver::State StepDriver::FormEpoch() {
  const Scheduler& scheduler = *p_.scheduler;
  const EpochStart e = p_.controller->FormEpoch(step_, [&scheduler](int world_size) {
    return ShardOffsets(scheduler.num_shards(world_size), world_size);
  });
  // The last epoch's group is abandoned: its rendezvous keys go.
  if (epoch_ > 0) p_.store->DeletePrefix(absl::StrCat("epoch/", epoch_, "/"));
  epoch_ = e.epoch;
  world_size_ = e.world_size;
  p_.board->SetState(JobState::kTraining);
  LOG(INFO) << "membership epoch " << e.epoch << ": " << world_size_ << " worker(s) ["
            << absl::StrJoin(e.worker_ids, ", ") << "] from step " << step_
            << (e.needs_state_sync ? " (newcomers receive the state from rank 0)" : "");
  FlushEvents();  // the admissions' numerics first
  p_.step_log->WriteEvent({{"event", "membership"},
                           {"membership_epoch", e.epoch},
                           {"world_size", world_size_},
                           {"workers", e.worker_ids},
                           {"changes", e.changes},
                           {"next_step", step_},
                           {"unix_time", UnixSeconds()}});
  sent_ = step_;
  next_plan_.reset();
  step_start_ = p_.clock->Now();
  return State::kStream;
}

StepDriver::State StepDriver::Stream() {
  // Keep `prefetch` steps queued at every worker so none waits on the source.
  const int64_t prefetch = std::max(1, options_.prefetch_steps);
  const int64_t total = options_.total_steps;
  while (sent_ < total && sent_ <= step_ + prefetch) {
    const StepPlan plan = next_plan_ && static_cast<int64_t>(next_plan_->step) == sent_
                              ? std::move(*next_plan_)
                              : p_.scheduler->Plan(static_cast<uint64_t>(sent_), world_size_);
    next_plan_.reset();
    result_ = SendStep(plan);
    ++sent_;
    if (absl::IsUnavailable(result_) && p_.feeders != nullptr) {
      // The last feeder went while the step was sent: the job pauses until one returns, and the
      // next epoch sends every step in flight again.
      p_.controller->RequestReform(std::string(result_.message()));
      result_ = absl::OkStatus();
      return State::kAwaitWorkers;
    }
    if (!result_.ok()) return State::kFinish;
    // The source may start on the step after the ones queued (an online target does; with
    // feeders the coordinator computes nothing).
    if (sent_ < total && p_.feeders == nullptr) {
      next_plan_ = p_.scheduler->Plan(static_cast<uint64_t>(sent_), world_size_);
      std::vector<uint64_t> next;
      for (const MicrobatchPlan& mb : next_plan_->shards) {
        next.insert(next.end(), mb.samples.begin(), mb.samples.end());
      }
      p_.source->Prefetch(next);
    }
  }
  return State::kAwaitAcks;
}

absl::Status StepDriver::SendStep(const StepPlan& plan) {
  ShardAddress to;
  to.membership_epoch = epoch_;
  to.world_size = world_size_;
  to.learning_rate = LearningRateAt(options_.learning_rate, static_cast<int64_t>(plan.step));
  to.teacher = options_.send_teacher;
  for (to.rank = 0; to.rank < world_size_; ++to.rank) {
    for (int64_t shard = plan.shard_offsets[to.rank]; shard < plan.shard_offsets[to.rank + 1];
         ++shard) {
      if (p_.feeders != nullptr) {
        FD_RETURN_IF_ERROR(SendShardByFeeder(plan, shard, to));
        continue;
      }
      std::vector<grpc::ByteBuffer> messages;
      absl::Status s = EncodeShard(plan, shard, to, *p_.source, *p_.scheduler, &messages);
      if (!s.ok()) return s;
      p_.metrics->AddStreamBytes(p_.controller->SendToRank(to.rank, std::move(messages)));
    }
  }
  return absl::OkStatus();
}

absl::Status StepDriver::SendShardByFeeder(const StepPlan& plan, int64_t shard,
                                           const ShardAddress& to) {
  FD_ASSIGN_OR_RETURN(v1::ShardWork work,
                      MakeShardWork(plan, shard, to, *p_.source, *p_.scheduler, RandomToken()));
  const std::optional<std::string> feeder = p_.feeders->Assign(work);
  if (!feeder) return absl::UnavailableError("no feeder is left");
  v1::CoordinatorMessage m;
  v1::ShardRef* ref = m.mutable_shard_ref();
  ref->set_feeder_address(*feeder);
  ref->set_ticket(work.ticket());
  ref->set_step(plan.step);
  ref->set_shard(static_cast<uint32_t>(shard));
  ref->set_membership_epoch(to.membership_epoch);
  std::vector<grpc::ByteBuffer> messages;
  messages.push_back(MessageToBuffer(m));
  p_.metrics->AddStreamBytes(p_.controller->SendToRank(to.rank, std::move(messages)));
  return absl::OkStatus();
}

StepDriver::State StepDriver::AwaitAcks() {
  result_ = p_.controller->AwaitAcks(static_cast<uint64_t>(step_));
  if (absl::IsAborted(result_)) {
    LOG(WARNING) << result_.message() << "; re-forming the group";
    result_ = absl::OkStatus();
    return State::kAwaitWorkers;
  }
  return result_.ok() ? State::kCommit : State::kFinish;
}

StepDriver::State StepDriver::Commit() {
  const std::string stop = p_.controller->stop_requested();
  const uint64_t completed = static_cast<uint64_t>(step_ + 1);
  const bool checkpoint =
      !stop.empty() || cadence_.Due(step_) || p_.checkpoints->EvalDue(completed);
  // One checkpoint at a time: the previous one is in before this commit asks for the next.
  if (checkpoint) p_.checkpoints->Wait();
  CommittedStep committed = p_.controller->Commit(static_cast<uint64_t>(step_), checkpoint);
  reforms_at_step_ = 0;
  if (!committed.record.ok()) {
    result_ = committed.record.status();
    return State::kFinish;
  }
  Record(*committed.record);
  if (p_.feeders != nullptr) p_.feeders->Release(completed);
  if (checkpoint) {
    // Written on the pipeline's thread: training goes on while rank 0 uploads and the files are
    // fsynced.
    p_.checkpoints->Start(completed);
    cadence_.Taken();
  }
  if (p_.controller->AnyLeaving()) {
    // Workers leave at this boundary, once a checkpoint their upload may be part of is in.
    p_.checkpoints->Wait();
    p_.controller->ReleaseLeaving();
  }
  Report(*committed.record);
  ++step_;
  // A stop asked for during the last step changes nothing: the job is done (and exported).
  if (!stop.empty() && step_ < options_.total_steps) {
    stopped_ = absl::StrCat(stop, ": stopped after step ", step_, " of ", options_.total_steps,
                            " (resume with --resume)");
    return State::kFinish;
  }
  if (step_ >= options_.total_steps) return State::kFinish;
  return p_.controller->Changed() ? State::kAwaitWorkers : State::kStream;
}

void StepDriver::Record(StepRecord& r) {
  r.step_seconds = p_.clock->Now() - step_start_;
  r.learning_rate = LearningRateAt(options_.learning_rate, step_);
  r.distilled = options_.send_teacher;
  // The record first: a crash while checkpointing must not lose the step from steps.jsonl.
  p_.step_log->Write(r);
  p_.metrics->RecordStep(r);
  if (changed_at_ > 0) {
    const double recovery = p_.clock->Now() - changed_at_;
    p_.metrics->RecordRecovery(recovery);
    p_.step_log->WriteEvent({{"event", "recovered"},
                             {"membership_epoch", epoch_},
                             {"committed_step", step_},
                             {"recovery_seconds", recovery},
                             {"unix_time", UnixSeconds()}});
    changed_at_ = 0;
  }
}

void StepDriver::Report(const StepRecord& r) {
  const double now = p_.clock->Now();
  step_start_ = now;
  const int64_t total = options_.total_steps;
  const double eta = (now - start_) / (step_ + 1 - options_.start_step) * (total - step_ - 1);
  p_.board->Committed(r, eta);
  const int64_t print_every = std::max<int64_t>(1, total / 20);
  if ((step_ + 1) % print_every == 0 || step_ == 0 || step_ + 1 == total) {
    LOG(INFO) << absl::StrFormat(
        "step %d/%d  loss %.4f  tau %.3f  acc@1 %.3f  %.0f tok/s  wait %.1f%%  W %d  ETA %.0fs",
        step_ + 1, total, r.loss, r.TauEstimate(),
        r.SlotAccuracy().empty() ? 0.0 : r.SlotAccuracy()[0],
        r.tokens / std::max(1e-9, r.step_seconds),
        100.0 * r.max_wait_seconds / std::max(1e-9, r.step_seconds), world_size_, eta);
  }
}

absl::Status StepDriver::Finish() {
  // A failed job gives up the checkpoint in flight; the driver's own end (a step that kept
  // failing, a source error) still lets it in: it is the step a resumed job starts from.
  if (absl::Status failure = p_.controller->failure(); !failure.ok()) {
    p_.checkpoints->Cancel(failure);
  }
  p_.checkpoints->Wait();  // the last checkpoint is on disk before the workers go
  if (absl::Status failure = p_.controller->failure(); result_.ok() && !failure.ok()) {
    result_ = failure;  // e.g. that checkpoint failed
  }
  const bool finished = result_.ok() && stopped_.empty();
  if (result_.ok()) p_.checkpoints->DrainEvaluations();
  // The export, from the last step's checkpoint: on the coordinator's disk, whichever host rank 0
  // ran on.
  if (finished && !options_.export_dir.empty()) {
    result_ = p_.checkpoints->ExportFinal(options_.total_steps, options_.export_dir);
  }
  if (finished && result_.ok() && !options_.export_best_dir.empty()) {
    // Beside the final drafter; a job none of whose evaluations succeeded has none, and says so.
    if (absl::Status s = p_.checkpoints->ExportBest(options_.export_best_dir);
        absl::IsNotFound(s)) {
      LOG(WARNING) << "checkpoint.keep_best: " << s.message();
    } else {
      result_ = s;
    }
  }
  v1::CoordinatorMessage shutdown;
  shutdown.mutable_shutdown()->set_reason(!result_.ok() ? std::string(result_.message())
                                          : finished    ? "job finished"
                                                        : stopped_);
  shutdown.mutable_shutdown()->set_job_finished(finished);
  p_.board->SetState(!result_.ok() ? JobState::kFailed
                     : finished    ? JobState::kDone
                                   : JobState::kStopped);
  p_.controller->Finish(MessageToBuffer(shutdown));
  if (p_.feeders != nullptr) p_.feeders->Finish(shutdown.shutdown().reason());
  FlushEvents();  // admissions since the last epoch began
  if (finished && result_.ok()) LOG(INFO) << "job finished: " << options_.total_steps << " steps";
  if (result_.ok() && !finished) LOG(WARNING) << stopped_;
  return result_;
}

void StepDriver::FlushEvents() {
  for (const nlohmann::json& e : p_.controller->TakeEvents()) p_.step_log->WriteEvent(e);
}

}  // namespace flashdraft
