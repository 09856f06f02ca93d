// Helpers shared by the test executables: scratch directories and the Python reference interpreter.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"

namespace flashdraft::testing {

// Waits (up to 30 s of real time) until `done`, which another thread makes true, holds; whether
// it does.
template <typename Done>
bool Eventually(Done done) {
  for (int i = 0; i < 30000 && !done(); ++i) absl::SleepFor(absl::Milliseconds(1));
  return done();
}

// A fresh directory under $TMPDIR, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Debian's interpreter with python3-torch (not the pyenv python3 first on PATH).
inline constexpr const char* kReferencePython = "/usr/bin/python3";

// Empty when /usr/bin/python3 can import torch; otherwise why not (for GTEST_SKIP).
std::string ReferencePythonUnavailableReason();

// Runs `kReferencePython -c script args...`; returns stdout, or an error with stderr and exit code.
absl::StatusOr<std::string> RunReferencePython(const std::string& script,
                                               const std::vector<std::string>& args = {});

// Runs a command through /bin/sh; returns its exit code and combined output.
struct CommandResult {
  int exit_code = -1;
  std::string output;
  // The largest resident set of the command or any process it waited for (wait4's ru_maxrss).
  int64_t peak_rss_bytes = 0;
};
// Runs `command` through /bin/sh, stdout and stderr together.
CommandResult RunCommand(const std::string& command);

std::string ShellQuote(const std::string& s);

// Starts argv[0] with `argv` in the background, stdout and stderr into the file `log`, with the
// "NAME=value" entries of `env` added to its environment; its pid.
int StartProcess(const std::vector<std::string>& argv, const std::string& log,
                 const std::vector<std::string>& env = {});

// The port a process wrote to `path` (as --port-file does), waiting up to `seconds` for it; 0 when
// none came.
int WaitForPortFile(const std::string& path, double seconds = 30);

// A TCP port on 127.0.0.1 that nothing listened on a moment ago (for programs that take no port 0,
// such as slurmctld); 0 when none could be bound.
int FreeTcpPort();

// A flashdraft-coordinator process on port 0 for protocol-level tests (`bin`: the directory of the
// binaries; stderr into `log`, or nowhere). SIGKILLed when destroyed.
class CoordinatorProcess {
 public:
  CoordinatorProcess(const std::string& bin, const std::string& job, const std::string& log = "");
  ~CoordinatorProcess();
  CoordinatorProcess(const CoordinatorProcess&) = delete;
  CoordinatorProcess& operator=(const CoordinatorProcess&) = delete;
  // Sends SIGTERM and returns the exit code.
  int Terminate();
  // Waits up to `seconds` for it to exit by itself: its exit code, or -1 (then it is killed).
  int Wait(double seconds);
  // The bound port; 0 when it did not start within 30 s.
  int port() const { return port_; }
  int pid() const { return pid_; }

 private:
  int pid_ = -1;
  int port_ = 0;
};

// The resident set size of process `pid` in bytes (VmRSS), or -1.
int64_t ResidentBytes(int pid);

// The pid of a process whose command line contains every one of `parts`, or -1.
int FindProcess(const std::vector<std::string>& parts);

// `n` bytes from a seeded generator (the same bytes for the same seed).
std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed);

// A plain HTTP/1.0 GET of http://127.0.0.1:<port><path>: the status line and body, or an error.
struct HttpResponse {
  int status = 0;
  std::string body;
};
absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& path);

// The step records of a steps.jsonl (objects with a "step"; none for a missing file).
std::vector<nlohmann::json> ReadSteps(const std::string& path);
// Its event records of one kind ("event": "membership" changes, "recovered" after one).
std::vector<nlohmann::json> ReadEvents(const std::string& path,
                                       const std::string& kind = "membership");

// Bitwise comparison of two runs' step records: "" when they have the same steps and every step's
// loss, slot accuracies, τ estimate, weight sum and tokens are the same numbers as written (the
// JSON text of each); otherwise the first step that differs, with both values.
std::string FirstDifferentStep(const std::vector<nlohmann::json>& a,
                               const std::vector<nlohmann::json>& b);

// The small job on synthetic shards the integration tests train: one drafter layer, block 8, two
// target features, 8 anchors, sequences of at most 64, 6 samples per step. `extra` (more sections,
// each ending in a newline) is appended.
struct SmallJob {
  std::string name = "test";
  std::string output_dir;  // empty: the default
  std::string shards_dir;
  int64_t max_steps = 30;
  uint64_t seed = 1;
  double learning_rate = 0;  // 0: the default
  std::string blas_kernel;   // train.blas_kernel; empty: not pinned
  std::string extra;
};
std::string SmallJobYaml(const SmallJob& job);

// The OpenBLAS kernel `bin`/flashdraft-worker chooses by itself on this machine (the blas_core of
// its --probe, run without OPENBLAS_CORETYPE): one this CPU runs, for train.blas_kernel of a job
// whose runs in containers (which do not inherit this environment) are compared with runs here.
// Empty when the BLAS is not OpenBLAS; an error when the probe fails or prints no blas_core line.
absl::StatusOr<std::string> HostBlasKernel(const std::string& bin);
// The blas_core of `bin`/flashdraft-worker --probe run after the shell words `env` (e.g.
// "OPENBLAS_CORETYPE=Prescott"; "": this process's environment as it is).
absl::StatusOr<std::string> ProbeBlasKernel(const std::string& bin, const std::string& env);

// The job's security section for the files `deploy/make-certs.sh <pki>` makes (mutual TLS and the
// job secret), one line.
std::string PkiSecurityYaml(const std::string& pki);

}  // namespace flashdraft::testing

#define FD_SKIP_WITHOUT_REFERENCE_PYTHON()                                                  \
  do {                                                                                      \
    std::string fd_why_ = ::flashdraft::testing::ReferencePythonUnavailableReason();        \
    if (!fd_why_.empty()) GTEST_SKIP() << "needs /usr/bin/python3 with torch: " << fd_why_; \
  } while (0)
