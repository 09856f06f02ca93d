// flashdraft-coordinator --job JOB.yaml [--set section.field=value ...] [--port-file FILE]
#include <glog/logging.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cuda_util.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/numeric_env.h"
#include "common/process_memory.h"
#include "coordinator/coordinator.h"
#include "coordinator/evaluator.h"
#include "coordinator/initial_weights.h"
#include "coordinator/sources/shard_source.h"
#include "coordinator/sources/target_source.h"
#include "model/memory_estimate.h"
#include "model/numeric_probe.h"

namespace {

int g_signal_pipe[2] = {-1, -1};

extern "C" void OnSignal(int sig) {
  const char c = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &c, 1);  // async-signal-safe
}

// Exit 2: the job (its file, an override, its checkpoints) is refused, which starting again will
// not change (a Kubernetes podFailurePolicy fails the job on it); 1: any other failure.
int Fail(const absl::Status& s) {
  std::cerr << "flashdraft-coordinator: error: " << s.message() << "\n";
  return absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s) ? 2 : 1;
}

// SIGINT/SIGTERM end the job cleanly. Libraries start threads before main (LibTorch's and
// OpenBLAS's pools), so a blocked mask cannot steer the signal to one thread: the handler only
// writes to a pipe, and WatchSignals' thread turns that into RequestStop() or Abort().
absl::Status InstallSignalPipe() {
  if (pipe(g_signal_pipe) != 0) return absl::InternalError("pipe() failed");
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  return absl::OkStatus();
}

// The first SIGINT/SIGTERM stops the job gracefully (the step in flight commits, a checkpoint is
// written, exit 0; before any step: a non-zero exit); a second one aborts at once.
void WatchSignals(flashdraft::Coordinator* c) {
  std::thread([c] {
    for (int count = 0;; ++count) {
      char sig = 0;
      ssize_t n;
      while ((n = read(g_signal_pipe[0], &sig, 1)) < 0 && errno == EINTR) {
      }
      if (n <= 0) return;
      const std::string what = sig == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)";
      if (count == 0) {
        c->RequestStop(what);
      } else {
        c->Abort(absl::CancelledError(what));
      }
    }
  }).detach();
}

// What this process will hold at its peak, from the job and the shapes alone (0: not known); a
// job that cannot fit is refused before the target loads.
absl::StatusOr<int64_t> CheckMemory(const flashdraft::JobConfig& job) {
  absl::StatusOr<flashdraft::MemoryInputs> inputs = flashdraft::MemoryInputsForJob(job);
  if (!inputs.ok()) return 0;
  flashdraft::JobMemory memory =
      flashdraft::EstimateJobMemory(job, *inputs, job.cluster.max_workers, job.cluster.min_feeders);
  memory.workers = 0;  // this process only: workers and feeders may run on other hosts
  memory.feeders = 0;
  const int64_t estimate = memory.coordinator.HostBytes();
  LOG(INFO) << "expected peak memory: " << estimate / (1 << 20) << " MiB";
  if (absl::Status s =
          flashdraft::CheckJobFits(memory, flashdraft::AvailableHostMemory(), "this host");
      !s.ok()) {
    return s;
  }
  return estimate;
}

// The coordinator of `job` with the binary's model parts (online target, evaluator, initial
// weights), started and listening; its port in `port_file` when one is given.
absl::StatusOr<std::unique_ptr<flashdraft::Coordinator>> StartCoordinator(
    const flashdraft::JobConfig& job, flashdraft::NumericEnv numerics,
    const std::string& port_file) {
  flashdraft::CoordinatorOptions options;
  options.job = job;
  options.initial_weights = flashdraft::WriteInitialWeights;
  options.open_source = [](const flashdraft::JobConfig& j) {
    return j.data.source == "target" ? flashdraft::OpenTargetSource(j)
                                     : flashdraft::OpenShardBundle(j);
  };
  options.own_numerics = std::move(numerics);
  auto coordinator = flashdraft::Coordinator::Create(std::move(options));
  if (!coordinator.ok()) return coordinator.status();
  if (job.eval.every_steps > 0) {
    absl::StatusOr<flashdraft::CheckpointPipeline::Evaluator> evaluator =
        flashdraft::MakeEvaluator(job);
    if (!evaluator.ok()) return evaluator.status();
    (*coordinator)->SetEvaluator(*std::move(evaluator));
  }
  if (absl::Status started = (*coordinator)->Start(); !started.ok()) return started;
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << (*coordinator)->port() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  std::cout << "listening on port " << (*coordinator)->port() << std::endl;
  return coordinator;
}

}  // namespace

int main(int argc, char** argv) {
  flashdraft::InitLogging(argv[0]);
  CLI::App app{"flashdraft coordinator: data, schedule, membership, rendezvous"};
  std::string job_path, port_file;
  std::vector<std::string> overrides;
  int stopped_exit_code = 0;
  app.add_option("--job", job_path, "YAML job file")->required();
  app.add_option("--set", overrides, "override a field: section.field=value (repeatable)");
  app.add_option("--port-file", port_file, "write the bound port here once listening");
  app.add_option("--stopped-exit-code", stopped_exit_code,
                 "exit with this when SIGTERM/SIGINT stopped the job before its last step (after "
                 "the checkpoint), so that a scheduler starts it again (Kubernetes: 143)")
      ->capture_default_str()
      ->check(CLI::Range(0, 255));
  CLI11_PARSE(app, argc, argv);
  absl::StatusOr<flashdraft::JobConfig> job = flashdraft::LoadJobConfig(job_path);
  if (!job.ok()) return Fail(job.status());
  if (absl::Status s = flashdraft::ApplyOverrides(*job, overrides); !s.ok()) return Fail(s);
  // train.blas_kernel: OpenBLAS chose its kernel when it loaded; this starts again with the job's.
  if (absl::Status s = flashdraft::PinBlasKernel(job->train.blas_kernel, argv); !s.ok()) {
    return Fail(s);
  }
  flashdraft::NumericEnv numerics = flashdraft::ProbeNumericEnv(
      flashdraft::CudaDeviceCount() > 0 ? flashdraft::CudaDeviceName(0) : "",
      job->target.device == "cuda");
  // The target's forward and the evaluations compute with the job's thread count, as the workers
  // and the feeders do (train.intra_op_threads), not with this machine's core count.
  flashdraft::PinComputeThreads(job->train.intra_op_threads);
  if (absl::Status s = InstallSignalPipe(); !s.ok()) return Fail(s);
  absl::StatusOr<int64_t> estimate = CheckMemory(*job);
  if (!estimate.ok()) return Fail(estimate.status());
  auto coordinator = StartCoordinator(*job, std::move(numerics), port_file);
  if (!coordinator.ok()) return Fail(coordinator.status());
  WatchSignals(coordinator->get());
  absl::Status result = (*coordinator)->Run();
  LOG(INFO) << "peak memory: " << flashdraft::PeakResidentBytes() / (1 << 20) << " MiB"
            << (*estimate > 0 ? absl::StrCat(" (expected ", *estimate / (1 << 20), " MiB)") : "");
  if (stopped_exit_code != 0 &&
      (absl::IsCancelled(result) || (result.ok() && (*coordinator)->stopped_early()))) {
    LOG(INFO) << "stopped before the job's end: exit " << stopped_exit_code;
    return stopped_exit_code;
  }
  if (!result.ok()) return Fail(result);
  return 0;
}
