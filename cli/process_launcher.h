// Starting and watching child processes, as `flashdraft launch`'s Supervisor needs it: spawn, send
// a signal, see whether it exited, read its output. PosixProcessLauncher does it with fork/exec,
// pipes and waitpid; FakeProcessLauncher (fake_process_launcher.h) scripts it for tests.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace flashdraft {

// The launcher's handle of a process it started; never reused by that launcher (unlike a pid).
using ProcessId = int;

struct ProcessExit {
  int exit_code = 0;    // the exit status, or 128 + the signal that ended it
  int term_signal = 0;  // the signal that ended it, 0 if it exited by itself
};

// Bytes of a process's stdout+stderr; `closed`: its output ended (sent once, maybe with bytes).
struct ProcessOutput {
  ProcessId id = 0;
  std::string bytes;
  bool closed = false;
};

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  // Starts argv[0] with argv; its stdout and stderr together come through ReadOutput.
  virtual absl::StatusOr<ProcessId> Spawn(const std::vector<std::string>& argv) = 0;
  // Does nothing once the process has been seen to exit.
  virtual void Signal(ProcessId id, int signal) = 0;
  // Its exit once it has exited (and from then on), nullopt while it runs. Does not block.
  virtual std::optional<ProcessExit> PollExit(ProcessId id) = 0;
  // Waits up to `timeout_seconds` for output of any process whose output is still open and
  // returns what arrived; with none open, waits the whole timeout.
  virtual std::vector<ProcessOutput> ReadOutput(double timeout_seconds) = 0;
};

}  // namespace flashdraft
