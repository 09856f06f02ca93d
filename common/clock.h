// Time as the protocol logic sees it: seconds on a monotonic clock. Heartbeat timeouts, join
// deadlines, token expiry and every wait of the coordinator take a Clock, so tests drive them with
// a FakeClock instead of sleeping.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace flashdraft {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds since an arbitrary, fixed origin; never goes backwards.
  virtual double Now() const = 0;
  // With `mu` held: waits until `cond` holds or this clock reaches `deadline` (Now()'s seconds;
  // infinity: no deadline), `mu` released meanwhile and held again on return. Returns whether
  // `cond` holds. `cond` is evaluated under `mu` whenever `mu` is released by another thread.
  virtual bool AwaitUntil(absl::Mutex& mu, const absl::Condition& cond, double deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
};

class RealClock : public Clock {
 public:
  double Now() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  bool AwaitUntil(absl::Mutex& mu, const absl::Condition& cond, double deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (std::isinf(deadline)) {
      mu.Await(cond);
      return true;
    }
    return mu.AwaitWithTimeout(cond, absl::Seconds(std::max(0.0, deadline - Now())));
  }
  // One clock for the process.
  static const RealClock& Get() {
    static const RealClock clock;
    return clock;
  }
};

// Moves only when told to; safe to read from any thread. A wait on it ends when Advance() passes
// its deadline: Advance() takes and releases the mutex of every wait in progress, which makes
// absl::Mutex evaluate the waits' conditions again. The mutexes waited on must outlive a concurrent
// Advance() (in tests the clock is advanced while the objects that wait on it live).
class FakeClock : public Clock {
 public:
  explicit FakeClock(double start = 1000.0) : now_(start) {}
  double Now() const override { return now_.load(); }
  void Advance(double seconds) {
    now_.store(now_.load() + seconds);
    std::vector<absl::Mutex*> waiting;
    {
      absl::MutexLock lock(&waiters_mu_);
      waiting = waiters_;
    }
    for (absl::Mutex* mu : waiting) {
      mu->Lock();
      mu->Unlock();
    }
  }
  bool AwaitUntil(absl::Mutex& mu, const absl::Condition& cond, double deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    {
      absl::MutexLock lock(&waiters_mu_);
      waiters_.push_back(&mu);
    }
    struct Wait {
      const absl::Condition* cond;
      const FakeClock* clock;
      double deadline;
    } wait{&cond, this, deadline};
    mu.Await(absl::Condition(
        +[](Wait* w) { return w->cond->Eval() || w->clock->Now() >= w->deadline; }, &wait));
    {
      absl::MutexLock lock(&waiters_mu_);
      waiters_.erase(std::find(waiters_.begin(), waiters_.end(), &mu));
    }
    return cond.Eval();
  }
  // How many waits are in progress (tests wait for a thread to be parked before advancing).
  int waiting() const {
    absl::MutexLock lock(&waiters_mu_);
    return static_cast<int>(waiters_.size());
  }

 private:
  std::atomic<double> now_;
  mutable absl::Mutex waiters_mu_;
  mutable std::vector<absl::Mutex*> waiters_ ABSL_GUARDED_BY(waiters_mu_);
};

}  // namespace flashdraft
