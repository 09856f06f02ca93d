// steps.jsonl (docs/OBSERVABILITY.md): one JSON record per committed step, in step order, and one
// per membership change ({"event": "membership", ...}). Flushed after every line, so that a crash
// loses nothing that was committed; the coordinator writes a step's record before it checkpoints.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace flashdraft {

// Per-step aggregate written to steps.jsonl.
struct StepRecord {
  uint64_t step = 0;
  uint64_t membership_epoch = 0;
  double loss = 0;  // Σ w·CE / Σ w, whatever train.loss trains
  double weighted_loss_sum = 0;
  double weighted_kl_sum = 0;  // Σ w·KL(target ‖ drafter)
  double weight_sum = 0;
  bool distilled = false;  // train.loss kl / mix: the record says "kl"
  int64_t tokens = 0;
  int world_size = 0;
  std::vector<int64_t> slot_correct, slot_total;
  uint64_t collective_bytes = 0;  // gradient bytes the workers sent each other
  double wait_seconds = 0, forward_seconds = 0, backward_seconds = 0, allreduce_seconds = 0,
         optimizer_seconds = 0;  // mean over ranks
  double max_wait_seconds = 0;
  // Per rank: forward + backward + all-reduce + optimizer (its step time without waiting).
  std::vector<double> rank_compute_seconds;
  double step_seconds = 0;
  double learning_rate = 0;
  // Workers of different numeric environments trained this job (cluster.mixed_numerics: admit):
  // the record says "reproducible": false.
  bool numerics_mixed = false;

  std::vector<double> SlotAccuracy() const;
  double Kl() const { return weight_sum > 0 ? weighted_kl_sum / weight_sum : 0.0; }
  double TauEstimate() const;
};

// Seconds since the Unix epoch (the records' unix_time).
double UnixSeconds();

class StepLog {
 public:
  // A fresh log at `path` (truncated), or with `resume_step` > 0 the existing one, keeping the
  // records of steps before `resume_step` (the steps a checkpoint holds; later ones are trained
  // again) and every event (the job's history), then a {"event":"resumed"} line.
  static absl::StatusOr<StepLog> Open(const std::string& path, int64_t resume_step = 0);

  void Write(const StepRecord& record);
  // A membership change or another event (it carries its own "event" key). Write and WriteEvent
  // may be called from several threads (an evaluation writes from the checkpoint thread).
  void WriteEvent(const nlohmann::json& event);
  const std::string& path() const { return path_; }

 private:
  StepLog(std::string path, std::ofstream file) : path_(std::move(path)), file_(std::move(file)) {}
  void WriteLine(const std::string& line);

  std::string path_;
  std::unique_ptr<absl::Mutex> mu_ = std::make_unique<absl::Mutex>();  // movable StepLog
  std::ofstream file_ ABSL_GUARDED_BY(*mu_);
};

}  // namespace flashdraft
