#include "coordinator/checkpoint_upload.h"

#include "absl/strings/str_cat.h"

namespace flashdraft {

void UploadReceiver::Expect(const std::string& token, uint64_t completed_steps) {
  Reset();
  token_ = token;
  completed_steps_ = completed_steps;
}

absl::Status UploadReceiver::Begin(const std::string& token, const v1::CheckpointUpload& announce) {
  if (token_.empty() || token != token_ || announce.completed_steps() != completed_steps_ ||
      done_) {
    return absl::FailedPreconditionError(absl::StrCat("an upload of the state after ",
                                                      announce.completed_steps(),
                                                      " steps that no commit asked it for"));
  }
  if (active_) return absl::InvalidArgumentError("a new upload began before the last one ended");
  if (announce.num_tensors() == 0) return absl::InvalidArgumentError("an upload of no tensors");
  active_ = true;
  remaining_ = announce.num_tensors();
  assembler_ = std::make_unique<TensorAssembler>(
      [this](const TensorSpec& spec, uint64_t nbytes) -> absl::StatusOr<void*> {
        if (nbytes > max_bytes_ - bytes_) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "tensor '", spec.name, "' of ", nbytes, " bytes makes the upload larger than ",
              max_bytes_, " bytes (the drafter's parameters and AdamW state)"));
        }
        bytes_ += nbytes;
        tensors_.push_back({spec, std::vector<uint8_t>(nbytes)});
        return tensors_.back().bytes.data();
      },
      max_bytes_);
  return absl::OkStatus();
}

absl::Status UploadReceiver::Add(const std::string& token, const v1::TensorChunk& chunk) {
  if (!active_ || token != token_) {
    return absl::FailedPreconditionError("a tensor chunk arrived outside an upload");
  }
  if (absl::Status s = assembler_->Add(chunk); !s.ok()) return s;
  if (!assembler_->complete()) return absl::OkStatus();
  assembler_->Reset();
  if (--remaining_ == 0) {
    active_ = false;
    done_ = true;
  }
  return absl::OkStatus();
}

std::vector<OwnedTensor> UploadReceiver::Take() {
  std::vector<OwnedTensor> out = std::move(tensors_);
  Reset();
  return out;
}

void UploadReceiver::Reset() {
  token_.clear();
  completed_steps_ = 0;
  remaining_ = 0;
  bytes_ = 0;
  active_ = false;
  done_ = false;
  tensors_.clear();
  assembler_.reset();
}

}  // namespace flashdraft
