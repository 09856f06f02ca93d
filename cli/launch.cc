#include "cli/launch.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/launch_console.h"
#include "cli/posix_process_launcher.h"
#include "cli/stop_signal.h"
#include "cli/supervisor.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "common/job_config.h"
#include "common/security.h"
#include "model/memory_estimate.h"

namespace flashdraft {
namespace {

int Fail(const std::string& what) {
  std::cerr << "flashdraft launch: error: " << what << "\n";
  return 1;
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

}  // namespace

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

namespace {

std::string BinDir() {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().string();
}

// Every process runs on this machine: their expected peaks against its available memory. Missing
// files are the coordinator's to report.
absl::Status CheckLaunchMemory(const JobConfig& job, const LaunchOptions& o) {
  absl::StatusOr<MemoryInputs> inputs = MemoryInputsForJob(job);
  if (!inputs.ok()) return absl::OkStatus();
  const JobMemory memory = EstimateJobMemory(job, *inputs, o.workers, o.feeders);
  std::printf("[launch     ] expected peak memory: coordinator %lld MiB, each worker %lld MiB%s\n",
              static_cast<long long>(memory.coordinator.HostBytes() >> 20),
              static_cast<long long>(memory.worker.HostBytes() >> 20),
              memory.feeders > 0
                  ? absl::StrCat(", each feeder ", memory.feeder.HostBytes() >> 20, " MiB").c_str()
                  : "");
  if (o.skip_memory_check) return absl::OkStatus();
  return CheckJobFits(memory, AvailableHostMemory(), "this machine");
}

// The job as launch runs it: the file with --set, --out, --workers and --threads, validated.
absl::StatusOr<JobConfig> LaunchJob(const LaunchOptions& o) {
  if (o.workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--workers must be >= 1, got ", o.workers));
  }
  absl::StatusOr<JobConfig> job = LoadJobConfig(o.job_path);
  if (!job.ok()) return job.status();
  if (absl::Status s = ApplyOverrides(*job, o.overrides); !s.ok()) return s;
  if (!o.out_dir.empty()) job->output_dir = o.out_dir;
  // Up to N workers; the job goes on (elastically) down to its min_workers.
  job->cluster.max_workers = o.workers;
  job->cluster.min_workers = std::min(job->cluster.min_workers, o.workers);
  if (o.threads_per_worker > 0) job->train.intra_op_threads = o.threads_per_worker;
  if (o.feeders > 0) job->cluster.min_feeders = o.feeders;
  if (absl::Status s =
          ValidateJobConfig(*job, absl::StrCat(o.job_path, " with --workers ", o.workers));
      !s.ok()) {
    return s;
  }
  return job;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> WorkerSecurityArgs(const JobConfig& job,
                                                            const std::string& job_path) {
  const ClientSecurity client = ClientSecurityFor(job.security);
  if (client.tls() && job.security.client_auth && client.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(job_path,
                     ": mutual TLS (security.tls_ca with client_auth) needs "
                     "security.client_cert and security.client_key for the workers launch "
                     "starts"));
  }
  std::vector<std::string> args;
  for (const auto& [flag, value] : {std::pair<const char*, std::string>{"--tls-ca", client.tls_ca},
                                    {"--tls-cert", client.tls_cert},
                                    {"--tls-key", client.tls_key},
                                    {"--tls-server-name", client.server_name},
                                    {"--token-file", client.token_file}}) {
    if (value.empty()) continue;
    args.push_back(flag);
    args.push_back(value);
  }
  return args;
}

bool WorkerMetrics(const JobConfig& job) {
  return job.metrics.enabled && !job.metrics.worker_listen.empty();
}

absl::StatusOr<std::string> PrepareOutputDir(const JobConfig& job) {
  std::error_code ec;
  std::filesystem::create_directories(job.output_dir + "/logs", ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create ", job.output_dir, "/logs: ", ec.message()));
  }
  if (WorkerMetrics(job)) std::filesystem::create_directories(job.output_dir + "/metrics", ec);
  const std::string job_file = job.output_dir + "/job.yaml";
  if (absl::Status s = WriteFileAtomically(job_file, JobConfigToYaml(job)); !s.ok()) return s;
  return job_file;
}

absl::StatusOr<Binaries> FindBinaries(const JobConfig& job) {
  const std::string bin = BinDir();
  Binaries binaries{bin + "/flashdraft-coordinator", bin + "/flashdraft-worker",
                    bin + "/flashdraft-feeder"};
  std::vector<std::string> needed = {binaries.coordinator, binaries.worker};
  if (job.cluster.min_feeders > 0) needed.push_back(binaries.feeder);
  for (const std::string& b : needed) {
    if (access(b.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(b, " not found next to flashdraft"));
    }
  }
  return binaries;
}

namespace {

// What must hold before anything starts: the BLAS kernel pinned, the GPUs there, the memory.
absl::Status Preflight(const JobConfig& job, const LaunchOptions& o, const Binaries& binaries) {
  if (absl::Status s = PinChildrenBlasKernel(job.train.blas_kernel); !s.ok()) return s;
  if (std::string problem = GpuJobProblem(job, binaries.worker, o.workers); !problem.empty()) {
    return absl::FailedPreconditionError(problem);
  }
  return CheckLaunchMemory(job, o);
}

// Worker `rank` of this host, on its rank's GPU with NCCL, its /metrics port in <out>/metrics.
std::vector<std::string> LocalWorkerArgv(const JobConfig& job, const std::string& worker_bin,
                                         int port, int rank,
                                         const std::vector<std::string>& security) {
  std::vector<std::string> argv =
      WorkerArgv(job, worker_bin, absl::StrCat("127.0.0.1:", port), rank, rank, security);
  if (WorkerMetrics(job)) {
    argv.push_back("--metrics-port-file");
    argv.push_back(absl::StrCat(job.output_dir, "/metrics/worker-", rank, ".port"));
  }
  return argv;
}

// Feeder `index` on this host: the job's target, its FetchShard service on loopback, the workers'
// credentials (and under TLS the coordinator's certificate, which the workers already trust under
// the same server name).
std::vector<std::string> FeederArgv(const JobConfig& job, const std::string& feeder_bin, int port,
                                    int index, const std::vector<std::string>& security) {
  std::vector<std::string> argv = {feeder_bin,
                                   "--coordinator",
                                   absl::StrCat("127.0.0.1:", port),
                                   "--id",
                                   absl::StrCat("feeder-", index),
                                   "--target",
                                   job.target.path,
                                   "--listen",
                                   "127.0.0.1:0"};
  argv.insert(argv.end(), security.begin(), security.end());
  if (!job.security.tls_cert.empty()) {
    argv.insert(argv.end(), {"--serve-tls-cert", job.security.tls_cert, "--serve-tls-key",
                             job.security.tls_key});
  }
  if (WorkerMetrics(job)) {  // metrics.worker_listen serves the feeders' too
    argv.push_back("--metrics-port-file");
    argv.push_back(absl::StrCat(job.output_dir, "/metrics/feeder-", index, ".port"));
  }
  return argv;
}

}  // namespace

int ReadPort(const std::string& port_file) {
  int port = 0;
  std::ifstream in(port_file);
  return in >> port && port > 0 ? port : 0;
}

std::vector<std::string> WorkerArgv(const JobConfig& job, const std::string& worker_bin,
                                    const std::string& coordinator, int rank, int cuda_device,
                                    const std::vector<std::string>& security) {
  std::vector<std::string> argv = {worker_bin, "--coordinator", coordinator, "--id",
                                   absl::StrCat("worker-", rank)};
  if (job.cluster.backend == "nccl") {
    argv.push_back("--cuda-device");
    argv.push_back(absl::StrCat(cuda_device));
  }
  argv.insert(argv.end(), security.begin(), security.end());
  return argv;
}

namespace {

void ReportOutcome(LaunchConsole& console, const JobOutcome& outcome, int workers, int feeders,
                   const std::string& output_dir) {
  for (const ChildEnd& end : outcome.failed_workers) {
    if (end.exit.term_signal != 0) {
      console.Note(absl::StrFormat("%s ended by signal %d (%s)", end.name, end.exit.term_signal,
                                   strsignal(end.exit.term_signal)));
    } else {
      console.Note(absl::StrFormat("%s exited with code %d", end.name, end.exit.exit_code));
    }
  }
  console.Note(absl::StrFormat(
      "coordinator exited %d; %d of %d worker(s)%s failed, %d restart(s); logs and steps.jsonl in "
      "%s",
      outcome.coordinator_exit_code, outcome.failed_workers.size(), workers + feeders,
      feeders > 0 ? " and feeder(s)" : "", outcome.worker_restarts, output_dir));
}

// The coordinator, then the workers once it listens, supervised until the job ends.
int Supervise(const JobConfig& job, const LaunchOptions& o, const Binaries& binaries,
              const std::string& job_file, const std::vector<std::string>& security) {
  TerminationSignals::Install();
  TerminationSignals signals;
  PosixProcessLauncher launcher;
  TerminalConsole console(job.output_dir + "/logs");
  SupervisorOptions options;
  options.restart.max_restarts = o.max_restarts;
  options.restart.restart_coordinator = o.restart_coordinator;
  Supervisor supervisor(launcher, RealClock::Get(), signals, console, options);

  const std::string port_file = job.output_dir + "/coordinator.port";
  std::error_code ec;
  std::filesystem::remove(port_file, ec);
  if (!supervisor
           .StartCoordinator({binaries.coordinator, "--job", job_file, "--port-file", port_file})
           .ok()) {
    return Fail("cannot start the coordinator");
  }
  absl::StatusOr<int> port = supervisor.WaitForCoordinator([&] { return ReadPort(port_file); });
  if (absl::IsCancelled(port.status())) {
    std::cerr << "flashdraft launch: " << port.status().message() << "\n";
    return 130;  // interrupted, as a stop after the start
  }
  if (!port.ok()) return Fail(std::string(port.status().message()));
  // Started again (--resume), it listens on the same port and resumes from its newest checkpoint.
  supervisor.SetCoordinatorRestartArgs({"--set", absl::StrCat("cluster.listen=127.0.0.1:", *port),
                                        "--set", "checkpoint.resume=true"});
  for (int r = 0; r < o.workers; ++r) {
    const std::vector<std::string> argv = LocalWorkerArgv(job, binaries.worker, *port, r, security);
    if (!supervisor.StartWorker(absl::StrCat("worker-", r), argv).ok()) {
      supervisor.SignalAll(SIGTERM);
      return Fail("cannot start a worker");
    }
  }
  // Feeders are supervised as workers are: a crashed one is started again and rejoins.
  for (int f = 0; f < job.cluster.min_feeders; ++f) {
    const std::vector<std::string> argv = FeederArgv(job, binaries.feeder, *port, f, security);
    if (!supervisor.StartWorker(absl::StrCat("feeder-", f), argv).ok()) {
      supervisor.SignalAll(SIGTERM);
      return Fail("cannot start a feeder");
    }
  }
  const JobOutcome outcome = supervisor.Run();
  ReportOutcome(console, outcome, o.workers, job.cluster.min_feeders, job.output_dir);
  return outcome.ExitCode();
}

}  // namespace

int Launch(const LaunchOptions& o) {
  absl::StatusOr<JobConfig> job = LaunchJob(o);
  if (!job.ok()) return Fail(std::string(job.status().message()));
  absl::StatusOr<std::vector<std::string>> security = WorkerSecurityArgs(*job, o.job_path);
  if (!security.ok()) return Fail(std::string(security.status().message()));
  absl::StatusOr<std::string> job_file = PrepareOutputDir(*job);
  if (!job_file.ok()) return Fail(std::string(job_file.status().message()));
  absl::StatusOr<Binaries> binaries = FindBinaries(*job);
  if (!binaries.ok()) return Fail(std::string(binaries.status().message()));
  if (absl::Status s = Preflight(*job, o, *binaries); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  return Supervise(*job, o, *binaries, *job_file, *security);
}

}  // namespace flashdraft
