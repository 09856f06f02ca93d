// Collective over c10d::ProcessGroupGloo.
#pragma once

#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "absl/status/statusor.h"
#include "worker/collective/collective.h"

namespace flashdraft {

struct GlooOptions {
  std::chrono::milliseconds timeout{300000};
  // Network interface for collective traffic; empty: bind to `address`.
  std::string interface;
  // The local address to bind when no interface is named (the worker passes the one it reaches
  // the coordinator from); empty: loopback.
  std::string address;
};

class GlooCollective : public Collective {
 public:
  // Forms the group (a rendezvous over `store` with every other rank). With `abort`, gives up with
  // ABORTED when abort() says so; the rendezvous then finishes or times out on a thread of its own.
  static absl::StatusOr<std::unique_ptr<GlooCollective>> Create(
      c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, const GlooOptions& options,
      const AbortCheck& abort = nullptr);

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

 private:
  GlooCollective() = default;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  int rank_ = 0, world_size_ = 1;
};

}  // namespace flashdraft
