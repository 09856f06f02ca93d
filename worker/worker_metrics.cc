#include "worker/worker_metrics.h"

#include "absl/strings/str_cat.h"

namespace flashdraft {

WorkerMetrics::WorkerMetrics(const std::string& device, const std::string& backend,
                             const std::vector<std::pair<std::string, std::string>>& numerics)
    : exporter_({{"device", device}, {"backend", backend}}, numerics) {
  MetricsExporter& e = exporter_;
  joins_ = &e.Counter("flashdraft_worker_joins_total",
                      "Sessions this worker began with the coordinator (1 + rejoins)");
  rank_ = &e.Gauge("flashdraft_worker_rank", "Rank in the current membership epoch (-1: none)");
  rank_->Set(-1);
  epoch_ = &e.Gauge("flashdraft_worker_membership_epoch",
                    "Membership epoch this worker trains in (0: none yet)");
  step_ = &e.Gauge("flashdraft_worker_step", "The last step this worker computed and acked");
  steps_ = &e.Counter("flashdraft_worker_steps_total", "Steps this worker computed and acked");
  for (const char* phase : {"wait", "forward", "backward", "allreduce", "optimizer"}) {
    phases_.push_back(&e.Seconds(
        "flashdraft_worker_phase_duration_seconds",
        "Time of each phase of this worker's steps (wait: for its microbatches; allreduce: the "
        "part backward did not hide)",
        {{"phase", phase}}));
  }
  collective_errors_ = &e.Counter("flashdraft_worker_collective_errors_total",
                                  "Collectives that failed (the group is re-formed)");
  collective_bytes_ =
      &e.Counter("flashdraft_worker_collective_bytes_total",
                 "Gradient bytes this worker sent its peers", {{"direction", "sent"}});
  received_bytes_ = &e.Counter("flashdraft_worker_stream_bytes_total",
                               "Bytes received on the Train stream", {{"direction", "received"}});
  queued_ = &e.Gauge("flashdraft_worker_queued_microbatches",
                     "Microbatches received and not yet taken by the training thread");
  device_used_ =
      &e.Gauge("flashdraft_worker_device_memory_bytes",
               "The worker's GPU memory (worker.device: cuda; 0 on CPUs)", {{"kind", "used"}});
  device_total_ =
      &e.Gauge("flashdraft_worker_device_memory_bytes",
               "The worker's GPU memory (worker.device: cuda; 0 on CPUs)", {{"kind", "total"}});
}

void WorkerMetrics::SetDeviceMemory(int64_t used_bytes, int64_t total_bytes) {
  device_used_->Set(static_cast<double>(used_bytes));
  device_total_->Set(static_cast<double>(total_bytes));
}

void WorkerMetrics::Joined() {
  joins_->Increment();
  exporter_.health().Ready(false, "joined, no step trained yet");
}

void WorkerMetrics::Rejoining(const std::string& why) {
  exporter_.health().Alive(HealthState::kForever, "the worker's join loop");
  exporter_.health().Ready(false, "joining the coordinator again: " + why);
}

void WorkerMetrics::SetMembership(int rank, uint64_t epoch) {
  rank_->Set(rank);
  epoch_->Set(static_cast<double>(epoch));
}

void WorkerMetrics::RecordStep(uint64_t step, const StepPhases& p, uint64_t collective_bytes) {
  step_->Set(static_cast<double>(step));
  steps_->Increment();
  const double seconds[] = {p.wait, p.forward, p.backward, p.allreduce, p.optimizer};
  for (size_t i = 0; i < phases_.size(); ++i) phases_[i]->Observe(seconds[i]);
  collective_bytes_->Increment(static_cast<double>(collective_bytes));
  exporter_.health().Ready(true, absl::StrCat("trained step ", step));
}

void WorkerMetrics::CollectiveError() { collective_errors_->Increment(); }

void WorkerMetrics::AddReceivedBytes(uint64_t bytes) {
  received_bytes_->Increment(static_cast<double>(bytes));
}

void WorkerMetrics::SetQueuedMicrobatches(int64_t queued) {
  queued_->Set(static_cast<double>(queued));
}

}  // namespace flashdraft
