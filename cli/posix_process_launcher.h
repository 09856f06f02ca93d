// ProcessLauncher over fork/exec, one pipe per child for its stdout+stderr, poll and waitpid.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cli/process_launcher.h"

namespace flashdraft {

class PosixProcessLauncher : public ProcessLauncher {
 public:
  PosixProcessLauncher() = default;
  PosixProcessLauncher(const PosixProcessLauncher&) = delete;
  PosixProcessLauncher& operator=(const PosixProcessLauncher&) = delete;
  // Closes the pipes still open; the children themselves are left as they are.
  ~PosixProcessLauncher() override;

  // Each child runs in its own process group, so that a terminal's Ctrl-C reaches only the
  // launcher, which stops the children in order.
  absl::StatusOr<ProcessId> Spawn(const std::vector<std::string>& argv) override;
  void Signal(ProcessId id, int signal) override;
  std::optional<ProcessExit> PollExit(ProcessId id) override;
  std::vector<ProcessOutput> ReadOutput(double timeout_seconds) override;

 private:
  struct Child {
    pid_t pid = -1;
    int out_fd = -1;  // -1 once its output ended
    std::optional<ProcessExit> exit;
  };
  std::map<ProcessId, Child> children_;
  ProcessId next_id_ = 1;
};

}  // namespace flashdraft
