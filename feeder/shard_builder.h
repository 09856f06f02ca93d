// A feeder's computation of one shard: the target's features of each sample of a ShardWork, packed
// into the tensor chunks a worker receives, exactly as the coordinator's in-process target packs
// them (coordinator/step_encoder.h): same sample order, truncation, padding, anchors and chunking.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "flashdraft/v1/feeder.pb.h"

namespace flashdraft {

// The target's features of a whole sample: [input_ids.size(), feature_size] elements of the
// feature dtype, row-major.
using ComputeFeatures =
    std::function<absl::StatusOr<std::vector<uint8_t>>(const std::vector<int64_t>& input_ids)>;

struct FeatureLayout {
  int64_t feature_size = 0;  // of a row, teacher columns included
  DType dtype = DType::kBF16;
  int64_t max_seq_len = 0;  // the job's: a longer kept length is refused
  // The last columns of each row: the target's final hidden state, sent as teacher_hidden.
  int64_t teacher_size = 0;
};

// The bytes of the shard's feature tensors ([b, S, feature_size], S its longest kept sample),
// for the feeder's memory budget; an error when the work is malformed (lengths beyond the job's
// max_seq_len or beyond the sample, a loss mask of another length, anchors out of range).
absl::StatusOr<uint64_t> ShardFeatureBytes(const v1::ShardWork& work, const FeatureLayout& layout);

// The shard's tensor chunk messages (not its header), the features from `compute`.
absl::StatusOr<std::vector<grpc::ByteBuffer>> BuildShard(const v1::ShardWork& work,
                                                         const FeatureLayout& layout,
                                                         const ComputeFeatures& compute);

}  // namespace flashdraft
