// The training state a worker holds and moves: what FetchTensors brings (frozen target tensors,
// starting weights, a resumed optimizer state), the state every member of a new group proves
// identical, and the checkpoint snapshot the epoch's rank 0 uploads.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "flashdraft/v1/coordinator.pb.h"
#include "model/drafter.h"
#include "worker/collective/collective.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace flashdraft {

// FetchTensors: the named tensors (empty: everything a worker starts from), within
// `timeout_seconds`.
absl::StatusOr<std::map<std::string, torch::Tensor>> FetchTensors(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& token,
    double timeout_seconds);

// Sets the drafter's frozen tensors and its starting weights from what FetchTensors sent: every
// parameter must come, with its shape, and nothing else under the weight prefix.
absl::Status LoadFetchedModel(DrafterImpl& drafter,
                              const std::map<std::string, torch::Tensor>& fetched);
// A resumed job's optimizer state (kOptimizerStatePrefix tensors) into `optimizer`; nothing when
// the coordinator sent none (a fresh start).
absl::Status LoadOptimizerState(DrafterImpl& drafter,
                                const std::map<std::string, torch::Tensor>& fetched,
                                torch::optim::AdamW& optimizer);

// After a new group formed: with `sync`, rank 0 (a member that trained) sends its parameters and
// optimizer state to everyone (a worker that joined a running job gets them so); then every
// member proves it holds the same state as rank 0 — a CRC-32C of every byte, all-gathered.
absl::Status SyncTrainingState(DrafterImpl& drafter, torch::optim::AdamW& optimizer,
                               Collective& collective, bool sync, const AbortCheck& abort);

// A copy of the state for a checkpoint, named as CheckpointUpload names it: every parameter as
// "drafter." + name, its AdamW moments as "adamw." + name + ".exp_avg" / ".exp_avg_sq", and
// "adamw.step" (I64 [1]). A copy, so that training goes on while it is sent.
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;
NamedTensors SnapshotState(DrafterImpl& drafter, torch::optim::AdamW& optimizer);
// Sends a snapshot as the state after `completed_steps` steps: the announcement, then every
// tensor's chunks, each through `write` (false: the stream is gone). `after_first_tensor` is a
// fault-test hook.
absl::Status SendCheckpoint(const NamedTensors& tensors, uint64_t completed_steps,
                            const std::function<bool(v1::WorkerMessage&)>& write,
                            const std::function<void()>& after_first_tensor);

}  // namespace flashdraft
