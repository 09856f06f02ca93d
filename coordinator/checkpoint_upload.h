// The receiving end of a checkpoint upload (CheckpointUpload in the protocol): the commit of a
// checkpoint step asks one worker (the epoch's rank 0) for the state after that step; it announces
// it, then sends its tensors' chunks on its Train stream, between its other messages. The upload
// stays valid across membership changes as long as that worker lives: the state after a committed
// step is the same on every member. Each chunk is checked (TensorAssembler), and a tensor is
// allocated only when it is one the coordinator expects, with the dtype and shape it knows, and
// not already sent: a peer cannot make the coordinator allocate more than the drafter's state.
//
// Pure logic, not thread-safe: the coordinator calls it under its lock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor_codec.h"
#include "flashdraft/v1/coordinator.pb.h"

namespace flashdraft {

// What the upload of a drafter with these parameters (their names without prefix) holds: each
// parameter as "drafter." + name, its AdamW moments as "adamw." + name + ".exp_avg"/".exp_avg_sq"
// (same dtype and shape), and "adamw.step" (I64 [1]) — what the worker's SnapshotState sends.
std::vector<TensorSpec> CheckpointUploadSpecs(const std::vector<TensorSpec>& parameters);

class UploadReceiver {
 public:
  // `expected`: every tensor an upload holds (names, dtypes, shapes; CheckpointSpecs).
  explicit UploadReceiver(std::vector<TensorSpec> expected);

  // The next upload a commit asked for: `token`'s state after `completed_steps` steps. Anything
  // else is stale from then on.
  void Expect(const std::string& token, uint64_t completed_steps);
  // `token`'s upload begins. FAILED_PRECONDITION when it is not the one expected (stale: the
  // caller ignores it); INVALID_ARGUMENT when it announces another number of tensors than expected
  // or begins again while under way (a broken uploader).
  absl::Status Begin(const std::string& token, const v1::CheckpointUpload& announce);
  // One chunk of the upload under way: FAILED_PRECONDITION when none is under way from `token`
  // (stale), INVALID_ARGUMENT when the chunk is bad or its tensor is not an expected one (another
  // name, dtype or shape, or sent twice).
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
  struct Expected {
    TensorSpec spec;
    uint64_t bytes = 0;
  };
  std::map<std::string, Expected> expected_;
  uint64_t max_bytes_ = 0;          // all of them together
  std::set<std::string> received_;  // names allocated in this upload
  std::string token_;               // the expected uploader
  uint64_t completed_steps_ = 0;    // the expected state
  uint32_t remaining_ = 0;          // tensors still to come
  bool active_ = false;
  bool done_ = false;
  std::vector<OwnedTensor> tensors_;
  std::unique_ptr<TensorAssembler> assembler_;
};

}  // namespace flashdraft
