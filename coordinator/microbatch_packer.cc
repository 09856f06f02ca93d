#include "coordinator/microbatch_packer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/status_macros.h"

namespace flashdraft {

MicrobatchPacker::MicrobatchPacker(int64_t batch, int64_t seq_len, int64_t feature_size,
                                   DType feature_dtype, size_t max_chunk_bytes)
    : batch_(batch),
      seq_len_(seq_len),
      feature_size_(feature_size),
      feature_dtype_(feature_dtype),
      max_chunk_bytes_(max_chunk_bytes),
      feature_bytes_(static_cast<size_t>(batch * seq_len * feature_size) *
                     ElementSize(feature_dtype)),
      ids_(std::make_shared<std::vector<int64_t>>(batch * seq_len, 0)),
      mask_(std::make_shared<std::vector<uint8_t>>(batch * seq_len, 0)),
      features_(new uint8_t[std::max<size_t>(feature_bytes_, 1)]),
      features_writer_(features_.get(), feature_bytes_, max_chunk_bytes) {
  anchors_.reserve(batch);
}

absl::Status MicrobatchPacker::Add(const Sample& sample, std::vector<int64_t> anchors) {
  const int64_t i = static_cast<int64_t>(anchors_.size());
  const int64_t len = sample.length();
  if (i >= batch_ || len > seq_len_ || sample.loss_mask.size() != sample.input_ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "microbatch of ", batch_, " x ", seq_len_, " tokens: sample ", sample.index, " (", len,
        " tokens, ", sample.loss_mask.size(), " loss mask values) does not fit as its row ", i));
  }
  std::copy(sample.input_ids.begin(), sample.input_ids.end(), ids_->begin() + i * seq_len_);
  for (int64_t t = 0; t < len; ++t) (*mask_)[i * seq_len_ + t] = sample.loss_mask[t] != 0;
  const size_t row_bytes = static_cast<size_t>(feature_size_) * ElementSize(feature_dtype_);
  FD_RETURN_IF_ERROR(features_writer_.Copy(sample.features, len * row_bytes));
  FD_RETURN_IF_ERROR(features_writer_.Zero((seq_len_ - len) * row_bytes));
  anchors_.push_back(std::move(anchors));
  return absl::OkStatus();
}

absl::Status MicrobatchPacker::Encode(std::vector<grpc::ByteBuffer>* out) {
  if (static_cast<int64_t>(anchors_.size()) != batch_) {
    return absl::FailedPreconditionError(
        absl::StrCat("microbatch of ", batch_, " samples: ", anchors_.size(), " were added"));
  }
  int64_t n = 1;
  for (const auto& a : anchors_) n = std::max<int64_t>(n, static_cast<int64_t>(a.size()));
  auto anchors = std::make_shared<std::vector<int64_t>>(batch_ * n, -1);
  for (int64_t i = 0; i < batch_; ++i) {
    std::copy(anchors_[i].begin(), anchors_[i].end(), anchors->begin() + i * n);
  }
  const int64_t b = batch_, s = seq_len_;
  const size_t chunk = max_chunk_bytes_;
  const int field = kCoordinatorMessageChunkField;
  FD_RETURN_IF_ERROR(EncodeTensorBuffers({"input_ids", DType::kI64, {b, s}}, ids_->data(),
                                         ids_->size() * 8, chunk, ids_, field, out));
  FD_RETURN_IF_ERROR(EncodeTensorBuffers({"loss_mask", DType::kU8, {b, s}}, mask_->data(),
                                         mask_->size(), chunk, mask_, field, out));
  FD_ASSIGN_OR_RETURN(const std::vector<uint32_t> crcs, features_writer_.Finish());
  FD_RETURN_IF_ERROR(EncodeTensorBuffers({"hidden_states", feature_dtype_, {b, s, feature_size_}},
                                         features_.get(), feature_bytes_, chunk, features_, field,
                                         out, crcs));
  return EncodeTensorBuffers({"anchors", DType::kI64, {b, n}}, anchors->data(), anchors->size() * 8,
                             chunk, anchors, field, out);
}

}  // namespace flashdraft
