// The tensors of one microbatch as the Train stream carries them to a worker, after its Microbatch
// header: right-padded input_ids [b, s] (I64), loss_mask [b, s] (U8), hidden_states [b, s, f] (the
// source's feature dtype) and anchors [b, n] (I64, -1 padded), each as tensor chunks inside
// CoordinatorMessage (common/chunk_wire.h). The buffers are shared with gRPC, which sends slices of
// them and releases them once written; the features are packed by a ChunkCrcWriter, so one pass
// copies, pads and checksums them.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/tensor_codec.h"
#include "coordinator/sources/hidden_state_source.h"

namespace flashdraft {

class MicrobatchPacker {
 public:
  // The tensors a microbatch carries (Microbatch.num_tensors).
  static constexpr uint32_t kNumTensors = 4;

  // `batch` samples of at most `seq_len` tokens, features of `feature_size` `feature_dtype`
  // elements per token, sent in chunks of at most `max_chunk_bytes`.
  MicrobatchPacker(int64_t batch, int64_t seq_len, int64_t feature_size, DType feature_dtype,
                   size_t max_chunk_bytes = kDefaultMaxChunkBytes);

  // The next sample and its anchors; an error naming the sample when it does not fit.
  absl::Status Add(const Sample& sample, std::vector<int64_t> anchors);
  // The four tensors' chunk messages, appended to `out`, once; an error unless `batch` samples
  // were added.
  absl::Status Encode(std::vector<grpc::ByteBuffer>* out);

 private:
  int64_t batch_, seq_len_, feature_size_;
  DType feature_dtype_;
  size_t max_chunk_bytes_;
  size_t feature_bytes_;  // of the whole hidden_states tensor
  std::shared_ptr<std::vector<int64_t>> ids_;
  std::shared_ptr<std::vector<uint8_t>> mask_;
  std::shared_ptr<uint8_t[]> features_;
  ChunkCrcWriter features_writer_;
  std::vector<std::vector<int64_t>> anchors_;
};

}  // namespace flashdraft
