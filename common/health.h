// What a process answers on /healthz and /readyz, beside /metrics (docs/OBSERVABILITY.md), for
// the probes of Kubernetes, container HEALTHCHECKs and service managers.
//
// Live (/healthz 200): the thread that watches the process's progress (a worker's heartbeat
// thread, the coordinator's step driver, a feeder's reporter) said so recently enough. Each report
// is good for a stated time; a watcher that stops reporting — deadlocked, or watching a thread that
// stopped making progress — turns the answer into 503 once that time is past, naming what it was
// watching and for how long it has been silent. A process that knows it is stuck says so at once
// (Stuck).
// Ready (/readyz 200): live, and doing what it is for (a worker: joined and trained a step; the
// coordinator: serving its port; a feeder: joined with its target open).
#pragma once

#include <limits>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace flashdraft {

struct ProbeAnswer {
  int status = 200;  // 200 or 503
  std::string body;  // one line: "ok", or why not
};

class HealthState {
 public:
  static constexpr double kForever = std::numeric_limits<double>::infinity();

  explicit HealthState(const Clock& clock = RealClock::Get()) : clock_(clock) {}

  // Live until Now() + `valid_for` seconds (kForever: until told otherwise), watched by `watcher`
  // ("the heartbeat thread"), which reports again before then. Clears a Stuck.
  void Alive(double valid_for, absl::string_view watcher) ABSL_LOCKS_EXCLUDED(mu_);
  // Not live, and says `why`, until the next Alive.
  void Stuck(absl::string_view why) ABSL_LOCKS_EXCLUDED(mu_);
  // Ready or not; `why` says why not (or what it is ready as).
  void Ready(bool ready, absl::string_view why) ABSL_LOCKS_EXCLUDED(mu_);

  ProbeAnswer Healthz() const ABSL_LOCKS_EXCLUDED(mu_);
  ProbeAnswer Readyz() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ProbeAnswer LiveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock& clock_;
  mutable absl::Mutex mu_;
  // A process is live from its start: nothing watches it before its first Alive.
  double live_until_ ABSL_GUARDED_BY(mu_) = kForever;
  double reported_at_ ABSL_GUARDED_BY(mu_) = 0;
  std::string watcher_ ABSL_GUARDED_BY(mu_);
  std::string stuck_ ABSL_GUARDED_BY(mu_);  // non-empty: stuck, and why
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  std::string ready_why_ ABSL_GUARDED_BY(mu_) = "starting";
};

}  // namespace flashdraft
