// Building blocks shared by the drafter and the target decoders: RMSNorm and rotary embeddings in
// the Hugging Face Llama/Qwen convention (DFLASH.md §3).
#pragma once

#include <torch/torch.h>

namespace flashdraft {

// x · rsqrt(mean(x²) + eps) · weight, computed in fp32 and returned in x's dtype.
torch::Tensor ApplyRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// cos and sin tables [..., head_dim] for integer `positions` [...]:
// inv_freq = θ^(-2i/head_dim), emb = cat(freqs, freqs).
std::pair<torch::Tensor, torch::Tensor> RopeTables(const torch::Tensor& positions, int64_t head_dim,
                                                   double theta);

// x·cos + rotate_half(x)·sin with rotate_half(x) = cat(-x2, x1); cos/sin broadcast against x.
torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace flashdraft
