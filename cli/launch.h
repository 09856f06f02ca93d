// `flashdraft launch job.yaml --workers N [--feeders M] [--out DIR]`: the coordinator, N workers
// (and M target feeders) as child
// processes of this one, their output interleaved with a prefix per process and kept under
// <out>/logs/, stopped together on Ctrl-C or when the job ends; a crashed worker is started
// again (--max-restarts, with back-off) and rejoins the running job. Exits non-zero if the job
// failed.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_config.h"

namespace flashdraft {

struct LaunchOptions {
  std::string job_path;
  int workers = 2;
  int feeders = 0;      // > 0: target feeders (cluster.min_feeders), started beside the workers
  std::string out_dir;  // overrides the job's output_dir
  std::vector<std::string> overrides;
  int threads_per_worker = 0;  // > 0: overrides train.intra_op_threads
  // A worker that exits with an error while the job runs is started again this many times.
  int max_restarts = 3;
  // --resume: a coordinator that crashes is started again from its newest checkpoint too.
  bool restart_coordinator = false;
  // Start even when the memory estimate exceeds the machine's available memory.
  bool skip_memory_check = false;
};

int Launch(const LaunchOptions& options);

// What `flashdraft run-rank` (run_rank.h) shares with launch.

// Sets OPENBLAS_CORETYPE to train.blas_kernel for every child started after it (empty: unchanged).
absl::Status PinChildrenBlasKernel(const std::string& kernel);
// The workers' TLS files and job secret (paths only) from the job's security section, as
// flashdraft-worker flags.
absl::StatusOr<std::vector<std::string>> WorkerSecurityArgs(const JobConfig& job,
                                                            const std::string& job_path);
// Each worker's and feeder's /metrics port goes where a person finds it (targets.json lists them
// for Prometheus).
bool WorkerMetrics(const JobConfig& job);
// <out>/logs, <out>/metrics and the job file the coordinator reads, <out>/job.yaml (returned).
absl::StatusOr<std::string> PrepareOutputDir(const JobConfig& job);

// The process binaries next to this one.
struct Binaries {
  std::string coordinator;
  std::string worker;
  std::string feeder;
};
absl::StatusOr<Binaries> FindBinaries(const JobConfig& job);

// The coordinator's port once it wrote it to `port_file`, else 0.
int ReadPort(const std::string& port_file);
// flashdraft-worker joining `coordinator` (host:port) as worker-<rank>, on cuda:<cuda_device>
// with NCCL.
std::vector<std::string> WorkerArgv(const JobConfig& job, const std::string& worker_bin,
                                    const std::string& coordinator, int rank, int cuda_device,
                                    const std::vector<std::string>& security);

}  // namespace flashdraft
