#include "coordinator/checkpoint_upload.h"

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/dtype.h"

namespace flashdraft {

namespace {

uint64_t SpecBytes(const TensorSpec& spec) {
  uint64_t n = ElementSize(spec.dtype);
  for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
  return n;
}

}  // namespace

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
    std::string name = spec.name;
    expected_.emplace(std::move(name), std::move(spec));
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
  uint64_t max_bytes = 0;
  for (const auto& [name, spec] : expected_) max_bytes += SpecBytes(spec);
  assembler_ = std::make_unique<TensorAssembler>(
      [this](const TensorSpec& spec, uint64_t nbytes) -> absl::StatusOr<void*> {
        auto it = expected_.find(spec.name);
        if (it == expected_.end()) {
          return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name.substr(0, 128),
                                                         "' is not part of the drafter's state"));
        }
        if (!(it->second == spec) || nbytes != SpecBytes(spec)) {
          return absl::InvalidArgumentError(
              absl::StrCat("tensor '", spec.name, "' is ", DTypeName(spec.dtype), " ",
                           ShapeString(spec.shape), "; the drafter's is ",
                           DTypeName(it->second.dtype), " ", ShapeString(it->second.shape)));
        }
        if (!received_.insert(spec.name).second) {
          return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name, "' came twice"));
        }
        tensors_.push_back({spec, std::vector<uint8_t>(nbytes)});
        return tensors_.back().bytes.data();
      },
      max_bytes);
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
