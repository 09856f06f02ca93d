// The epoch's rank 0 sends its state to the coordinator after a commit that asks for a checkpoint
// (docs/ARCHITECTURE.md): the training thread takes the snapshot (SnapshotState, a copy), a thread
// of the uploader's own sends it while training goes on, one upload at a time. The coordinator
// writes the checkpoint from it (coordinator/checkpoint_upload.h).
#pragma once

#include <cstdint>
#include <functional>
#include <thread>

#include "flashdraft/v1/coordinator.pb.h"
#include "worker/fault.h"
#include "worker/training_state.h"

namespace flashdraft {

class CheckpointUploader {
 public:
  // Sends one message on the Train stream (any thread); false once the stream is gone.
  using Write = std::function<bool(v1::WorkerMessage&)>;

  // `fault`: the fault tests' upload and corrupt points (worker/fault.h).
  CheckpointUploader(Write write, FaultPlan fault);
  // Waits for the upload in flight.
  ~CheckpointUploader();
  CheckpointUploader(const CheckpointUploader&) = delete;
  CheckpointUploader& operator=(const CheckpointUploader&) = delete;

  // Waits for the previous upload, then sends `snapshot` as the state after `completed_steps`
  // steps from a thread of its own; rank `rank` of membership epoch `epoch` sends it. From one
  // thread (the training thread), as Finish.
  void Start(NamedTensors snapshot, uint64_t completed_steps, int rank, uint64_t epoch);
  // Waits for the upload in flight, if any.
  void Finish();

 private:
  // The upload thread: failures are logged (the coordinator keeps its previous checkpoint).
  void Send(const NamedTensors& snapshot, uint64_t completed_steps, int rank, uint64_t epoch) const;

  const Write write_;
  const FaultPlan fault_;
  std::thread thread_;
};

}  // namespace flashdraft
