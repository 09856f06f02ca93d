// Time as the protocol logic sees it: seconds on a monotonic clock. Heartbeat timeouts, join
// deadlines and token expiry take a Clock, so tests drive them with a FakeClock in microseconds
// instead of sleeping.
#pragma once

#include <atomic>
#include <chrono>

namespace flashdraft {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds since an arbitrary, fixed origin; never goes backwards.
  virtual double Now() const = 0;
};

class RealClock : public Clock {
 public:
  double Now() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // One clock for the process.
  static const RealClock& Get() {
    static const RealClock clock;
    return clock;
  }
};

// Moves only when told to; safe to read from any thread.
class FakeClock : public Clock {
 public:
  explicit FakeClock(double start = 1000.0) : now_(start) {}
  double Now() const override { return now_.load(); }
  void Advance(double seconds) { now_.store(now_.load() + seconds); }

 private:
  std::atomic<double> now_;
};

}  // namespace flashdraft
