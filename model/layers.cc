#include "model/layers.h"

namespace flashdraft {

torch::Tensor ApplyRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor xf = x.to(torch::kFloat32);
  const torch::Tensor normed = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (normed * weight.to(torch::kFloat32)).to(x.scalar_type());
}

torch::Tensor RopeInverseFrequencies(int64_t head_dim, double theta) {
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  return torch::pow(theta, -torch::arange(0, head_dim, 2, f64) / static_cast<double>(head_dim));
}

std::pair<torch::Tensor, torch::Tensor> RopeTablesFromInvFreq(const torch::Tensor& positions,
                                                              const torch::Tensor& inv_freq) {
  // fp64 so that large positions (3072+) keep their phase exactly, then cast.
  const torch::Tensor freqs =
      positions.to(torch::kFloat64).unsqueeze(-1) * inv_freq.to(positions.device());
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(torch::kFloat32), emb.sin().to(torch::kFloat32)};
}

std::pair<torch::Tensor, torch::Tensor> RopeTables(const torch::Tensor& positions, int64_t head_dim,
                                                   double theta) {
  return RopeTablesFromInvFreq(positions, RopeInverseFrequencies(head_dim, theta));
}

torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor x1 = x.narrow(-1, 0, half);
  const torch::Tensor x2 = x.narrow(-1, half, half);
  return x * cos + torch::cat({-x2, x1}, -1) * sin;
}

}  // namespace flashdraft
