#include "coordinator/metrics.h"

#include "absl/strings/str_cat.h"
#include "coordinator/step_log.h"

namespace flashdraft {

CoordinatorMetrics::CoordinatorMetrics(
    const std::string& backend, int64_t total_steps, int block_size, const std::string& security,
    const std::vector<std::pair<std::string, std::string>>& numerics)
    : exporter_({{"backend", backend}, {"security", security}}, numerics) {
  step_ = &exporter_.Gauge("flashdraft_step", "Committed training steps");
  numerics_mixed_ = &exporter_.Gauge(
      "flashdraft_numerics_mixed",
      "1 when workers of different numeric environments trained this job (cluster.mixed_numerics: "
      "admit): its numbers are not reproducible to the bit");
  exporter_.Gauge("flashdraft_steps", "Training steps of the job")
      .Set(static_cast<double>(total_steps));
  loss_ = &exporter_.Gauge("flashdraft_loss",
                           "Loss of the last committed step (the global batch's weighted CE)");
  kl_ =
      &exporter_.Gauge("flashdraft_kl",
                       "Distillation loss of the last committed step (the global batch's weighted "
                       "KL(target || drafter); 0 unless train.loss is kl or mix)");
  tau_ = &exporter_.Gauge("flashdraft_tau_estimate",
                          "Acceptance length estimated from the last step's slot accuracies");
  learning_rate_ =
      &exporter_.Gauge("flashdraft_learning_rate", "Learning rate of the last committed step");
  for (int k = 1; k < block_size; ++k) {
    slot_accuracy_.push_back(
        &exporter_.Gauge("flashdraft_slot_accuracy",
                         "Top-1 accuracy of the last step's predictions at each block position",
                         {{"position", std::to_string(k)}}));
  }
  tokens_ = &exporter_.Counter("flashdraft_tokens_total", "Predicted token positions trained on");
  steps_ =
      &exporter_.Counter("flashdraft_steps_total", "Steps committed by this coordinator process");
  step_seconds_ = &exporter_.Seconds("flashdraft_step_duration_seconds",
                                     "Wall time of a committed step at the coordinator");
  for (const char* phase : {"wait", "forward", "backward", "allreduce", "optimizer"}) {
    phase_seconds_.push_back(&exporter_.Seconds("flashdraft_phase_duration_seconds",
                                                "Time of a step's phase, mean over the workers",
                                                {{"phase", phase}}));
  }
  workers_training_ =
      &exporter_.Gauge("flashdraft_workers", "Workers by state", {{"state", "training"}});
  workers_waiting_ =
      &exporter_.Gauge("flashdraft_workers", "Workers by state", {{"state", "waiting"}});
  workers_missing_ = &exporter_.Gauge(
      "flashdraft_workers_missing", "Workers the paused job still waits for (cluster.min_workers)");
  feeders_live_ = &exporter_.Gauge("flashdraft_feeders", "Target feeders with a live Feed stream");
  feeders_missing_ = &exporter_.Gauge(
      "flashdraft_feeders_missing",
      "Feeders the paused job still waits for (cluster.min_feeders at the start, then one)");
  membership_epoch_ = &exporter_.Gauge("flashdraft_membership_epoch",
                                       "Membership epoch (changes when a worker joins or is lost)");
  worker_failures_ =
      &exporter_.Counter("flashdraft_worker_failures_total", "Workers lost or failed");
  steps_reissued_ =
      &exporter_.Counter("flashdraft_steps_reissued_total",
                         "Steps sent again because the membership changed before they committed");
  recovery_seconds_ = &exporter_.Seconds("flashdraft_recovery_duration_seconds",
                                         "From a membership change to the next committed step");
  stream_bytes_ = &exporter_.Counter("flashdraft_stream_bytes_total",
                                     "Bytes of microbatches queued on the workers' Train streams",
                                     {{"direction", "sent"}});
  checkpoint_seconds_ = &exporter_.Gauge("flashdraft_checkpoint_duration_seconds",
                                         "Time the last checkpoint took (upload and write)");
  checkpoint_last_success_ =
      &exporter_.Gauge("flashdraft_checkpoint_last_success_timestamp_seconds",
                       "Unix time of the last checkpoint written");
  eval_drafts_ = &exporter_.Counter("flashdraft_eval_num_drafts_total",
                                    "Evaluation during training: verify cycles (vLLM num_drafts)");
  eval_draft_tokens_ =
      &exporter_.Counter("flashdraft_eval_num_draft_tokens_total",
                         "Evaluation during training: drafted tokens proposed (vLLM "
                         "num_draft_tokens)");
  eval_accepted_tokens_ =
      &exporter_.Counter("flashdraft_eval_num_accepted_tokens_total",
                         "Evaluation during training: drafted tokens accepted (vLLM "
                         "num_accepted_tokens)");
  for (int k = 1; k < block_size; ++k) {
    eval_accepted_per_position_.push_back(&exporter_.Counter(
        "flashdraft_eval_num_accepted_tokens_per_pos_total",
        "Evaluation during training: cycles that accepted the drafted token at each position "
        "(vLLM num_accepted_tokens_per_pos)",
        {{"position", std::to_string(k)}}));
  }
  eval_tau_ = &exporter_.Gauge("flashdraft_eval_tau",
                               "Mean accepted tokens per verify cycle of the last evaluation");
  eval_seconds_ = &exporter_.Gauge("flashdraft_eval_duration_seconds",
                                   "Wall time of the last evaluation during training");
}

void CoordinatorMetrics::RecordStep(const StepRecord& r) {
  step_->Set(static_cast<double>(r.step + 1));
  loss_->Set(r.loss);
  kl_->Set(r.Kl());
  tau_->Set(r.TauEstimate());
  learning_rate_->Set(r.learning_rate);
  const std::vector<double> accuracy = r.SlotAccuracy();
  for (size_t k = 0; k < slot_accuracy_.size() && k < accuracy.size(); ++k) {
    slot_accuracy_[k]->Set(accuracy[k]);
  }
  tokens_->Increment(static_cast<double>(r.tokens));
  steps_->Increment();
  step_seconds_->Observe(r.step_seconds);
  const double phases[] = {r.wait_seconds, r.forward_seconds, r.backward_seconds,
                           r.allreduce_seconds, r.optimizer_seconds};
  for (size_t i = 0; i < phase_seconds_.size(); ++i) phase_seconds_[i]->Observe(phases[i]);
}

void CoordinatorMetrics::SetWorkers(int training, int waiting, uint64_t membership_epoch) {
  workers_training_->Set(training);
  workers_waiting_->Set(waiting);
  membership_epoch_->Set(static_cast<double>(membership_epoch));
}

void CoordinatorMetrics::StepsReissued(int64_t steps) {
  steps_reissued_->Increment(static_cast<double>(steps));
}

void CoordinatorMetrics::RecordRecovery(double seconds) { recovery_seconds_->Observe(seconds); }

void CoordinatorMetrics::SetMissingWorkers(int missing) { workers_missing_->Set(missing); }

void CoordinatorMetrics::SetFeeders(int live, int missing) {
  feeders_live_->Set(live);
  feeders_missing_->Set(missing);
}

void CoordinatorMetrics::WorkerFailed() { worker_failures_->Increment(); }

void CoordinatorMetrics::AddStreamBytes(uint64_t bytes) {
  stream_bytes_->Increment(static_cast<double>(bytes));
}

void CoordinatorMetrics::RecordCheckpoint(double seconds, double unix_time) {
  checkpoint_seconds_->Set(seconds);
  checkpoint_last_success_->Set(unix_time);
}

void CoordinatorMetrics::RecordEval(const EvalSummary& e) {
  eval_drafts_->Increment(static_cast<double>(e.drafts));
  eval_draft_tokens_->Increment(static_cast<double>(e.draft_tokens));
  eval_accepted_tokens_->Increment(static_cast<double>(e.accepted_tokens));
  for (size_t k = 0; k < eval_accepted_per_position_.size() && k < e.accepted_per_position.size();
       ++k) {
    eval_accepted_per_position_[k]->Increment(static_cast<double>(e.accepted_per_position[k]));
  }
  eval_tau_->Set(e.tau);
  eval_seconds_->Set(e.seconds);
}

void CoordinatorMetrics::SetNumericsMixed(bool mixed) { numerics_mixed_->Set(mixed ? 1 : 0); }

}  // namespace flashdraft
