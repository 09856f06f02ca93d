// What `flashdraft status` shows about the job as a whole: its state, the last committed step's
// record and the ETA. The step driver writes it, the Status RPC reads it; its own lock, taken by
// no one who holds it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/step_log.h"
#include "flashdraft/v1/coordinator.pb.h"

namespace flashdraft {

enum class JobState { kWaiting, kTraining, kPaused, kStopped, kDone, kFailed };
// "waiting", "training", "paused", "stopped", "done", "failed" (StatusReply.state).
const char* JobStateName(JobState state);

class StatusBoard {
 public:
  void SetState(JobState state) {
    absl::MutexLock lock(&mu_);
    state_ = state;
    paused_reason_.clear();
  }
  // Paused, and why ("no feeder").
  void SetPaused(std::string reason) {
    absl::MutexLock lock(&mu_);
    state_ = JobState::kPaused;
    paused_reason_ = std::move(reason);
  }
  JobState state() const {
    absl::MutexLock lock(&mu_);
    return state_;
  }
  // Waits up to `seconds` of real time until the job is in `state` (tests, tools); whether it is.
  bool AwaitState(JobState state, double seconds) const;
  // Step `record.step` committed; `eta_seconds` to the end of the job.
  void Committed(const StepRecord& record, double eta_seconds);
  // The last committed record's per-rank compute seconds (for the workers' rows).
  std::vector<double> rank_compute_seconds() const {
    absl::MutexLock lock(&mu_);
    return last_record_.rank_compute_seconds;
  }
  // The job's fields of `reply`: state, step, loss, τ, throughput, ETA.
  void Fill(v1::StatusReply* reply) const;

 private:
  mutable absl::Mutex mu_;
  JobState state_ ABSL_GUARDED_BY(mu_) = JobState::kWaiting;
  uint64_t committed_ ABSL_GUARDED_BY(mu_) = 0;  // steps committed
  StepRecord last_record_ ABSL_GUARDED_BY(mu_);
  double eta_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  std::string paused_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashdraft
