// `flashdraft launch job.yaml --workers N [--feeders M] [--out DIR]`: the coordinator, N workers
// (and M target feeders) as child
// processes of this one, their output interleaved with a prefix per process and kept under
// <out>/logs/, stopped together on Ctrl-C or when the job ends; a crashed worker is started
// again (--max-restarts, with back-off) and rejoins the running job. Exits non-zero if the job
// failed.
#pragma once

#include <string>
#include <vector>

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

}  // namespace flashdraft
