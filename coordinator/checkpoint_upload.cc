#include "coordinator/checkpoint_upload.h"

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/dtype.h"
#include "common/security.h"

namespace flashdraft {

std::vector<TensorSpec> CheckpointUploadSpecs(const std::vector<TensorSpec>& parameters) {
  std::vector<TensorSpec> out;
  for (const TensorSpec& p : parameters) {
    out.push_back({kDrafterWeightPrefix + p.name, p.dtype, p.shape});
    for (const char* moment : {".exp_avg", ".exp_avg_sq"}) {
      out.push_back({kOptimizerStatePrefix + p.name + moment, p.dtype, p.shape});
    }
  }
  out.push_back({std::string(kOptimizerStatePrefix) + "step", DType::kI64, {1}});
  return out;
}

UploadReceiver::UploadReceiver(std::vector<TensorSpec> expected) {
  for (TensorSpec& spec : expected) {
    // The coordinator's own shapes; one that does not size (it cannot) takes no bytes.
    const uint64_t bytes = ByteSize(spec.dtype, spec.shape).value_or(0);
    max_bytes_ += bytes;
    std::string name = spec.name;
    expected_.emplace(std::move(name), Expected{std::move(spec), bytes});
  }
}

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
  if (announce.num_tensors() != expected_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("an upload of ", announce.num_tensors(),
                                                   " tensors; the drafter's state has ",
                                                   expected_.size()));
  }
  active_ = true;
  remaining_ = announce.num_tensors();
  assembler_ = std::make_unique<TensorAssembler>(
      [this](const TensorSpec& spec, uint64_t nbytes) -> absl::StatusOr<void*> {
        auto it = expected_.find(spec.name);
        if (it == expected_.end()) {
          return absl::InvalidArgumentError(absl::StrCat("tensor '", Untrusted(spec.name),
                                                         "' is not part of the drafter's state"));
        }
        const TensorSpec& want = it->second.spec;
        if (!(want == spec) || nbytes != it->second.bytes) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tensor '", spec.name, "' is ", DTypeName(spec.dtype), " ", ShapeString(spec.shape),
              "; the drafter's is ", DTypeName(want.dtype), " ", ShapeString(want.shape)));
        }
        if (!received_.insert(spec.name).second) {
          return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name, "' came twice"));
        }
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
  received_.clear();
  active_ = false;
  done_ = false;
  tensors_.clear();
  assembler_.reset();
}

}  // namespace flashdraft
