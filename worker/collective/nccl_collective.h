// Collective over NCCL (docs/ARCHITECTURE.md, built with -DFLASHDRAFT_WITH_CUDA=ON):
//  - one communicator per membership epoch: rank 0 makes NCCL's unique id and puts it in the
//    rendezvous store under the epoch's prefix, every rank reads it there and joins; the
//    communicator is created non-blocking, so a superseded epoch or the timeout stops the wait;
//  - destroying the collective aborts the communicator (ncclCommAbort): kernels of a group whose
//    membership changed end at once instead of waiting for peers that are gone;
//  - every operation runs on a CUDA stream of the collective's own, after what the default stream
//    (LibTorch's) has queued, and the default stream waits for it before anything reads the result;
//  - Wait() polls the stream's event and ncclCommGetAsyncError, with the timeout on a Clock and
//    the abort check, so no wait can hang;
//  - host (CPU) tensors go through device buffers: copied into pinned memory, sent to the device
//    with async copies on the stream, reduced there, and copied back when Wait() returns. So a CPU
//    LibTorch on a GPU machine sums over NCCL too; CUDA tensors are worked on in place.
// Errors carry NCCL's or CUDA's own text. The CUDA and NCCL headers stay in the .cc.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/cuda_util.h"
#include "worker/collective/collective.h"

namespace c10d {
class Store;
}

namespace flashdraft {

struct NcclOptions {
  std::chrono::milliseconds timeout{300000};
  // The CUDA device ordinal of this rank (cuda:<local rank>, counted in CUDA_VISIBLE_DEVICES).
  int device = 0;
  const Clock* clock = &RealClock::Get();
};

// The epoch's NCCL unique id through its store: rank 0 publishes `id` (`id_size` bytes), every
// other rank waits for it, giving up with ABORTED when abort() says so and DEADLINE_EXCEEDED after
// `timeout_seconds` on `clock`. Apart from NCCL, so that it is tested without a GPU.
absl::StatusOr<std::string> ExchangeUniqueId(c10d::Store& store, int rank, int world_size,
                                             const std::string& id, size_t id_size,
                                             const Clock& clock, double timeout_seconds,
                                             const AbortCheck& abort);

class NcclCollective : public Collective {
 public:
  // Forms the communicator over `store` (already under the epoch's prefix). ABORTED when abort()
  // says so, DEADLINE_EXCEEDED after the timeout, UNAVAILABLE when NCCL fails (its message).
  static absl::StatusOr<std::unique_ptr<NcclCollective>> Create(
      c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, const NcclOptions& options,
      const AbortCheck& abort = nullptr);
  // Aborts the communicator (work in flight ends with ABORTED).
  ~NcclCollective() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::unique_ptr<CollectiveWork> StartAllReduceSum(torch::Tensor flat) override;
  std::unique_ptr<CollectiveWork> StartAllToAll(torch::Tensor send, torch::Tensor recv,
                                                std::vector<int64_t> send_rows,
                                                std::vector<int64_t> recv_rows) override;
  std::unique_ptr<CollectiveWork> StartAllGather(std::vector<torch::Tensor> outputs,
                                                 torch::Tensor input) override;
  std::unique_ptr<CollectiveWork> StartBroadcast(torch::Tensor tensor, int root) override;
  absl::Status Barrier() override;
  bool AbortsWhenDestroyed() const override { return true; }

  // The communicator's state shared with the work in flight (defined in the .cc).
  struct Impl;

 private:
  NcclCollective() = default;
  std::shared_ptr<Impl> impl_;
  int rank_ = 0, world_size_ = 1;
};

}  // namespace flashdraft
