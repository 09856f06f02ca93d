#include "cli/posix_process_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace flashdraft {

PosixProcessLauncher::~PosixProcessLauncher() {
  for (auto& [id, child] : children_) {
    if (child.out_fd >= 0) close(child.out_fd);
  }
}

absl::StatusOr<ProcessId> PosixProcessLauncher::Spawn(const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to start");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(error)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    // A launcher killed outright (SIGKILL, the OOM killer) takes its children with it instead of
    // leaving them holding ports and devices; they get the SIGTERM a stop would send. Spawn runs on
    // the thread that supervises them until they exit, which this signal is tied to.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the launcher died before the prctl
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s failed: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  const ProcessId id = next_id_++;
  children_[id] = Child{pid, fds[0], std::nullopt};
  return id;
}

void PosixProcessLauncher::Signal(ProcessId id, int signal) {
  auto it = children_.find(id);
  // A reaped pid may already belong to another process.
  if (it != children_.end() && !it->second.exit.has_value()) kill(it->second.pid, signal);
}

std::optional<ProcessExit> PosixProcessLauncher::PollExit(ProcessId id) {
  auto it = children_.find(id);
  if (it == children_.end()) return std::nullopt;
  Child& child = it->second;
  int status;
  if (!child.exit.has_value() && waitpid(child.pid, &status, WNOHANG) == child.pid) {
    ProcessExit exit;
    exit.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    exit.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    child.exit = exit;
  }
  return child.exit;
}

std::vector<ProcessOutput> PosixProcessLauncher::ReadOutput(double timeout_seconds) {
  const int timeout_ms = static_cast<int>(timeout_seconds * 1000);
  std::vector<pollfd> fds;
  std::vector<ProcessId> owners;
  for (const auto& [id, child] : children_) {
    if (child.out_fd < 0) continue;
    fds.push_back({child.out_fd, POLLIN, 0});
    owners.push_back(id);
  }
  std::vector<ProcessOutput> out;
  if (fds.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    return out;
  }
  if (poll(fds.data(), fds.size(), timeout_ms) <= 0) return out;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
    Child& child = children_[owners[i]];
    char buf[8192];
    const ssize_t n = read(child.out_fd, buf, sizeof(buf));
    ProcessOutput chunk{owners[i], std::string(buf, n > 0 ? n : 0), n <= 0};
    if (chunk.closed) {
      close(child.out_fd);
      child.out_fd = -1;
    }
    out.push_back(std::move(chunk));
  }
  return out;
}

}  // namespace flashdraft
