#include "feeder/feeder_metrics.h"

namespace flashdraft {

FeederMetrics::FeederMetrics(const std::string& device,
                             const std::vector<std::pair<std::string, std::string>>& numerics)
    : exporter_({{"device", device}}, numerics) {
  MetricsExporter& e = exporter_;
  shards_ =
      &e.Counter("flashdraft_feeder_shards_total", "Shards whose features this feeder computed");
  samples_ = &e.Counter("flashdraft_feeder_samples_total", "Samples of those shards");
  tokens_ = &e.Counter("flashdraft_feeder_tokens_total", "Tokens of those samples");
  forward_ = &e.Seconds("flashdraft_feeder_forward_duration_seconds",
                        "Time of the target forward of each shard");
  sent_bytes_ = &e.Counter("flashdraft_feeder_sent_bytes_total",
                           "Bytes of computed shards written to workers (FetchShard)");
  held_bytes_ =
      &e.Gauge("flashdraft_feeder_held_bytes", "Computed features held until their step commits");
  max_bytes_ = &e.Gauge("flashdraft_feeder_max_bytes", "The bound on them (--max-bytes)");
  pending_ = &e.Gauge("flashdraft_feeder_pending_shards", "Shards assigned, not computed yet");
  regenerated_lines_ = &e.Counter("flashdraft_feeder_regenerated_lines_total",
                                  "Data lines whose replies this feeder regenerated");
  generated_tokens_ = &e.Counter("flashdraft_feeder_generated_tokens_total",
                                 "Tokens of the target's replies it generated for them");
  regenerate_ = &e.Seconds("flashdraft_feeder_regenerate_duration_seconds",
                           "Time to regenerate one data line's replies");
}

void FeederMetrics::RecordRegenerated(int64_t new_tokens, double seconds) {
  regenerated_lines_->Increment();
  generated_tokens_->Increment(static_cast<double>(new_tokens));
  regenerate_->Observe(seconds);
}

void FeederMetrics::RecordShard(int64_t samples, int64_t tokens, double seconds) {
  shards_->Increment();
  samples_->Increment(static_cast<double>(samples));
  tokens_->Increment(static_cast<double>(tokens));
  forward_->Observe(seconds);
}

void FeederMetrics::AddSentBytes(uint64_t bytes) {
  sent_bytes_->Increment(static_cast<double>(bytes));
}

void FeederMetrics::SetStore(uint64_t held_bytes, uint64_t max_bytes, uint64_t pending_shards) {
  held_bytes_->Set(static_cast<double>(held_bytes));
  max_bytes_->Set(static_cast<double>(max_bytes));
  pending_->Set(static_cast<double>(pending_shards));
}

}  // namespace flashdraft
