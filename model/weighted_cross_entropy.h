// Σ w·CE(h·Wᵀ, label) over rows without materialising the [rows, vocab] logits: rows are processed
// in chunks (64 MiB of logits by default), and each chunk's share of the gradient is formed while
// its logits exist. At Qwen3's 151,936-token vocabulary the full logits of one 3072-token sample
// with 512 anchors would take ≈ 4.7 GB, and their gradient as much again.
#pragma once

#include <torch/torch.h>

#include "model/loss_chunks.h"

namespace flashdraft {

struct WeightedCrossEntropy {
  torch::Tensor weighted_sum;  // scalar Σ w·CE, differentiable in `hidden`
  torch::Tensor hits;          // [rows] int64: argmax == label
};

// hidden [R, H] (differentiable), head [V, H] (frozen), labels [R] int64, weights [R].
// `compute`: the dtype of the products (model/precision.h; logits, softmax and the sum stay fp32).
// One chunk holds LossChunkRows(vocab, chunk_logit_bytes, min_chunk_rows) rows
// (model/loss_chunks.h).
// Distillation: each row's loss is ce_weight·CE(label) + (1 − ce_weight)·KL(p_teacher ‖ p_drafter),
// where p_teacher = softmax(teacher_row · headᵀ) is the target's own next-token distribution.
// KL is formed as Σ p_t·(z_t − z_s) + lse_s − lse_t, so it is exactly 0, and so is its gradient,
// where the drafter's logits equal the teacher's. Chunked like the cross-entropy, but three
// [rows, vocab] tensors live at once (the drafter's logits, the teacher's, its softmax), so a chunk
// gets a third of the bytes and half the minimum rows: at Qwen3's vocabulary 128 rows, about 1.5×
// the cross-entropy chunk's memory.
struct WeightedDistillation {
  torch::Tensor weighted_sum;  // scalar Σ w·(α·CE + (1−α)·KL), differentiable in `hidden`
  torch::Tensor weighted_ce;   // scalar Σ w·CE (no gradient)
  torch::Tensor weighted_kl;   // scalar Σ w·KL (no gradient)
  torch::Tensor hits;          // [rows] int64: argmax == label
};

// teacher [R, H] (frozen): the target's final-normed last hidden state at the position before
// each row's label. ce_weight α in [0, 1).
WeightedDistillation ChunkedWeightedDistillation(
    const torch::Tensor& hidden, const torch::Tensor& head, const torch::Tensor& labels,
    const torch::Tensor& teacher, const torch::Tensor& weights, double ce_weight,
    torch::ScalarType compute = torch::kFloat32, int64_t chunk_logit_bytes = kLossChunkLogitBytes,
    int64_t min_chunk_rows = kMinLossChunkRows);

WeightedCrossEntropy ChunkedWeightedCrossEntropy(
    const torch::Tensor& hidden, const torch::Tensor& head, const torch::Tensor& labels,
    const torch::Tensor& weights, torch::ScalarType compute = torch::kFloat32,
    int64_t chunk_logit_bytes = kLossChunkLogitBytes, int64_t min_chunk_rows = kMinLossChunkRows);

}  // namespace flashdraft
