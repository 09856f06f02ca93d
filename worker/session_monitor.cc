#include "worker/session_monitor.h"

#include <chrono>

#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace flashdraft {

SessionMonitor::SessionMonitor(const Clock& clock, const MonitorOptions& options,
                               const SessionProgress& progress,
                               std::function<bool(v1::WorkerMessage&)> write,
                               std::function<void()> on_stuck, HealthState* health)
    : clock_(clock),
      options_(options),
      progress_(progress),
      write_(std::move(write)),
      on_stuck_(std::move(on_stuck)),
      health_(health) {}

void SessionMonitor::ReportHealth(double now) {
  const uint64_t counter = progress_.counter;
  if (!progress_seen_ || progress_seen_->first != counter) progress_seen_.emplace(counter, now);
  const double still = now - progress_seen_->second;
  if (progress_.busy && still > options_.stall_timeout_seconds) {
    health_->Stuck(absl::StrFormat(
        "the training thread has made no progress in %s of step %d for %.0f s "
        "(cluster.stall_timeout_seconds: %g)",
        progress_.phase.load(), progress_.step.load(), still, options_.stall_timeout_seconds));
  } else {
    health_->Alive(options_.heartbeat_timeout_seconds, "the heartbeat thread");
  }
}

void SessionMonitor::Tick(bool leave_requested, bool stream_lost) {
  const double now = clock_.Now();
  if (health_ != nullptr) ReportHealth(now);
  if (leave_requested && !leave_sent_) {
    LOG(INFO) << "asked to leave: leaving at the next step boundary";
    v1::WorkerMessage m;
    m.mutable_leave()->set_reason("SIGTERM");
    write_(m);
    leave_sent_ = true;
  }
  if (stream_lost && !stuck_reported_) {
    const uint64_t counter = progress_.counter;
    if (!stalled_ || stalled_->first != counter) {
      stalled_.emplace(counter, now);
    } else if (progress_.busy && now - stalled_->second > options_.stall_timeout_seconds) {
      LOG(ERROR) << "the training thread is stuck in " << progress_.phase.load() << " of step "
                 << progress_.step << " and the coordinator is gone";
      stuck_reported_ = true;
      on_stuck_();
    }
  }
  if (!next_heartbeat_ || now >= *next_heartbeat_) {
    next_heartbeat_ = now + options_.heartbeat_interval_seconds;
    v1::WorkerMessage m;
    v1::Heartbeat* h = m.mutable_heartbeat();
    h->set_unix_millis(std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count());
    h->set_progress(progress_.counter);
    h->set_phase(progress_.phase.load());
    h->set_step(progress_.step);
    h->set_busy(progress_.busy);
    if (!write_(m) && !write_failed_) {
      LOG(WARNING) << "a heartbeat could not be written: the Train stream is gone";
      write_failed_ = true;
    }
  }
}

}  // namespace flashdraft
