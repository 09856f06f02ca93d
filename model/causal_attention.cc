#include "model/causal_attention.h"

#include <torch/version.h>

#include <algorithm>
#include <cmath>

namespace flashdraft {
namespace {

struct Shape {
  int64_t b, heads, kv_heads, groups, s, past, d;
  double scale;
  torch::ScalarType dtype;
};

Shape ShapeOf(const torch::Tensor& q, const torch::Tensor& k) {
  Shape m;
  m.b = q.size(0);
  m.heads = q.size(1);
  m.s = q.size(2);
  m.d = q.size(3);
  m.kv_heads = k.size(1);
  m.groups = m.heads / m.kv_heads;
  m.past = k.size(2) - m.s;
  m.scale = 1.0 / std::sqrt(static_cast<double>(m.d));
  m.dtype = q.scalar_type();
  return m;
}

// The running softmax of one query tile over the keys seen so far: its row maxima, row sums of
// exp(score - max) and the values weighted by them, all fp32.
struct RunningSoftmax {
  torch::Tensor max, sum, acc;

  void Fold(const torch::Tensor& scores, const torch::Tensor& values, torch::ScalarType dtype) {
    const torch::Tensor tile_max = std::get<0>(scores.max(-1, /*keepdim=*/true));
    const torch::Tensor new_max = max.defined() ? torch::maximum(max, tile_max) : tile_max;
    const torch::Tensor p = torch::exp(scores - new_max);
    torch::Tensor pv = torch::matmul(p.to(dtype), values);
    if (dtype != torch::kFloat32) pv = pv.to(torch::kFloat32);
    if (!max.defined()) {
      sum = p.sum(-1, /*keepdim=*/true);
      acc = pv;
    } else {
      const torch::Tensor correction = torch::exp(max - new_max);
      sum = sum * correction + p.sum(-1, /*keepdim=*/true);
      acc = acc * correction + pv;
    }
    max = new_max;
  }
};

// Query positions t0 .. t0+n-1 of every query head: rows are (group, position) pairs of each
// key/value head, so one product serves all the heads that share it. Key 0 is visible to every
// query, so the first key tile leaves every row's maximum finite and later masked rows add 0.
torch::Tensor AttendQueryTile(const Shape& m, const torch::Tensor& q5, const torch::Tensor& k,
                              const torch::Tensor& v, int64_t t0, int64_t n, int64_t key_tile) {
  const torch::Tensor qt = q5.narrow(3, t0, n).reshape({m.b, m.kv_heads, m.groups * n, m.d});
  const auto positions = torch::TensorOptions().dtype(torch::kInt64).device(q5.device());
  const int64_t first = m.past + t0;  // the tile's first query position
  const int64_t end = first + n;      // keys at or past it are masked for every row
  const torch::Tensor row_pos =
      (torch::arange(first, end, positions)).repeat({m.groups}).view({-1, 1});
  RunningSoftmax run;
  for (int64_t k0 = 0; k0 < end; k0 += key_tile) {
    const int64_t kn = std::min(key_tile, end - k0);
    torch::Tensor scores = torch::matmul(qt, k.narrow(2, k0, kn).transpose(-1, -2));
    scores = scores.to(torch::kFloat32) * m.scale;
    if (k0 + kn - 1 > first) {  // some key lies after some row's position
      const torch::Tensor key_pos = torch::arange(k0, k0 + kn, positions).view({1, -1});
      scores = scores.masked_fill(key_pos > row_pos, -INFINITY);
    }
    run.Fold(scores, v.narrow(2, k0, kn), m.dtype);
  }
  return (run.acc / run.sum).to(m.dtype).view({m.b, m.kv_heads, m.groups, n, m.d});
}

#if TORCH_VERSION_MAJOR >= 2
// LibTorch 2.x's fused kernel on a GPU, where its causal mask means ours: a prefill (no cache;
// its mask is aligned top-left) or one new token (no mask at all).
bool FusedAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                    const Shape& m, torch::Tensor* out) {
  if (!q.is_cuda() || (m.past != 0 && m.s != 1)) return false;
  const torch::Tensor kr = m.groups > 1 ? k.repeat_interleave(m.groups, 1) : k;
  const torch::Tensor vr = m.groups > 1 ? v.repeat_interleave(m.groups, 1) : v;
  *out = at::scaled_dot_product_attention(q, kr, vr, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/m.past == 0 && m.s > 1);
  return true;
}
#else
bool FusedAttention(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const Shape&,
                    torch::Tensor*) {
  return false;  // LibTorch 1.x has no public fused attention
}
#endif

}  // namespace

torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const CausalAttentionOptions& options) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes(),
              "CausalAttention: q [b, heads, s, d], k and v [b, kv_heads, past+s, d]");
  TORCH_CHECK(q.size(1) % k.size(1) == 0 && k.size(2) >= q.size(2),
              "CausalAttention: heads must be a multiple of kv_heads and keys cover the queries");
  const Shape m = ShapeOf(q, k);
  torch::Tensor out;
  if (options.allow_fused && FusedAttention(q, k, v, m, &out)) return out;
  if (m.s == 0) return torch::empty_like(q);
  const int64_t query_tile = std::clamp<int64_t>(options.query_tile, 1, m.s);
  const int64_t row_bytes = m.b * m.heads * query_tile * 4;
  const int64_t key_tile = std::max<int64_t>(64, options.tile_score_bytes / row_bytes);
  const torch::Tensor q5 = q.reshape({m.b, m.kv_heads, m.groups, m.s, m.d});
  out = torch::empty({m.b, m.kv_heads, m.groups, m.s, m.d}, q.options());
  for (int64_t t0 = 0; t0 < m.s; t0 += query_tile) {
    const int64_t n = std::min(query_tile, m.s - t0);
    out.narrow(3, t0, n).copy_(AttendQueryTile(m, q5, k, v, t0, n, key_tile));
  }
  return out.view({m.b, m.heads, m.s, m.d});
}

torch::Tensor CausalAttentionDense(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v) {
  const Shape m = ShapeOf(q, k);
  const auto positions = torch::TensorOptions().dtype(torch::kInt64).device(q.device());
  const torch::Tensor q_pos = torch::arange(m.past, m.past + m.s, positions).view({-1, 1});
  const torch::Tensor k_pos = torch::arange(0, m.past + m.s, positions).view({1, -1});
  const torch::Tensor kr = m.groups > 1 ? k.repeat_interleave(m.groups, 1) : k;
  const torch::Tensor vr = m.groups > 1 ? v.repeat_interleave(m.groups, 1) : v;
  torch::Tensor scores = torch::matmul(q, kr.transpose(-1, -2)) * m.scale;
  scores = scores.masked_fill(k_pos > q_pos, -INFINITY);
  return torch::matmul(torch::softmax(scores.to(torch::kFloat32), -1).to(m.dtype), vr);
}

}  // namespace flashdraft
