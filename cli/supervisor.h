// The process supervision of `flashdraft launch`: it starts the coordinator and the workers through
// a ProcessLauncher, interleaves their output, starts a crashed one again after a back-off on an
// injected Clock, forwards a stop request (SIGINT/SIGTERM) to the children in order, and ends the
// job when the coordinator ends. Tests drive it with a FakeProcessLauncher and a FakeClock.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/launch_console.h"
#include "cli/process_launcher.h"
#include "cli/stop_signal.h"
#include "common/clock.h"

namespace flashdraft {

// When a child that exited with an error is started again.
struct RestartPolicy {
  // A worker that fails while the job runs is started again this many times.
  int max_restarts = 3;
  // A coordinator that fails is started again too (launch --resume), as many times.
  bool restart_coordinator = false;
  // Before the (restarts + 1)-th start: 1 s, 2 s, 4 s ... at most 30 s.
  static int BackoffSeconds(int restarts);
};

struct SupervisorOptions {
  RestartPolicy restart;
  // The coordinator may go this long without writing its port or a line of output: it reads,
  // tokenizes (and regenerates) the data and loads the target before it listens, which can take
  // far longer in all, but it reports its progress meanwhile.
  double start_timeout_seconds = 300;
  // Between SIGTERM when the job ends (or is stopped) and SIGKILL to whatever still runs.
  double grace_seconds = 15;
};

// How a worker's last process ended.
struct ChildEnd {
  std::string name;
  ProcessExit exit;
};

struct JobOutcome {
  int coordinator_exit_code = -1;  // the coordinator's last process
  // Workers whose last process exited non-zero, in the order they were started.
  std::vector<ChildEnd> failed_workers;
  int worker_restarts = 0;
  bool interrupted = false;  // a stop request ended the job
  // 130 when interrupted, else 0 or 1 as the coordinator ended.
  int ExitCode() const;
};

class Supervisor {
 public:
  Supervisor(ProcessLauncher& launcher, const Clock& clock, const StopSignal& stop,
             LaunchConsole& console, SupervisorOptions options);
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;
  ~Supervisor();

  // Starts the coordinator, first and once.
  absl::Status StartCoordinator(const std::vector<std::string>& argv);
  // Runs until `read_port` gives a port > 0, the coordinator's. If the coordinator exits, a stop
  // is requested (CANCELLED) or it stays silent for the start timeout first, kills it and says
  // which.
  absl::StatusOr<int> WaitForCoordinator(const std::function<int()>& read_port);
  // Extra arguments the coordinator gets when it is started again (its port, resume).
  void SetCoordinatorRestartArgs(std::vector<std::string> args);
  absl::Status StartWorker(const std::string& name, const std::vector<std::string>& argv);
  // To every child still running.
  void SignalAll(int signal);
  // Supervises until every child has exited and its output has been read.
  JobOutcome Run();

 private:
  struct Child;

  absl::StatusOr<Child*> Start(const std::string& name, const std::vector<std::string>& argv,
                               bool coordinator, int restarts);
  void Pump(double timeout_seconds);
  void EmitLines(Child& child);
  void Reap();
  void DrainOutput(const Child& child);
  bool MayRestart(const Child& child) const;
  void RestartFailed();
  void StartAgain(Child& child);
  bool CoordinatorRestarting() const;
  void StopWhenDue();
  bool AllExited() const;
  JobOutcome Outcome() const;

  ProcessLauncher& launcher_;
  const Clock& clock_;
  const StopSignal& stop_;
  LaunchConsole& console_;
  const SupervisorOptions options_;
  std::vector<std::unique_ptr<Child>> children_;  // every process started, in order
  Child* coordinator_ = nullptr;                  // its newest process
  std::vector<std::string> coordinator_restart_args_;
  bool interrupted_ = false;
  std::optional<double> kill_at_;  // when whatever still runs gets SIGKILL
};

}  // namespace flashdraft
