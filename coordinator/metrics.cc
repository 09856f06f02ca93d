#include "coordinator/metrics.h"

#include <prometheus/text_serializer.h>

#include <exception>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"

namespace flashdraft {
namespace {

// Seconds, from 1 ms to about 100 s.
prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100};
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(const std::string& backend, int64_t total_steps,
                                       int block_size, const std::string& security)
    : registry_(std::make_shared<prometheus::Registry>()) {
  // The registry merges families of one name: each call adds one labelled series.
  prometheus::Registry& r = *registry_;
  auto gauge = [&r](const std::string& name, const std::string& help,
                    const prometheus::Labels& labels = {}) -> prometheus::Gauge& {
    return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(labels);
  };
  auto counter = [&r](const std::string& name, const std::string& help,
                      const prometheus::Labels& labels = {}) -> prometheus::Counter& {
    return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add(labels);
  };
  auto histogram = [&r](const std::string& name, const std::string& help,
                        const prometheus::Labels& labels = {}) -> prometheus::Histogram& {
    return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add(labels,
                                                                              SecondsBuckets());
  };
  gauge("flashdraft_build_info", "Always 1; the labels say which build runs",
        {{"version", FLASHDRAFT_VERSION},
         {"commit", FLASHDRAFT_COMMIT},
         {"backend", backend},
         {"security", security}})
      .Set(1);
  step_ = &gauge("flashdraft_step", "Committed training steps");
  gauge("flashdraft_steps", "Training steps of the job").Set(static_cast<double>(total_steps));
  loss_ =
      &gauge("flashdraft_loss", "Loss of the last committed step (the global batch's weighted CE)");
  tau_ = &gauge("flashdraft_tau_estimate",
                "Acceptance length estimated from the last step's slot accuracies");
  learning_rate_ = &gauge("flashdraft_learning_rate", "Learning rate of the last committed step");
  for (int k = 1; k < block_size; ++k) {
    slot_accuracy_.push_back(
        &gauge("flashdraft_slot_accuracy",
               "Top-1 accuracy of the last step's predictions at each block position",
               {{"position", std::to_string(k)}}));
  }
  tokens_ = &counter("flashdraft_tokens_total", "Predicted token positions trained on");
  steps_ = &counter("flashdraft_steps_total", "Steps committed by this coordinator process");
  step_seconds_ = &histogram("flashdraft_step_duration_seconds",
                             "Wall time of a committed step at the coordinator");
  for (const char* phase : {"wait", "forward", "backward", "allreduce", "optimizer"}) {
    phase_seconds_.push_back(&histogram("flashdraft_phase_duration_seconds",
                                        "Time of a step's phase, mean over the workers",
                                        {{"phase", phase}}));
  }
  workers_training_ = &gauge("flashdraft_workers", "Workers by state", {{"state", "training"}});
  workers_waiting_ = &gauge("flashdraft_workers", "Workers by state", {{"state", "waiting"}});
  workers_missing_ = &gauge("flashdraft_workers_missing",
                            "Workers the paused job still waits for (cluster.min_workers)");
  membership_epoch_ = &gauge("flashdraft_membership_epoch",
                             "Membership epoch (changes when a worker joins or is lost)");
  worker_failures_ = &counter("flashdraft_worker_failures_total", "Workers lost or failed");
  steps_reissued_ =
      &counter("flashdraft_steps_reissued_total",
               "Steps sent again because the membership changed before they committed");
  recovery_seconds_ = &histogram("flashdraft_recovery_duration_seconds",
                                 "From a membership change to the next committed step");
  stream_bytes_ = &counter("flashdraft_stream_bytes_total",
                           "Bytes of microbatches queued on the workers' Train streams",
                           {{"direction", "sent"}});
  checkpoint_seconds_ = &gauge("flashdraft_checkpoint_duration_seconds",
                               "Time the last checkpoint took (upload and write)");
  checkpoint_last_success_ = &gauge("flashdraft_checkpoint_last_success_timestamp_seconds",
                                    "Unix time of the last checkpoint written");
}

absl::StatusOr<int> CoordinatorMetrics::Serve(const std::string& listen) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics.listen ", listen, ": cannot serve /metrics: ", e.what()));
  }
  exposer_->RegisterCollectable(registry_);
  const std::vector<int> ports = exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("metrics.listen ", listen, ": no port bound"));
  }
  return ports.front();
}

void CoordinatorMetrics::RecordStep(const StepRecord& r) {
  step_->Set(static_cast<double>(r.step + 1));
  loss_->Set(r.loss);
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

void CoordinatorMetrics::WorkerFailed() { worker_failures_->Increment(); }

void CoordinatorMetrics::AddStreamBytes(uint64_t bytes) {
  stream_bytes_->Increment(static_cast<double>(bytes));
}

void CoordinatorMetrics::RecordCheckpoint(double seconds, double unix_time) {
  checkpoint_seconds_->Set(seconds);
  checkpoint_last_success_->Set(unix_time);
}

std::string CoordinatorMetrics::Text() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace flashdraft
