// The gradient collective (DESIGN.md §4): Gloo on CPUs today, NCCL on GPUs with
// FLASHDRAFT_WITH_CUDA. Every call has the timeout the collective was created with; errors come
// back as absl::Status instead of exceptions.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "absl/status/status.h"

namespace flashdraft {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Sums `tensors` across ranks in place (one flattened bucket per dtype).
  virtual absl::Status AllReduceSum(const std::vector<torch::Tensor>& tensors) = 0;
  // Overwrites `tensors` on every rank with root's values.
  virtual absl::Status Broadcast(const std::vector<torch::Tensor>& tensors, int root) = 0;
  virtual absl::Status Barrier() = 0;
};

}  // namespace flashdraft
