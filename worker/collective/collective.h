// The gradient collective (docs/ARCHITECTURE.md): Gloo on CPUs today, NCCL on GPUs with
// FLASHDRAFT_WITH_CUDA. Every call has the timeout the collective was created with; errors come
// back as absl::Status instead of exceptions.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"

namespace flashdraft {

// Asked while a wait blocks: true gives up waiting (a new membership epoch superseded the group).
using AbortCheck = std::function<bool()>;

// A collective that was started and runs on the backend's threads. Dropping it without waiting is
// safe: the backend keeps the tensors it works on alive until it is done with them.
class CollectiveWork {
 public:
  virtual ~CollectiveWork() = default;
  // Blocks until it completed; the error when it failed or timed out. With `abort`, gives up with
  // ABORTED as soon as abort() says so (a peer that went silent cannot hold the worker for the
  // whole collective timeout).
  virtual absl::Status Wait(const AbortCheck& abort = nullptr) = 0;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Starts summing one contiguous tensor across ranks in place and returns at once; the tensor must
  // stay alive and untouched until Wait() returns. Every rank must start the same sequence.
  virtual std::unique_ptr<CollectiveWork> StartAllReduceSum(torch::Tensor flat) = 0;
  // Starts an all-to-all of rows: `send` holds send_rows[q] rows for each rank q in rank order,
  // `recv` receives recv_rows[p] rows from each rank p in rank order (rows: the first dimension).
  // Both must stay alive and untouched until Wait() returns.
  virtual std::unique_ptr<CollectiveWork> StartAllToAll(torch::Tensor send, torch::Tensor recv,
                                                        std::vector<int64_t> send_rows,
                                                        std::vector<int64_t> recv_rows) = 0;
  // Starts gathering every rank's `input` into outputs[rank] (one tensor per rank, each shaped like
  // `input`, none of them `input` itself).
  virtual std::unique_ptr<CollectiveWork> StartAllGather(std::vector<torch::Tensor> outputs,
                                                         torch::Tensor input) = 0;
  // Starts sending `root`'s `tensor` into every other rank's `tensor`.
  virtual std::unique_ptr<CollectiveWork> StartBroadcast(torch::Tensor tensor, int root) = 0;
  virtual absl::Status Barrier() = 0;
  // True when destroying it ends its work in flight at once (NCCL's abort): a group left behind
  // is then destroyed. False (Gloo): a group stuck with a vanished peer is left to time out.
  virtual bool AbortsWhenDestroyed() const { return false; }
};

}  // namespace flashdraft
