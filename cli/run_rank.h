// `flashdraft run-rank JOB.yaml`: one rank of a job started by torchrun, or by whatever sets its
// environment contract (torchrun_env.h). Rank 0 runs the coordinator and a worker as child
// processes of this one; every other rank becomes a worker. Rank 0 announces the coordinator's
// address in torchrun's rendezvous store at MASTER_ADDR:MASTER_PORT (the agent's store under its
// static rendezvous, else one rank 0 serves there, as PyTorch's env:// does), under a key of this
// restart attempt; the others read it there. Every attempt resumes from the job's newest
// checkpoint when there is one. docs/DEPLOY.md, "torchrun".
#pragma once

#include <string>
#include <vector>

namespace flashdraft {

struct RunRankOptions {
  std::string job_path;
  std::string out_dir;  // overrides the job's output_dir
  std::vector<std::string> overrides;
  // Non-zero: the coordinator and the worker exit with it when a SIGTERM stopped them before the
  // job's end, and so does this rank (a launcher that restarts on it: PyTorchJob's ExitCode).
  int stopped_exit_code = 0;
};

// The process's exit code: rank 0's is the job's; another rank's process becomes its worker.
int RunRank(const RunRankOptions& options);

}  // namespace flashdraft
