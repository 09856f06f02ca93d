// A worker's Prometheus metrics (docs/OBSERVABILITY.md), served at job.metrics.worker_listen or
// --metrics-listen. One per process: it outlives the sessions (a worker that joins the
// coordinator again keeps its port and its counters). Thread-safe (prometheus-cpp's metrics are).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/metrics_exporter.h"

namespace flashdraft {

struct StepPhases {
  double wait = 0, forward = 0, backward = 0, allreduce = 0, optimizer = 0;
};

class WorkerMetrics {
 public:
  // `device`, `backend` and `numerics` (NumericEnvLabels): labels of flashdraft_build_info.
  WorkerMetrics(const std::string& device, const std::string& backend,
                const std::vector<std::pair<std::string, std::string>>& numerics = {});

  // Serves /metrics on `listen`; `field` names the setting in errors. Returns the bound port.
  absl::StatusOr<int> Serve(const std::string& listen, const std::string& field) {
    return exporter_.Serve(listen, field);
  }

  void Joined();  // a session with the coordinator began (not ready until its first step)
  // The session ended and the worker joins again: live without a heartbeat thread, not ready.
  void Rejoining(const std::string& why);
  // This worker's place in a new membership epoch (rank -1: none).
  void SetMembership(int rank, uint64_t epoch);
  // A step this worker computed and acked: its phases (the optimizer's is the previous step's)
  // and the gradient bytes it sent its peers.
  void RecordStep(uint64_t step, const StepPhases& phases, uint64_t collective_bytes);
  void CollectiveError();
  void AddReceivedBytes(uint64_t bytes);  // from the Train stream
  void SetQueuedMicrobatches(int64_t queued);
  // worker.device: cuda — the GPU's memory in use (all processes) and its size.
  void SetDeviceMemory(int64_t used_bytes, int64_t total_bytes);

  std::string Text() const { return exporter_.Text(); }

  // /healthz and /readyz (common/health.h). Ready: joined, and trained a step since (Joined and
  // RecordStep say so); live: the session's heartbeat thread reports (SessionMonitor).
  HealthState& health() { return exporter_.health(); }

 private:
  MetricsExporter exporter_;
  prometheus::Counter* joins_;
  prometheus::Gauge* rank_;
  prometheus::Gauge* epoch_;
  prometheus::Gauge* step_;
  prometheus::Counter* steps_;
  std::vector<prometheus::Histogram*> phases_;  // wait, forward, backward, allreduce, optimizer
  prometheus::Counter* collective_errors_;
  prometheus::Counter* collective_bytes_;
  prometheus::Counter* received_bytes_;
  prometheus::Gauge* queued_;
  prometheus::Gauge* device_used_;
  prometheus::Gauge* device_total_;
};

}  // namespace flashdraft
