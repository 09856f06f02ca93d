#include "cli/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/job_config.h"
#include "common/security.h"
#include "model/memory_estimate.h"

namespace flashdraft {
namespace {

std::atomic<int> g_signal{0};

void OnSignal(int sig) { g_signal = sig; }

struct Child {
  std::string name;
  pid_t pid = -1;
  int out_fd = -1;
  std::string partial;  // an incomplete last line
  std::ofstream log;
  bool exited = false;
  int exit_code = -1;
  int term_signal = 0;            // the signal that ended it, if one did
  std::vector<std::string> argv;  // to start it again
  int restarts = 0;               // how many times this worker was started again
  bool replaced = false;          // a newer process runs in its place
  std::chrono::steady_clock::time_point restart_at{};  // when to start it again (if set)
};

// Starts `argv` with stdout+stderr into a pipe, in its own process group (so that a terminal's
// Ctrl-C reaches only the launcher, which stops the children in order).
bool Spawn(Child& child, const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return false;
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    setpgid(0, 0);
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
  child.pid = pid;
  child.out_fd = fds[0];
  return true;
}

// `flashdraft-worker --probe`: what the worker binary can run, "key: value" per line.
std::map<std::string, std::string> ProbeWorkerBinary(const std::string& worker_bin) {
  std::map<std::string, std::string> out;
  FILE* p = popen((worker_bin + " --probe 2>/dev/null").c_str(), "r");
  if (p == nullptr) return out;
  char line[1024];
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    std::string l(line);
    while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.pop_back();
    const size_t colon = l.find(": ");
    if (colon != std::string::npos) out[l.substr(0, colon)] = l.substr(colon + 2);
  }
  pclose(p);
  return out;
}

// A GPU job (cluster.backend nccl, worker.device cuda) needs a worker built for it and one GPU per
// worker here (NCCL refuses two ranks on one GPU). Empty when it can run.
std::string GpuJobProblem(const JobConfig& job, const std::string& worker_bin, int workers) {
  const bool nccl = job.cluster.backend == "nccl", cuda = job.worker.device == "cuda";
  if (!nccl && !cuda) return "";
  std::map<std::string, std::string> probe = ProbeWorkerBinary(worker_bin);
  if (probe.empty()) return absl::StrCat(worker_bin, " --probe gave no answer");
  if (nccl && !OffersBackend(probe["backends"], "nccl")) {
    return "cluster.backend nccl needs a flashdraft-worker built with the GPU path "
           "(-DFLASHDRAFT_WITH_CUDA=ON); this one has only " +
           probe["backends"];
  }
  if (cuda && probe["torch_cuda"] != "yes") {
    return "worker.device cuda needs a flashdraft-worker linked against a CUDA LibTorch (this "
           "one's LibTorch has no CUDA; scripts/gpu-check.sh builds against one)";
  }
  int devices = 0;
  if (!absl::SimpleAtoi(probe["cuda_devices"], &devices) || devices == 0) {
    return absl::StrCat("cluster.backend nccl needs a GPU per worker and none is usable here",
                        probe.count("cuda") ? absl::StrCat(": ", probe["cuda"]) : "");
  }
  if (workers > devices) {
    return absl::StrCat("--workers ", workers, " but ", devices,
                        " GPU(s) visible: NCCL needs one GPU per worker");
  }
  return "";
}

// train.blas_kernel for every process launch starts: OpenBLAS reads OPENBLAS_CORETYPE only when it
// loads, so the name must be in a process's environment at exec. The children (coordinator,
// workers, their restarts, the --probe) inherit the launcher's environ through execv/popen, so it
// is set here, once, before any of them starts; the launcher itself does no BLAS work whose bits
// matter. An unpinned job leaves the environment as it is.
absl::Status PinChildrenBlasKernel(const std::string& kernel) {
  if (kernel.empty()) return absl::OkStatus();
  if (setenv("OPENBLAS_CORETYPE", kernel.c_str(), /*overwrite=*/1) != 0) {
    return absl::InternalError(absl::StrCat(
        "train.blas_kernel: cannot set OPENBLAS_CORETYPE=", kernel, ": ", std::strerror(errno)));
  }
  std::printf("[launch     ] OpenBLAS kernel pinned by train.blas_kernel: %s\n", kernel.c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

std::string BinDir() {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().string();
}

// Every process runs on this machine: their expected peaks against its available memory. Missing
// files are the coordinator's to report.
absl::Status CheckLaunchMemory(const JobConfig& job, const LaunchOptions& o) {
  absl::StatusOr<MemoryInputs> inputs = MemoryInputsForJob(job);
  if (!inputs.ok()) return absl::OkStatus();
  const JobMemory memory = EstimateJobMemory(job, *inputs, o.workers);
  std::printf("[launch     ] expected peak memory: coordinator %lld MiB, each worker %lld MiB\n",
              static_cast<long long>(memory.coordinator.HostBytes() >> 20),
              static_cast<long long>(memory.worker.HostBytes() >> 20));
  if (o.skip_memory_check) return absl::OkStatus();
  return CheckJobFits(memory, AvailableHostMemory(), "this machine");
}

}  // namespace

int Launch(const LaunchOptions& o) {
  auto fail = [](const std::string& what) {
    std::cerr << "flashdraft launch: error: " << what << "\n";
    return 1;
  };
  if (o.workers < 1) return fail(absl::StrCat("--workers must be >= 1, got ", o.workers));
  absl::StatusOr<JobConfig> job = LoadJobConfig(o.job_path);
  if (!job.ok()) return fail(std::string(job.status().message()));
  if (absl::Status s = ApplyOverrides(*job, o.overrides); !s.ok()) {
    return fail(std::string(s.message()));
  }
  if (!o.out_dir.empty()) job->output_dir = o.out_dir;
  // Up to N workers; the job goes on (elastically) down to its min_workers.
  job->cluster.max_workers = o.workers;
  job->cluster.min_workers = std::min(job->cluster.min_workers, o.workers);
  if (o.threads_per_worker > 0) job->train.intra_op_threads = o.threads_per_worker;
  if (absl::Status s =
          ValidateJobConfig(*job, absl::StrCat(o.job_path, " with --workers ", o.workers));
      !s.ok()) {
    return fail(std::string(s.message()));
  }
  // The workers' TLS files and job secret (paths only) from the job's security section.
  const ClientSecurity client = ClientSecurityFor(job->security);
  if (client.tls() && job->security.client_auth && client.tls_cert.empty()) {
    return fail(absl::StrCat(o.job_path,
                             ": mutual TLS (security.tls_ca with client_auth) needs "
                             "security.client_cert and security.client_key for the workers launch "
                             "starts"));
  }
  std::vector<std::string> worker_security;
  for (const auto& [flag, value] : {std::pair<const char*, std::string>{"--tls-ca", client.tls_ca},
                                    {"--tls-cert", client.tls_cert},
                                    {"--tls-key", client.tls_key},
                                    {"--tls-server-name", client.server_name},
                                    {"--token-file", client.token_file}}) {
    if (value.empty()) continue;
    worker_security.push_back(flag);
    worker_security.push_back(value);
  }
  std::error_code ec;
  std::filesystem::create_directories(job->output_dir + "/logs", ec);
  if (ec) return fail(absl::StrCat("cannot create ", job->output_dir, "/logs: ", ec.message()));
  // Each worker's /metrics port, where a person finds it (targets.json lists them for Prometheus).
  const bool worker_metrics = job->metrics.enabled && !job->metrics.worker_listen.empty();
  if (worker_metrics) std::filesystem::create_directories(job->output_dir + "/metrics", ec);
  const std::string job_file = job->output_dir + "/job.yaml";
  if (absl::Status s = WriteFileAtomically(job_file, JobConfigToYaml(*job)); !s.ok()) {
    return fail(std::string(s.message()));
  }
  const std::string bin = BinDir();
  const std::string coordinator_bin = bin + "/flashdraft-coordinator";
  const std::string worker_bin = bin + "/flashdraft-worker";
  for (const std::string& b : {coordinator_bin, worker_bin}) {
    if (access(b.c_str(), X_OK) != 0) return fail(absl::StrCat(b, " not found next to flashdraft"));
  }
  if (absl::Status s = PinChildrenBlasKernel(job->train.blas_kernel); !s.ok()) {
    return fail(std::string(s.message()));
  }
  if (std::string problem = GpuJobProblem(*job, worker_bin, o.workers); !problem.empty()) {
    return fail(problem);
  }
  if (absl::Status s = CheckLaunchMemory(*job, o); !s.ok()) return fail(std::string(s.message()));

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::vector<std::unique_ptr<Child>> children;
  std::mutex out_mu;
  auto add_child = [&](const std::string& name, const std::vector<std::string>& argv,
                       int restarts = 0) -> Child* {
    auto c = std::make_unique<Child>();
    c->name = name;
    c->argv = argv;
    c->restarts = restarts;
    c->log.open(job->output_dir + "/logs/" + name + ".log",
                restarts > 0 ? std::ios::app : std::ios::trunc);
    if (!Spawn(*c, argv)) return nullptr;
    children.push_back(std::move(c));
    return children.back().get();
  };
  // Interleaves the children's output, line by line, with a prefix.
  auto pump = [&](int timeout_ms) {
    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    for (auto& c : children) {
      if (c->out_fd >= 0) {
        fds.push_back({c->out_fd, POLLIN, 0});
        owners.push_back(c.get());
      }
    }
    if (fds.empty() || poll(fds.data(), fds.size(), timeout_ms) <= 0) {
      if (fds.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
      return;
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
      Child* c = owners[i];
      char buf[8192];
      ssize_t n = read(c->out_fd, buf, sizeof(buf));
      if (n <= 0) {
        close(c->out_fd);
        c->out_fd = -1;
        n = 0;
      }
      c->partial.append(buf, n);
      size_t nl;
      std::lock_guard<std::mutex> lock(out_mu);
      while ((nl = c->partial.find('\n')) != std::string::npos ||
             (c->out_fd < 0 && !c->partial.empty())) {
        const std::string line = nl == std::string::npos ? c->partial : c->partial.substr(0, nl);
        c->partial.erase(0, nl == std::string::npos ? std::string::npos : nl + 1);
        std::printf("[%-11s] %s\n", c->name.c_str(), line.c_str());
        c->log << line << "\n";
      }
      std::fflush(stdout);
      c->log.flush();
    }
  };
  auto reap = [&] {
    for (auto& c : children) {
      if (c->exited) continue;
      int status;
      if (waitpid(c->pid, &status, WNOHANG) == c->pid) {
        c->exited = true;
        c->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        c->term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      }
    }
  };
  auto signal_all = [&](int sig) {
    for (auto& c : children) {
      if (!c->exited) kill(c->pid, sig);
    }
  };

  const std::string port_file = job->output_dir + "/coordinator.port";
  std::filesystem::remove(port_file, ec);
  Child* coordinator =
      add_child("coordinator", {coordinator_bin, "--job", job_file, "--port-file", port_file});
  if (coordinator == nullptr) return fail("cannot start the coordinator");
  int port = 0;
  const auto port_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (port == 0) {
    pump(50);
    reap();
    std::ifstream in(port_file);
    if (in >> port && port > 0) break;
    port = 0;
    if (coordinator->exited || g_signal != 0 || std::chrono::steady_clock::now() > port_deadline) {
      signal_all(SIGKILL);
      while (coordinator->out_fd >= 0) pump(50);
      return fail(coordinator->exited
                      ? absl::StrCat("the coordinator exited with code ", coordinator->exit_code)
                      : "the coordinator did not start listening");
    }
  }
  for (int r = 0; r < o.workers; ++r) {
    std::vector<std::string> argv = {worker_bin, "--coordinator", absl::StrCat("127.0.0.1:", port),
                                     "--id", absl::StrCat("worker-", r)};
    if (job->cluster.backend == "nccl") {  // worker r on the r-th visible GPU
      argv.push_back("--cuda-device");
      argv.push_back(absl::StrCat(r));
    }
    argv.insert(argv.end(), worker_security.begin(), worker_security.end());
    if (worker_metrics) {
      argv.push_back("--metrics-port-file");
      argv.push_back(absl::StrCat(job->output_dir, "/metrics/worker-", r, ".port"));
    }
    if (add_child(absl::StrCat("worker-", r), argv) == nullptr) {
      signal_all(SIGTERM);
      return fail("cannot start a worker");
    }
  }

  // Run until the coordinator ends (or a signal), then give the workers a grace period.
  bool interrupted = false;
  std::chrono::steady_clock::time_point kill_at{};
  while (true) {
    pump(100);
    reap();
    // A worker that crashed while the job runs is started again (it rejoins at the next step
    // boundary), up to --max-restarts times each, 1 s, 2 s, 4 s ... (at most 30 s) later. With
    // --resume, so is a crashed coordinator: on the same port, from its newest checkpoint; the
    // workers join it again by themselves.
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < children.size(); ++i) {
      Child* c = children[i].get();
      const bool is_coordinator = c == coordinator;
      if (!c->exited || c->replaced || c->exit_code == 0 || interrupted ||
          c->restarts >= o.max_restarts || (is_coordinator && !o.restart_coordinator) ||
          (!is_coordinator && coordinator->exited)) {
        continue;
      }
      if (c->restart_at == std::chrono::steady_clock::time_point{}) {
        const int backoff = std::min(30, 1 << std::min(c->restarts, 5));
        c->restart_at = now + std::chrono::seconds(backoff);
        std::lock_guard<std::mutex> lock(out_mu);
        std::printf("[launch     ] %s exited with code %d; starting it again in %d s (%d of %d)\n",
                    c->name.c_str(), c->exit_code, backoff, c->restarts + 1, o.max_restarts);
        std::fflush(stdout);
      } else if (now >= c->restart_at) {
        c->replaced = true;
        const std::string name = c->name;
        std::vector<std::string> argv = c->argv;
        if (is_coordinator && c->restarts == 0) {
          for (const std::string& set : {absl::StrCat("cluster.listen=127.0.0.1:", port),
                                         std::string("checkpoint.resume=true")}) {
            argv.push_back("--set");
            argv.push_back(set);
          }
        }
        const int restarts = c->restarts + 1;
        Child* again = add_child(name, argv, restarts);
        if (again == nullptr) {
          std::lock_guard<std::mutex> lock(out_mu);
          std::printf("[launch     ] cannot start %s again\n", name.c_str());
        } else if (is_coordinator) {
          coordinator = again;
        }
        c = nullptr;  // add_child may have moved the vector's storage
      }
    }
    // The coordinator is waiting to be started again: nobody is stopped meanwhile.
    const bool coordinator_restarting =
        coordinator->exited && !coordinator->replaced &&
        coordinator->restart_at != std::chrono::steady_clock::time_point{};
    if (g_signal != 0 && !interrupted) {
      interrupted = true;
      std::lock_guard<std::mutex> lock(out_mu);
      std::printf("[launch     ] stopping (signal %d)\n", g_signal.load());
      kill(coordinator->pid, SIGTERM);
      kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    }
    if (coordinator->exited && !coordinator_restarting &&
        kill_at == std::chrono::steady_clock::time_point{}) {
      // The job is over: a worker still around (dropped near the end, joining again) stops trying
      // at SIGTERM and exits 0; one still exporting the drafter finishes first.
      for (auto& c : children) {
        if (!c->exited && c.get() != coordinator) kill(c->pid, SIGTERM);
      }
      kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    }
    bool all_exited = true;
    for (auto& c : children) all_exited = all_exited && c->exited;
    if (all_exited) break;
    if (kill_at != std::chrono::steady_clock::time_point{} &&
        std::chrono::steady_clock::now() > kill_at) {
      signal_all(SIGKILL);
    }
  }
  for (auto& c : children) {
    while (c->out_fd >= 0) pump(50);
  }
  int failed_workers = 0, restarts = 0;
  for (auto& c : children) {
    if (c->name == "coordinator") continue;
    if (!c->replaced && c->exit_code != 0) {
      ++failed_workers;
      if (c->term_signal != 0) {
        std::printf("[launch     ] %s ended by signal %d (%s)\n", c->name.c_str(), c->term_signal,
                    strsignal(c->term_signal));
      } else {
        std::printf("[launch     ] %s exited with code %d\n", c->name.c_str(), c->exit_code);
      }
    }
    restarts += c->replaced;
  }
  std::printf(
      "[launch     ] coordinator exited %d; %d of %d worker(s) failed, %d restart(s); logs and "
      "steps.jsonl in %s\n",
      coordinator->exit_code, failed_workers, o.workers, restarts, job->output_dir.c_str());
  if (interrupted) return 130;
  return coordinator->exit_code == 0 ? 0 : 1;
}

}  // namespace flashdraft
