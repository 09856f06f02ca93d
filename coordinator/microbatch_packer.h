// The tensors of one microbatch as the Train stream carries them to a worker, after its Microbatch
// header: right-padded input_ids [b, s] (I64), loss_mask [b, s] (U8), hidden_states [b, s, f] (the
// source's feature dtype), anchors [b, n] (I64, -1 padded) and, when the loss distils from the
// target (train.loss kl / mix), teacher_hidden [b, s, H] (the same dtype), each as tensor chunks
// inside CoordinatorMessage (common/chunk_wire.h). The buffers are shared with gRPC, which sends
// slices of them and releases them once written; the features are packed by ChunkCrcWriters, so
// one pass copies, pads and checksums them.
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

// Which columns of a source's feature rows travel: the first `features` of each `row` elements as
// hidden_states and, when `teacher` > 0, the last `teacher` as teacher_hidden (columns between
// them, such as a teacher the loss does not use, stay behind).
struct FeatureColumns {
  int64_t row = 0;
  int64_t features = 0;
  int64_t teacher = 0;
  DType dtype = DType::kBF16;

  // A row of `row` elements whose last `teacher` are the teacher feature: the rest as
  // hidden_states, and those as teacher_hidden when `send_teacher`.
  static FeatureColumns Split(int64_t row, int64_t teacher, DType dtype, bool send_teacher) {
    return {row, row - teacher, send_teacher ? teacher : 0, dtype};
  }
  // A source's rows, its teacher sent when `send_teacher`.
  static FeatureColumns Of(const HiddenStateSource& source, bool send_teacher) {
    return Split(source.feature_size(), source.teacher_size(), source.feature_dtype(),
                 send_teacher);
  }
};

class MicrobatchPacker {
 public:
  // The tensors a microbatch carries (Microbatch.num_tensors).
  static uint32_t NumTensors(bool teacher) { return teacher ? 5 : 4; }

  // `batch` samples of at most `seq_len` tokens whose features have `columns`, sent in chunks of
  // at most `max_chunk_bytes`.
  MicrobatchPacker(int64_t batch, int64_t seq_len, const FeatureColumns& columns,
                   size_t max_chunk_bytes = kDefaultMaxChunkBytes);

  // The next sample and its anchors; an error naming the sample when it does not fit.
  absl::Status Add(const Sample& sample, std::vector<int64_t> anchors);
  // The tensors' chunk messages, appended to `out`, once; an error unless `batch` samples were
  // added.
  absl::Status Encode(std::vector<grpc::ByteBuffer>* out);

 private:
  // One [batch, seq_len, width] feature tensor, packed as samples come.
  struct Packed {
    Packed(size_t bytes, size_t max_chunk_bytes);
    size_t bytes;
    std::shared_ptr<uint8_t[]> data;
    ChunkCrcWriter writer;
  };
  absl::Status CopyColumns(const Sample& sample);

  int64_t batch_, seq_len_;
  FeatureColumns columns_;
  size_t max_chunk_bytes_;
  std::shared_ptr<std::vector<int64_t>> ids_;
  std::shared_ptr<std::vector<uint8_t>> mask_;
  Packed features_;
  std::unique_ptr<Packed> teacher_;  // with columns.teacher > 0
  std::vector<std::vector<int64_t>> anchors_;
};

}  // namespace flashdraft
