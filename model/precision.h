// The arithmetic of a training step (train.precision, DFLASH.md "Precision" in docs/):
//  - fp32: everything in fp32;
//  - bf16: every matrix product takes bf16 inputs (the backend accumulates in fp32 and rounds its
//    result to bf16) and hands its result on in fp32; norms, RoPE, softmax / logsumexp, the loss,
//    the master weights and the optimizer stay fp32. Backward's products are bf16 the same way.
// Inference (eval, serving) is unaffected.
#pragma once

#include <torch/torch.h>

#include <string>

namespace flashdraft {

// "fp32" -> kFloat32, "bf16" -> kBFloat16; anything else: kUndefined.
torch::ScalarType ComputeDtypeFromName(const std::string& name);

// a · b (torch::matmul) with both inputs in `compute`, the result in fp32.
inline torch::Tensor MatmulIn(torch::ScalarType compute, const torch::Tensor& a,
                              const torch::Tensor& b) {
  if (compute == torch::kFloat32) return torch::matmul(a, b);
  return torch::matmul(a.to(compute), b.to(compute)).to(torch::kFloat32);
}

// x · wᵀ (a bias-free linear layer) in `compute`, the result in fp32.
inline torch::Tensor LinearIn(torch::ScalarType compute, const torch::Tensor& x,
                              const torch::Tensor& weight) {
  if (compute == torch::kFloat32) return torch::linear(x, weight);
  return torch::linear(x.to(compute), weight.to(compute)).to(torch::kFloat32);
}

}  // namespace flashdraft
