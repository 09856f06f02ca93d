// A ProcessLauncher for tests: processes are records a test scripts (print, exit, be killed) at
// times on a FakeClock. Each ReadOutput advances the clock by its timeout, so a supervisor's
// back-offs and grace periods pass in microseconds. SIGKILL kills; SIGTERM makes a process exit 0
// unless it ignores SIGTERM.
#pragma once

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "cli/process_launcher.h"
#include "common/clock.h"

namespace flashdraft {

class FakeProcessLauncher : public ProcessLauncher {
 public:
  struct Process {
    std::vector<std::string> argv;
    double started_at = 0;
    std::vector<int> signals;  // every signal it received, in order
    std::optional<ProcessExit> exit;
    std::string output;  // written, not yet read
    bool output_closed = false;
    bool closed_reported = false;
    bool ignores_sigterm = false;
  };

  // Gives up (aborts) when the clock passes `limit_seconds` after `clock`'s start: a supervisor
  // that never ends is a failed test, not a hung one.
  explicit FakeProcessLauncher(FakeClock& clock, double limit_seconds = 24 * 3600)
      : clock_(clock), limit_(clock.Now() + limit_seconds) {}

  // --- what the test does ---
  // `action` runs in the first ReadOutput that finds the clock at or past `at`.
  void At(double at, std::function<void()> action) { events_.emplace(at, std::move(action)); }
  // Runs for each process as it starts (e.g. to script it by its argv).
  std::function<void(ProcessId, Process&)> on_spawn;
  void FailNextSpawn() { fail_next_spawn_ = true; }
  void Print(ProcessId id, const std::string& text) { processes_.at(id).output += text; }
  void Exit(ProcessId id, int exit_code) { End(id, {exit_code, 0}); }
  void Kill(ProcessId id, int signal) { End(id, {128 + signal, signal}); }

  // --- what the test sees ---
  Process& process(ProcessId id) { return processes_.at(id); }
  // The processes with `arg` in their argv, in the order they started.
  std::vector<ProcessId> Started(const std::string& arg) const {
    std::vector<ProcessId> ids;
    for (const auto& [id, p] : processes_) {
      for (const std::string& a : p.argv) {
        if (a == arg) {
          ids.push_back(id);
          break;
        }
      }
    }
    return ids;
  }
  // (process, signal) as they were sent, to every process.
  const std::vector<std::pair<ProcessId, int>>& signal_log() const { return signal_log_; }

  // --- ProcessLauncher ---
  absl::StatusOr<ProcessId> Spawn(const std::vector<std::string>& argv) override {
    if (fail_next_spawn_) {
      fail_next_spawn_ = false;
      return absl::InternalError("fork: scripted failure");
    }
    const ProcessId id = next_id_++;
    Process& p = processes_[id];
    p.argv = argv;
    p.started_at = clock_.Now();
    if (on_spawn) on_spawn(id, p);
    return id;
  }
  void Signal(ProcessId id, int signal) override {
    Process& p = processes_.at(id);
    if (p.exit.has_value()) return;
    p.signals.push_back(signal);
    signal_log_.emplace_back(id, signal);
    if (signal == SIGKILL || (signal == SIGTERM && !p.ignores_sigterm)) {
      signal == SIGKILL ? Kill(id, SIGKILL) : Exit(id, 0);
    }
  }
  std::optional<ProcessExit> PollExit(ProcessId id) override { return processes_.at(id).exit; }
  std::vector<ProcessOutput> ReadOutput(double timeout_seconds) override {
    clock_.Advance(timeout_seconds);
    if (clock_.Now() > limit_) {
      std::fprintf(stderr, "FakeProcessLauncher: still running at the time limit\n");
      std::abort();
    }
    while (!events_.empty() && events_.begin()->first <= clock_.Now()) {
      auto action = std::move(events_.begin()->second);
      events_.erase(events_.begin());
      action();
    }
    std::vector<ProcessOutput> out;
    for (auto& [id, p] : processes_) {
      const bool closing = p.output_closed && !p.closed_reported;
      if (p.output.empty() && !closing) continue;
      out.push_back({id, std::move(p.output), closing});
      p.output.clear();
      p.closed_reported = p.output_closed;
    }
    return out;
  }

 private:
  void End(ProcessId id, ProcessExit exit) {
    Process& p = processes_.at(id);
    if (p.exit.has_value()) return;
    p.exit = exit;
    p.output_closed = true;
  }

  FakeClock& clock_;
  const double limit_;
  std::multimap<double, std::function<void()>> events_;
  std::map<ProcessId, Process> processes_;
  std::vector<std::pair<ProcessId, int>> signal_log_;
  ProcessId next_id_ = 100;
  bool fail_next_spawn_ = false;
};

}  // namespace flashdraft
