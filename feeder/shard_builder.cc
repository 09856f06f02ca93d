#include "feeder/shard_builder.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/microbatch_packer.h"

namespace flashdraft {
namespace {

absl::Status CheckSample(const v1::ShardWork& work, const v1::FeedSample& s,
                         const FeatureLayout& layout) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("ShardWork ", work.ticket(), ": sample ", s.index(), ": ", what));
  };
  const int64_t length = s.length();
  if (length < 1 || length > s.input_ids_size() || length > layout.max_seq_len) {
    return bad(absl::StrCat("keeps ", length, " of ", s.input_ids_size(), " tokens (max_seq_len ",
                            layout.max_seq_len, ")"));
  }
  if (static_cast<int64_t>(s.loss_mask().size()) != length) {
    return bad(absl::StrCat(s.loss_mask().size(), " loss mask values for ", length, " tokens"));
  }
  for (int64_t a : s.anchors()) {
    if (a < -1 || a >= length) return bad(absl::StrCat("anchor ", a, " outside 0..", length - 1));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> ShardFeatureBytes(const v1::ShardWork& work, const FeatureLayout& layout) {
  int64_t s = 1;
  for (const v1::FeedSample& sample : work.samples()) {
    FD_RETURN_IF_ERROR(CheckSample(work, sample, layout));
    s = std::max<int64_t>(s, sample.length());
  }
  // b ≤ the samples sent and S ≤ max_seq_len: no product of wire values overflows here.
  return static_cast<uint64_t>(work.samples_size()) * static_cast<uint64_t>(s) *
         static_cast<uint64_t>(layout.feature_size) * ElementSize(layout.dtype);
}

absl::StatusOr<std::vector<grpc::ByteBuffer>> BuildShard(const v1::ShardWork& work,
                                                         const FeatureLayout& layout,
                                                         const ComputeFeatures& compute) {
  FD_RETURN_IF_ERROR(ShardFeatureBytes(work, layout).status());
  // The header the workers read is the coordinator's: it must announce what this feeder packs.
  if (const uint32_t packs = MicrobatchPacker::NumTensors(layout.teacher_size > 0);
      work.header().num_tensors() != packs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ShardWork ", work.ticket(), ": the coordinator announces ", work.header().num_tensors(),
        " tensors and this feeder packs ", packs,
        layout.teacher_size > 0 ? " (with teacher_hidden)" : " (without teacher_hidden)"));
  }
  int64_t s = 1;
  for (const v1::FeedSample& sample : work.samples()) s = std::max<int64_t>(s, sample.length());
  MicrobatchPacker packer(work.samples_size(), s,
                          FeatureColumns::Split(layout.feature_size, layout.teacher_size,
                                                layout.dtype, /*send_teacher=*/true));
  const size_t row_bytes = static_cast<size_t>(layout.feature_size) * ElementSize(layout.dtype);
  for (const v1::FeedSample& f : work.samples()) {
    Sample sample;
    sample.index = f.index();
    sample.feature_dtype = layout.dtype;
    sample.input_ids.assign(f.input_ids().begin(), f.input_ids().end());
    FD_ASSIGN_OR_RETURN(sample.owned_features, compute(sample.input_ids));
    if (sample.owned_features.size() != sample.input_ids.size() * row_bytes) {
      return absl::InternalError(absl::StrCat("sample ", f.index(), ": the target gave ",
                                              sample.owned_features.size(), " feature bytes for ",
                                              sample.input_ids.size(), " tokens of ", row_bytes));
    }
    sample.features = sample.owned_features.data();
    sample.input_ids.resize(f.length());
    sample.loss_mask.assign(f.loss_mask().begin(), f.loss_mask().end());
    FD_RETURN_IF_ERROR(packer.Add(sample, {f.anchors().begin(), f.anchors().end()}));
  }
  std::vector<grpc::ByteBuffer> chunks;
  FD_RETURN_IF_ERROR(packer.Encode(&chunks));
  return chunks;
}

}  // namespace flashdraft
