#include "coordinator/status_board.h"

namespace flashdraft {

const char* JobStateName(JobState state) {
  switch (state) {
    case JobState::kWaiting:
      return "waiting";
    case JobState::kTraining:
      return "training";
    case JobState::kPaused:
      return "paused";
    case JobState::kStopped:
      return "stopped";
    case JobState::kDone:
      return "done";
    case JobState::kFailed:
      return "failed";
  }
  return "unknown";
}

bool StatusBoard::AwaitState(JobState state, double seconds) const {
  absl::MutexLock lock(&mu_);
  struct Wait {
    const StatusBoard* board;
    JobState state;
    static bool Reached(Wait* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return w->board->state_ == w->state;
    }
  } wait{this, state};
  return mu_.AwaitWithTimeout(absl::Condition(&Wait::Reached, &wait), absl::Seconds(seconds));
}

void StatusBoard::Committed(const StepRecord& record, double eta_seconds) {
  absl::MutexLock lock(&mu_);
  committed_ = record.step + 1;
  last_record_ = record;
  eta_seconds_ = eta_seconds;
}

void StatusBoard::Fill(v1::StatusReply* reply) const {
  absl::MutexLock lock(&mu_);
  reply->set_state(JobStateName(state_));
  reply->set_step(committed_);
  reply->set_loss(last_record_.loss);
  reply->set_tau_estimate(last_record_.TauEstimate());
  reply->set_step_seconds(last_record_.step_seconds);
  reply->set_tokens_per_second(last_record_.step_seconds > 0
                                   ? static_cast<double>(last_record_.tokens) /
                                         last_record_.step_seconds
                                   : 0.0);
  reply->set_eta_seconds(eta_seconds_);
  reply->set_paused_reason(paused_reason_);
}

}  // namespace flashdraft
