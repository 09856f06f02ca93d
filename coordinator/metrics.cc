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
                                       int block_size)
    : registry_(std::make_shared<prometheus::Registry>()) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  BuildGauge()
      .Name("flashdraft_build_info")
      .Help("Always 1; the labels say which build runs")
      .Register(*registry_)
      .Add({{"version", FLASHDRAFT_VERSION}, {"commit", FLASHDRAFT_COMMIT}, {"backend", backend}})
      .Set(1);
  step_ = &BuildGauge()
               .Name("flashdraft_step")
               .Help("Committed training steps")
               .Register(*registry_)
               .Add({});
  BuildGauge()
      .Name("flashdraft_steps")
      .Help("Training steps of the job")
      .Register(*registry_)
      .Add({})
      .Set(static_cast<double>(total_steps));
  loss_ = &BuildGauge()
               .Name("flashdraft_loss")
               .Help("Loss of the last committed step (the global batch's weighted CE)")
               .Register(*registry_)
               .Add({});
  tau_ = &BuildGauge()
              .Name("flashdraft_tau_estimate")
              .Help("Acceptance length estimated from the last step's slot accuracies")
              .Register(*registry_)
              .Add({});
  learning_rate_ = &BuildGauge()
                        .Name("flashdraft_learning_rate")
                        .Help("Learning rate of the last committed step")
                        .Register(*registry_)
                        .Add({});
  auto& accuracy = BuildGauge()
                       .Name("flashdraft_slot_accuracy")
                       .Help("Top-1 accuracy of the last step's predictions at each block position")
                       .Register(*registry_);
  for (int k = 1; k < block_size; ++k) {
    slot_accuracy_.push_back(&accuracy.Add({{"position", std::to_string(k)}}));
  }
  tokens_ = &BuildCounter()
                 .Name("flashdraft_tokens_total")
                 .Help("Predicted token positions trained on")
                 .Register(*registry_)
                 .Add({});
  steps_ = &BuildCounter()
                .Name("flashdraft_steps_total")
                .Help("Steps committed by this coordinator process")
                .Register(*registry_)
                .Add({});
  step_seconds_ = &BuildHistogram()
                       .Name("flashdraft_step_duration_seconds")
                       .Help("Wall time of a committed step at the coordinator")
                       .Register(*registry_)
                       .Add({}, SecondsBuckets());
  auto& phases = BuildHistogram()
                     .Name("flashdraft_phase_duration_seconds")
                     .Help("Time of a step's phase, mean over the workers")
                     .Register(*registry_);
  for (const char* phase : {"wait", "forward", "backward", "allreduce", "optimizer"}) {
    phase_seconds_.push_back(&phases.Add({{"phase", phase}}, SecondsBuckets()));
  }
  workers_training_ = &BuildGauge()
                           .Name("flashdraft_workers")
                           .Help("Workers by state")
                           .Register(*registry_)
                           .Add({{"state", "training"}});
  membership_epoch_ = &BuildGauge()
                           .Name("flashdraft_membership_epoch")
                           .Help("Membership epoch (changes when a worker joins or is lost)")
                           .Register(*registry_)
                           .Add({});
  worker_failures_ = &BuildCounter()
                          .Name("flashdraft_worker_failures_total")
                          .Help("Workers lost or failed")
                          .Register(*registry_)
                          .Add({});
  stream_bytes_ = &BuildCounter()
                       .Name("flashdraft_stream_bytes_total")
                       .Help("Bytes of microbatches queued on the workers' Train streams")
                       .Register(*registry_)
                       .Add({{"direction", "sent"}});
  checkpoint_seconds_ = &BuildGauge()
                             .Name("flashdraft_checkpoint_duration_seconds")
                             .Help("Time the last checkpoint took (upload and write)")
                             .Register(*registry_)
                             .Add({});
  checkpoint_last_success_ = &BuildGauge()
                                  .Name("flashdraft_checkpoint_last_success_timestamp_seconds")
                                  .Help("Unix time of the last checkpoint written")
                                  .Register(*registry_)
                                  .Add({});
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

void CoordinatorMetrics::SetWorkers(int training, int membership_epoch) {
  workers_training_->Set(training);
  membership_epoch_->Set(membership_epoch);
}

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
