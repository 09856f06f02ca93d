// The receiving end of a checkpoint upload (CheckpointUpload in the protocol): the epoch's rank 0
// announces the state after some steps, then sends its tensors' chunks on its Train stream,
// between its other messages. Each chunk is checked (TensorAssembler) and the upload's bytes are
// bounded before anything is allocated: a peer cannot make the coordinator allocate more than the
// drafter's state can take.
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

  // `token`'s upload begins. FAILED_PRECONDITION when another is under way (the caller decides
  // whether that fails the job), INVALID_ARGUMENT for an upload of no tensors.
  absl::Status Begin(const std::string& token, const v1::CheckpointUpload& announce);
  // One chunk of the upload under way: an error when none is under way from `token`, the chunk
  // is bad or the upload outgrows max_bytes.
  absl::Status Add(const std::string& token, const v1::TensorChunk& chunk);
  // A whole upload of the state after `completed_steps` is here.
  bool Complete(uint64_t completed_steps) const {
    return !active_ && done_ && completed_steps_ == completed_steps;
  }
  // The tensors of the whole upload; the receiver is empty afterwards.
  std::vector<OwnedTensor> Take();
  // Forgets any upload (a new epoch, a failure).
  void Reset();

  bool active() const { return active_; }
  const std::string& token() const { return token_; }

 private:
  uint64_t max_bytes_;
  std::string token_;  // the uploading worker
  uint64_t completed_steps_ = 0;
  uint32_t remaining_ = 0;  // tensors still to come
  uint64_t bytes_ = 0;      // allocated so far
  bool active_ = false;
  bool done_ = false;
  std::vector<OwnedTensor> tensors_;
  std::unique_ptr<TensorAssembler> assembler_;
};

}  // namespace flashdraft
