// torchrun's contract with the processes it starts (and that of what sets the same environment:
// Kubeflow's PyTorchJob, Volcano, SageMaker, Azure ML, Slurm wrapper scripts): who this process is
// (RANK of WORLD_SIZE, LOCAL_RANK of LOCAL_WORLD_SIZE on its node, GROUP_RANK the node), where the
// rendezvous store is (MASTER_ADDR:MASTER_PORT) and which attempt this is
// (TORCHELASTIC_RESTART_COUNT). No LibTorch: `flashdraft run-rank` (run_rank.h) acts on it.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace flashdraft {

struct TorchrunEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int group_rank = 0;     // the node's rank (0 where unset)
  int restart_count = 0;  // 0 on the first attempt (TORCHELASTIC_RESTART_COUNT, 0 where unset)
  std::string master_addr;
  int master_port = 0;
  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent already serves the store on MASTER_PORT
  // (its static rendezvous); otherwise rank 0 serves it there, as PyTorch's env:// does.
  bool agent_store = false;
  std::string run_id;  // TORCHELASTIC_RUN_ID ("none" where unset)

  // The ranks span more than this node (LOCAL_WORLD_SIZE unset: one process per node).
  bool MultiNode() const { return local_world_size < world_size; }
};

// From `getenv` (the process's own in production). RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
// are required; the others default as torchrun leaves them. An error names the variable and its
// value (and says this command is for torchrun when RANK is missing altogether).
absl::StatusOr<TorchrunEnv> ReadTorchrunEnv(const std::function<const char*(const char*)>& getenv);

// The store key under which rank 0 announces the coordinator's address for this attempt: a
// restarted group never reads the address of the attempt before.
std::string CoordinatorKey(const TorchrunEnv& env);

}  // namespace flashdraft
