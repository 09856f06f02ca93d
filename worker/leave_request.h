// A request to leave the job at the next step boundary (the worker's SIGTERM): the coordinator
// re-forms the group without this worker, which then exits 0. main() owns it and its signal
// handler sets it; the worker's join loop and the session's heartbeat thread read it. An object
// passed in, not a process global, so that tests make their own.
#pragma once

#include <atomic>

namespace flashdraft {

class LeaveRequest {
 public:
  // Async-signal-safe: one store to a lock-free atomic.
  void Request() { requested_.store(true, std::memory_order_relaxed); }
  bool requested() const { return requested_.load(std::memory_order_relaxed); }

 private:
  static_assert(std::atomic<bool>::is_always_lock_free,
                "a signal handler may only set a lock-free atomic");
  std::atomic<bool> requested_{false};
};

}  // namespace flashdraft
