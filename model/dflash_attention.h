// DFlash block attention without the dense [N·B, S+N·B] score matrix (DFLASH.md §4 mask):
// query slot t of block j attends to context keys kv < anchor_j (strict) and to all B keys of its
// own block; blocks with keep_j = false attend to nothing and output zeros (no NaN).
// Scores are formed a chunk of blocks at a time, in forward and (recomputed) in backward, so peak
// memory is one chunk's [chunk·B, S] scores per head instead of the whole matrix.
#pragma once

#include <torch/torch.h>

namespace flashdraft {

struct BlockAttentionOptions {
  int64_t block_size = 16;
  // Upper bound on the bytes of one chunk's fp32 score matrix (all heads, whole batch).
  int64_t chunk_score_bytes = int64_t{64} << 20;
  // The dtype of the products (model/precision.h); scores, softmax and lse stay fp32.
  torch::ScalarType compute = torch::kFloat32;
  // 0: full attention (above). W > 0: a sliding-window layer: the query at slot t of the block
  // anchored at a (position a + t) sees context keys k with a + t - W < k < a and its block's
  // slots 0..t (causal inside the block; W ≥ block_size).
  int64_t sliding_window = 0;
};

// q, kb, vb: [b, heads, N·B, d] (block queries, keys, values); kc, vc: [b, heads, S, d] (context
// keys and values, GQA heads already repeated); anchors: [b, N] int64 (≥ 0); keep: [b, N] bool.
// context_begin: [b, N] int64, the first context position each block may see (the start of its
// sample in a row that packs several); undefined: 0. Returns [b, heads, N·B, d]. Differentiable in
// q, kc, vc, kb, vb.
torch::Tensor DFlashBlockAttention(const torch::Tensor& q, const torch::Tensor& kc,
                                   const torch::Tensor& vc, const torch::Tensor& kb,
                                   const torch::Tensor& vb, const torch::Tensor& anchors,
                                   const torch::Tensor& keep, const BlockAttentionOptions& options,
                                   const torch::Tensor& context_begin = torch::Tensor());

// The same attention with the dense mask, for tests and tiny inputs.
torch::Tensor DFlashBlockAttentionDense(const torch::Tensor& q, const torch::Tensor& kc,
                                        const torch::Tensor& vc, const torch::Tensor& kb,
                                        const torch::Tensor& vb, const torch::Tensor& anchors,
                                        const torch::Tensor& keep, int64_t block_size,
                                        int64_t sliding_window = 0);

}  // namespace flashdraft
