// The coordinator's Prometheus metrics (docs/OBSERVABILITY.md lists them). Served at
// job.metrics.listen (/metrics); the bound port is written to <output_dir>/metrics.port.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/metrics_exporter.h"

namespace flashdraft {

struct StepRecord;

// What one evaluation during training measured (coordinator/evaluator.h), in the meaning of vLLM's
// speculative-decoding counters, so dashboards compute acceptance the same way for training and
// for serving.
struct EvalSummary {
  int prompts = 0;
  int64_t drafts = 0;           // verify cycles
  int64_t draft_tokens = 0;     // drafted tokens proposed: cycles × (block − 1)
  int64_t accepted_tokens = 0;  // drafted tokens accepted (the target's own token not counted)
  std::vector<int64_t> accepted_per_position;  // cycles that accepted drafted token k = 1 .. B−1
  double tau = 0;  // mean over prompts of the mean tokens per cycle (DFLASH.md §5)
  // The same decodes counted as z-lab's benchmark.py, vLLM and SGLang's request metadata count
  // (SpeculativeTally::TauZlab, TauPooled, TauSglang).
  double tau_zlab = 0, tau_pooled = 0, tau_sglang = 0;
  double seconds = 0;  // wall time of the evaluation
};

class CoordinatorMetrics {
 public:
  // `backend`, `security` (ServerSecurity::description()) and `numerics` (the coordinator's own
  // NumericEnvLabels): labels of flashdraft_build_info.
  CoordinatorMetrics(const std::string& backend, int64_t total_steps, int block_size,
                     const std::string& security = "",
                     const std::vector<std::pair<std::string, std::string>>& numerics = {});

  // Serves /metrics on `listen` ("host:port", port 0 picks one); returns the bound port.
  absl::StatusOr<int> Serve(const std::string& listen) {
    return exporter_.Serve(listen, "metrics.listen");
  }

  void RecordStep(const StepRecord& record);  // a committed step
  // Members training in the current epoch, workers waiting for the next one, the epoch.
  void SetWorkers(int training, int waiting, uint64_t membership_epoch);
  void WorkerFailed();
  // Steps sent in an epoch that ended before they committed (sent again in the next one).
  void StepsReissued(int64_t steps);
  // Time from a membership change to the next committed step.
  void RecordRecovery(double seconds);
  // Workers still missing for min_workers while the job pauses (0 while it trains).
  void SetMissingWorkers(int missing);
  // Target feeders: live, and how many more a paused job waits for.
  void SetFeeders(int live, int missing);
  // A worker of another numeric environment was admitted (cluster.mixed_numerics: admit).
  void SetNumericsMixed(bool mixed);
  void AddStreamBytes(uint64_t bytes);  // Train-stream bytes queued to workers
  void RecordCheckpoint(double seconds, double unix_time);
  void RecordEval(const EvalSummary& eval);

  // /healthz and /readyz beside /metrics (common/health.h).
  HealthState& health() { return exporter_.health(); }

  // The exposition text of everything, as a scrape returns it (tests, `flashdraft status`).
  std::string Text() const { return exporter_.Text(); }

 private:
  MetricsExporter exporter_;
  prometheus::Gauge* step_;
  prometheus::Gauge* numerics_mixed_;
  prometheus::Gauge* loss_;
  prometheus::Gauge* kl_;
  prometheus::Gauge* tau_;
  prometheus::Gauge* learning_rate_;
  std::vector<prometheus::Gauge*> slot_accuracy_;  // positions 1..B-1
  prometheus::Counter* tokens_;
  prometheus::Counter* steps_;
  prometheus::Histogram* step_seconds_;
  std::vector<prometheus::Histogram*>
      phase_seconds_;  // wait, forward, backward, allreduce, optimizer
  prometheus::Gauge* workers_training_;
  prometheus::Gauge* workers_waiting_;
  prometheus::Gauge* workers_missing_;
  prometheus::Gauge* feeders_live_;
  prometheus::Gauge* feeders_missing_;
  prometheus::Gauge* membership_epoch_;
  prometheus::Counter* worker_failures_;
  prometheus::Counter* steps_reissued_;
  prometheus::Histogram* recovery_seconds_;
  prometheus::Counter* stream_bytes_;
  prometheus::Gauge* checkpoint_seconds_;
  prometheus::Gauge* checkpoint_last_success_;
  prometheus::Counter* eval_drafts_;
  prometheus::Counter* eval_draft_tokens_;
  prometheus::Counter* eval_accepted_tokens_;
  std::vector<prometheus::Counter*> eval_accepted_per_position_;  // positions 1..B-1
  prometheus::Gauge* eval_tau_;
  prometheus::Gauge* eval_seconds_;
};

}  // namespace flashdraft
