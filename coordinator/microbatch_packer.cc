#include "coordinator/microbatch_packer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace flashdraft {

MicrobatchPacker::Packed::Packed(size_t bytes, size_t max_chunk_bytes)
    : bytes(bytes),
      data(new uint8_t[std::max<size_t>(bytes, 1)]),
      writer(data.get(), bytes, max_chunk_bytes) {}

MicrobatchPacker::MicrobatchPacker(int64_t batch, int64_t seq_len, const FeatureColumns& columns,
                                   size_t max_chunk_bytes)
    : batch_(batch),
      seq_len_(seq_len),
      columns_(columns),
      max_chunk_bytes_(max_chunk_bytes),
      ids_(std::make_shared<std::vector<int64_t>>(batch * seq_len, 0)),
      mask_(std::make_shared<std::vector<uint8_t>>(batch * seq_len, 0)),
      features_(
          static_cast<size_t>(batch * seq_len * columns.features) * ElementSize(columns.dtype),
          max_chunk_bytes) {
  CHECK(columns.features > 0 && columns.teacher >= 0 &&
        columns.features + columns.teacher <= columns.row)
      << "feature columns " << columns.features << " + " << columns.teacher << " of "
      << columns.row;
  if (columns.teacher > 0) {
    teacher_ = std::make_unique<Packed>(
        static_cast<size_t>(batch * seq_len * columns.teacher) * ElementSize(columns.dtype),
        max_chunk_bytes);
  }
  anchors_.reserve(batch);
}

namespace {

// Bytes [offset, offset + width) of each of `len` rows of `row_bytes` into `writer`, then zeros for
// the `pad` rows after them.
absl::Status CopyRowSlices(ChunkCrcWriter& writer, const uint8_t* rows, int64_t len, int64_t pad,
                           size_t row_bytes, size_t offset, size_t width) {
  if (offset == 0 && width == row_bytes) {  // whole rows: one copy
    FD_RETURN_IF_ERROR(writer.Copy(rows, len * row_bytes));
  } else {
    for (int64_t t = 0; t < len; ++t) {
      FD_RETURN_IF_ERROR(writer.Copy(rows + t * row_bytes + offset, width));
    }
  }
  return writer.Zero(pad * width);
}

}  // namespace

// The sample's rows into hidden_states (and teacher_hidden), zero-padded to seq_len.
absl::Status MicrobatchPacker::CopyColumns(const Sample& sample) {
  const int64_t len = sample.length(), pad = seq_len_ - len;
  const size_t elem = ElementSize(columns_.dtype), row_bytes = columns_.row * elem;
  FD_RETURN_IF_ERROR(CopyRowSlices(features_.writer, sample.features, len, pad, row_bytes, 0,
                                   columns_.features * elem));
  if (teacher_ == nullptr) return absl::OkStatus();
  const size_t teacher_bytes = columns_.teacher * elem;
  return CopyRowSlices(teacher_->writer, sample.features, len, pad, row_bytes,
                       row_bytes - teacher_bytes, teacher_bytes);
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
  FD_RETURN_IF_ERROR(CopyColumns(sample));
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
  const auto encode_features = [&](const char* name, int64_t width, Packed& p) -> absl::Status {
    FD_ASSIGN_OR_RETURN(const std::vector<uint32_t> crcs, p.writer.Finish());
    return EncodeTensorBuffers({name, columns_.dtype, {b, s, width}}, p.data.get(), p.bytes, chunk,
                               p.data, field, out, crcs);
  };
  FD_RETURN_IF_ERROR(encode_features("hidden_states", columns_.features, features_));
  FD_RETURN_IF_ERROR(EncodeTensorBuffers({"anchors", DType::kI64, {b, n}}, anchors->data(),
                                         anchors->size() * 8, chunk, anchors, field, out));
  if (teacher_ == nullptr) return absl::OkStatus();
  return encode_features("teacher_hidden", columns_.teacher, *teacher_);
}

}  // namespace flashdraft
