// How many rows one chunk of the drafter's loss holds (model/weighted_cross_entropy.h computes the
// loss chunk by chunk; model/memory_estimate.cc budgets one chunk). Torch-free.
#pragma once

#include <algorithm>
#include <cstdint>

namespace flashdraft {

inline constexpr int64_t kLossChunkLogitBytes = int64_t{64} << 20;
// Below a few hundred rows the head's matmul loses a quarter of the GEMM rate (on 2 cores at
// vocabulary 151,936: 142 GFLOP/s at 110 rows, 173 at 440), so at a large vocabulary a chunk is
// 256 rows (148 MiB at Qwen3's) rather than 64 MiB's 110.
inline constexpr int64_t kMinLossChunkRows = 256;

// chunk_logit_bytes of fp32 logits over `vocab`, but at least `min_rows` rows (and one).
inline int64_t LossChunkRows(int64_t vocab, int64_t chunk_logit_bytes = kLossChunkLogitBytes,
                             int64_t min_rows = kMinLossChunkRows) {
  return std::max<int64_t>({1, min_rows, chunk_logit_bytes / std::max<int64_t>(1, vocab * 4)});
}

// A distillation chunk forms the target's logits beside the drafter's (three [rows, vocab] fp32
// tensors at once): a third of the bytes, and half the minimum rows.
inline int64_t DistillationChunkRows(int64_t vocab,
                                     int64_t chunk_logit_bytes = kLossChunkLogitBytes,
                                     int64_t min_rows = kMinLossChunkRows) {
  return LossChunkRows(vocab, chunk_logit_bytes / 3, std::max<int64_t>(1, min_rows / 2));
}

}  // namespace flashdraft
