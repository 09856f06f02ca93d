// Causal self-attention of the target decoders in memory linear in the sequence length: the
// scores are formed one tile of queries × keys at a time and folded into a running softmax
// (max, sum, weighted values) as flash attention does, so the [S, S] score matrix of the dense form
// never exists. Tiles past a query tile's last position are skipped (half the dense work). Grouped
// query attention shares each key/value head between its query heads without repeating it.
// On a GPU LibTorch 2.x, prefill and single-token decode use its fused
// scaled_dot_product_attention.
#pragma once

#include <torch/torch.h>

namespace flashdraft {

struct CausalAttentionOptions {
  // Query positions per tile (all query heads of a key/value head together).
  int64_t query_tile = 256;
  // Upper bound on the bytes of one tile's fp32 scores (whole batch, all heads); sets the key tile.
  int64_t tile_score_bytes = int64_t{32} << 20;
  // The fused kernel where the device and LibTorch have one (tests turn it off to compare).
  bool allow_fused = true;
};

// q: [b, heads, s, d], the new tokens at positions past .. past+s-1 where past = k.size(2) - s;
// k, v: [b, kv_heads, past+s, d] (a KV cache followed by the new tokens), heads a multiple of
// kv_heads. Query t attends to keys 0 .. past+t. Returns [b, heads, s, d] in q's dtype; scores,
// softmax and the running sums are fp32, the products in q's dtype.
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const CausalAttentionOptions& options = {});

// The same with the whole [s, past+s] score matrix per head (GQA heads repeated), for tests.
torch::Tensor CausalAttentionDense(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v);

}  // namespace flashdraft
