// A feeder's Prometheus metrics (docs/OBSERVABILITY.md), served at --metrics-listen or the job's
// metrics.worker_listen and listed in the job's targets.json with role "feeder": how much it holds,
// how fast it computes, what it sends. Thread-safe (prometheus-cpp's metrics are).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/metrics_exporter.h"

namespace flashdraft {

class FeederMetrics {
 public:
  // `device` and `numerics` (NumericEnvLabels): labels of flashdraft_build_info.
  FeederMetrics(const std::string& device,
                const std::vector<std::pair<std::string, std::string>>& numerics = {});

  // Serves /metrics on `listen`; `field` names the setting in errors. Returns the bound port.
  absl::StatusOr<int> Serve(const std::string& listen, const std::string& field) {
    return exporter_.Serve(listen, field);
  }

  // A shard computed: its samples, tokens and the seconds its target forward took.
  void RecordShard(int64_t samples, int64_t tokens, double seconds);
  // A data line's replies regenerated (data.regenerate): the tokens generated and the seconds.
  void RecordRegenerated(int64_t new_tokens, double seconds);
  // A worker fetched a shard: the bytes written to it.
  void AddSentBytes(uint64_t bytes);
  // The store's state: computed features held (and the bound), shards assigned not computed yet.
  void SetStore(uint64_t held_bytes, uint64_t max_bytes, uint64_t pending_shards);

  std::string Text() const { return exporter_.Text(); }

  // /healthz and /readyz beside /metrics (common/health.h).
  HealthState& health() { return exporter_.health(); }

 private:
  MetricsExporter exporter_;
  prometheus::Counter* shards_;
  prometheus::Counter* samples_;
  prometheus::Counter* tokens_;
  prometheus::Histogram* forward_;
  prometheus::Counter* sent_bytes_;
  prometheus::Gauge* held_bytes_;
  prometheus::Gauge* max_bytes_;
  prometheus::Gauge* pending_;
  prometheus::Counter* regenerated_lines_;
  prometheus::Counter* generated_tokens_;
  prometheus::Histogram* regenerate_;
};

}  // namespace flashdraft
