// The worker's heartbeat thread, as logic a test drives with a FakeClock: every tick it passes
// on a leave request (SIGTERM) once, sends a heartbeat with the training thread's progress every
// cluster.heartbeat_interval_seconds, and, once the Train stream is gone, watches the training
// thread: one that makes no progress while computing for cluster.stall_timeout_seconds is stuck
// for good (a hung kernel or a collective it cannot be pulled out of), and the only safe way out
// is for the process to exit so that a supervisor starts it again and it joins as new. Each tick
// also tells the worker's /healthz (common/health.h) whether the training thread makes progress.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

#include "common/clock.h"
#include "common/health.h"
#include "flashdraft/v1/coordinator.pb.h"

namespace flashdraft {

// What the training thread is doing (Heartbeat.progress/phase/step/busy): the counter grows at
// every phase change, so a thread that stopped moving shows.
struct SessionProgress {
  std::atomic<uint64_t> counter{0};
  std::atomic<const char*> phase{"idle"};
  std::atomic<uint64_t> step{0};
  std::atomic<bool> busy{false};

  // `is_busy`: computing on its own; waits (for the coordinator, for peers) are not busy.
  void Enter(const char* name, uint64_t at_step, bool is_busy) {
    phase = name;
    step = at_step;
    busy = is_busy;
    ++counter;
  }
};

struct MonitorOptions {
  double heartbeat_interval_seconds = 2.0;
  double stall_timeout_seconds = 300.0;
  // How long one tick's word to /healthz holds: a heartbeat thread silent for longer is not live.
  double heartbeat_timeout_seconds = 20.0;
};

class SessionMonitor {
 public:
  // `write` sends a message on the Train stream (false: it is gone); `on_stuck` is called once the
  // training thread is found stuck with the stream gone (the worker exits there); `health` (may be
  // null): where each tick says whether the training thread makes progress — not while it computes
  // without progress for stall_timeout_seconds, stream or no stream.
  SessionMonitor(const Clock& clock, const MonitorOptions& options, const SessionProgress& progress,
                 std::function<bool(v1::WorkerMessage&)> write, std::function<void()> on_stuck,
                 HealthState* health = nullptr);

  // One look at the world: `leave_requested` (SIGTERM seen), `stream_lost` (the Train stream ended
  // without a Shutdown). Called every ~100 ms by the heartbeat thread.
  void Tick(bool leave_requested, bool stream_lost);

 private:
  void ReportHealth(double now);

  const Clock& clock_;
  const MonitorOptions options_;
  const SessionProgress& progress_;
  const std::function<bool(v1::WorkerMessage&)> write_;
  const std::function<void()> on_stuck_;
  HealthState* const health_;
  std::optional<double> next_heartbeat_;
  bool leave_sent_ = false;
  bool write_failed_ = false;
  bool stuck_reported_ = false;
  // Once the stream is gone: the progress counter and when it was last seen to change.
  std::optional<std::pair<uint64_t, double>> stalled_;
  // For /healthz, stream or no stream: the progress counter and when it was last seen to change.
  std::optional<std::pair<uint64_t, double>> progress_seen_;
};

}  // namespace flashdraft
