// Building blocks shared by the drafter and the target decoders: RMSNorm and rotary embeddings in
// the Hugging Face Llama/Qwen convention (DFLASH.md §3).
#pragma once

#include <torch/torch.h>

namespace flashdraft {

// x · rsqrt(mean(x²) + eps) · weight, computed in fp32 and returned in x's dtype.
torch::Tensor ApplyRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// inv_freq = θ^(-2i/head_dim), i = 0 .. head_dim/2 - 1, in fp64.
torch::Tensor RopeInverseFrequencies(int64_t head_dim, double theta);

// cos and sin tables [..., head_dim] (fp32) for integer `positions` [...] and fp64 `inv_freq`:
// emb = cat(freqs, freqs).
std::pair<torch::Tensor, torch::Tensor> RopeTablesFromInvFreq(const torch::Tensor& positions,
                                                              const torch::Tensor& inv_freq);

// The same with the plain inverse frequencies of θ.
std::pair<torch::Tensor, torch::Tensor> RopeTables(const torch::Tensor& positions, int64_t head_dim,
                                                   double theta);

// x·cos + rotate_half(x)·sin with rotate_half(x) = cat(-x2, x1); cos/sin broadcast against x.
torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace flashdraft
