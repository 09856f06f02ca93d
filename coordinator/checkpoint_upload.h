// The receiving end of a checkpoint upload (CheckpointUpload in the protocol): the commit of a
// checkpoint step asks one worker (the epoch's rank 0) for the state after that step; it announces
// it, then sends its tensors' chunks on its Train stream, between its other messages. The upload
// stays valid across membership changes as long as that worker lives: the state after a committed
// step is the same on every member. Each chunk is checked (TensorAssembler) and the upload's bytes
// are bounded before anything is allocated: a peer cannot make the coordinator allocate more than
// the drafter's state can take.
//
// Pure logic, not thread-safe: the coordinator calls it under its lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor_codec.h"
#include "flashdraft/v1/coordinator.pb.h"

namespace flashdraft {

class UploadReceiver {
 public:
  // `max_bytes`: the most one upload may hold, all tensors together.
  explicit UploadReceiver(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // The next upload a commit asked for: `token`'s state after `completed_steps` steps. Anything
  // else is stale from then on.
  void Expect(const std::string& token, uint64_t completed_steps);
  // `token`'s upload begins. FAILED_PRECONDITION when it is not the one expected (stale: the
  // caller ignores it); INVALID_ARGUMENT when it announces no tensors or begins again while under
  // way (a broken uploader).
  absl::Status Begin(const std::string& token, const v1::CheckpointUpload& announce);
  // One chunk of the upload under way: FAILED_PRECONDITION when none is under way from `token`
  // (stale), another error when the chunk is bad or the upload outgrows max_bytes.
  absl::Status Add(const std::string& token, const v1::TensorChunk& chunk);
  // A whole upload of the state after `completed_steps` is here.
  bool Complete(uint64_t completed_steps) const {
    return !active_ && done_ && completed_steps_ == completed_steps;
  }
  // The tensors of the whole upload; the receiver is empty afterwards.
  std::vector<OwnedTensor> Take();
  // Forgets the upload and what was expected (its worker left, a failure).
  void Reset();

  bool active() const { return active_; }

 private:
  uint64_t max_bytes_;
  std::string token_;             // the expected uploader
  uint64_t completed_steps_ = 0;  // the expected state
  uint32_t remaining_ = 0;        // tensors still to come
  uint64_t bytes_ = 0;            // allocated so far
  bool active_ = false;
  bool done_ = false;
  std::vector<OwnedTensor> tensors_;
  std::unique_ptr<TensorAssembler> assembler_;
};

}  // namespace flashdraft
