// flashdraft-worker --coordinator HOST:PORT [--id NAME] [--tls-ca CA --tls-cert C --tls-key K]
//                   [--token-file F | --job JOB.yaml] [--metrics-listen HOST:PORT]
//                   [--metrics-port-file FILE] [--cuda-device N]
// flashdraft-worker --probe   (what it can run: collectives, CUDA devices)
// (intra-op threads come from the job: train.intra_op_threads, one value for every worker)
#include <glog/logging.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string>

#include "common/job_config.h"
#include "common/logging.h"
#include "common/malloc_tuning.h"
#include "common/numeric_env.h"
#include "common/process_memory.h"
#include "common/security_flags.h"
#include "worker/leave_request.h"
#include "worker/worker.h"

namespace {

// What the SIGTERM handler sets (a handler reaches nothing else); the worker reads it.
flashdraft::LeaveRequest leave_request;

// The command line, parsed into `options`.
struct Flags {
  flashdraft::WorkerOptions options;
  bool probe = false;
  std::string job_path;
  int stopped_exit_code = 0;
};

void AddFlags(CLI::App& app, Flags& f) {
  flashdraft::WorkerOptions& o = f.options;
  app.add_option("--coordinator", o.coordinator, "coordinator address host:port");
  app.add_flag("--probe", f.probe,
               "print what this worker can run (collectives, CUDA devices) and exit; launch asks "
               "before a GPU job");
  app.add_option("--id", o.worker_id, "worker name (default host:pid)");
  app.add_option("--connect-timeout", o.connect_timeout_seconds,
                 "seconds to wait for the coordinator")
      ->capture_default_str();
  app.add_option("--reconnect-timeout", o.reconnect_timeout_seconds,
                 "seconds to keep joining again after the coordinator went away")
      ->capture_default_str();
  app.add_option("--fetch-timeout", o.fetch_timeout_seconds,
                 "seconds the model's tensors may take to arrive")
      ->capture_default_str();
  app.add_option("--metrics-listen", o.metrics_listen,
                 "serve /metrics here (host:port, port 0 picks one; 'off': none); default: the "
                 "job's metrics.worker_listen");
  app.add_option("--metrics-port-file", o.metrics_port_file,
                 "write the bound metrics port here once serving");
  app.add_option("--stopped-exit-code", f.stopped_exit_code,
                 "exit with this when it leaves or its job stops before the job's end (SIGTERM to "
                 "it or to the coordinator), so that a scheduler starts it again (Kubernetes: 143)")
      ->capture_default_str()
      ->check(CLI::Range(0, 255));
  app.add_option("--cuda-device", o.cuda_device,
                 "worker.device cuda: the GPU ordinal among the visible ones (default: the local "
                 "rank's, LOCAL_RANK or SLURM_LOCALID; the only one under CUDA_VISIBLE_DEVICES)")
      ->check(CLI::Range(0, 1023));
  flashdraft::AddClientSecurityFlags(app, o.security, f.job_path);
}

// NCCL's own bootstrap and socket traffic on the job's private interface (unless set already).
// Process-wide, so here rather than in the session.
void ConfigureProcessForJob(const flashdraft::JobConfig& job) {
  if (job.cluster.backend == "nccl" && !job.cluster.collective_interface.empty()) {
    setenv("NCCL_SOCKET_IFNAME", job.cluster.collective_interface.c_str(), /*overwrite=*/0);
  }
}

// SIGTERM: leave at the next step boundary and exit 0; a second SIGTERM ends it at once.
void LeaveOnSigterm() {
  struct sigaction sa {};
  sa.sa_handler = [](int) { leave_request.Request(); };
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

// The exit code a SIGTERM during the teardown ends the process with (set before the handler).
volatile sig_atomic_t exit_code_on_sigterm = 0;

// The job is left or over: a SIGTERM during the teardown (launch sends one to every worker still
// there when the job ends) ends it at once, with the code it was about to exit with.
void ExitOnSigterm(int code) {
  exit_code_on_sigterm = code;
  struct sigaction done {};
  done.sa_handler = [](int) { _exit(exit_code_on_sigterm); };
  sigemptyset(&done.sa_mask);
  sigaction(SIGTERM, &done, nullptr);
}

// Trains with the parsed flags; the process's exit code.
int Train(Flags& f, char** argv) {
  flashdraft::WorkerOptions& options = f.options;
  absl::StatusOr<flashdraft::ClientSecurity> security =
      flashdraft::ClientSecurityFromJob(f.job_path, options.security);
  if (!security.ok()) {
    std::cerr << "flashdraft-worker: error: " << security.status().message() << "\n";
    return 2;
  }
  options.security = *security;
  options.pin_blas_kernel = [argv](const std::string& kernel) {
    return flashdraft::PinBlasKernel(kernel, argv);
  };
  options.leave = &leave_request;
  options.configure_process = ConfigureProcessForJob;
  LeaveOnSigterm();
  absl::StatusOr<flashdraft::WorkerEnd> end = flashdraft::RunWorker(options);
  LOG(INFO) << "peak memory: " << flashdraft::PeakResidentBytes() / (1 << 20) << " MiB";
  if (!end.ok()) {
    std::cerr << "flashdraft-worker: error: " << end.status().message() << "\n";
    return 1;
  }
  // Before the job's end (this worker left, or the coordinator stopped the job): the code a
  // scheduler starts it again on (--stopped-exit-code; 0 by default).
  const int code = *end == flashdraft::WorkerEnd::kJobFinished ? 0 : f.stopped_exit_code;
  ExitOnSigterm(code);
  if (code != 0) LOG(INFO) << "the job did not end here: exit " << code;
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  flashdraft::InitLogging(argv[0]);
  flashdraft::TuneMallocForStreaming();
  CLI::App app{"flashdraft worker: trains the drafter on microbatches from the coordinator"};
  Flags flags;
  AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  if (flags.probe) {
    std::cout << flashdraft::ProbeWorker();
    return 0;
  }
  if (app.count("--coordinator") == 0) {
    std::cerr << "flashdraft-worker: error: --coordinator is required\n";
    return 2;
  }
  return Train(flags, argv);
}
