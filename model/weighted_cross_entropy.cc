#include "model/weighted_cross_entropy.h"

#include "model/precision.h"

namespace flashdraft {
namespace {

// One chunk's fp32 logits h · headᵀ. In fp32 they are written into `buffer` (made on the first
// chunk), so a call allocates its largest tensor once instead of a fresh block per chunk that the
// kernel page-faults and zeroes again (155 MB a chunk at Qwen3's vocabulary).
torch::Tensor ChunkLogits(torch::ScalarType compute, const torch::Tensor& h,
                          const torch::Tensor& head, int64_t rows_per_chunk,
                          torch::Tensor& buffer) {
  if (compute != torch::kFloat32) return MatmulIn(compute, h, head.t());
  if (!buffer.defined()) buffer = torch::empty({rows_per_chunk, head.size(0)}, h.options());
  torch::Tensor logits = buffer.narrow(0, 0, h.size(0));
  return torch::mm_out(logits, h, head.t());
}

// One chunk of rows [r0, r0 + n) as both losses see it.
struct LogitChunk {
  int64_t r0, n;
  torch::Tensor logits;  // [n, V] fp32: the drafter's
  torch::Tensor lse;     // [n, 1] their logsumexp
  torch::Tensor label;   // [n, 1]
  torch::Tensor w;       // [n, 1] the rows' weights
};

// The loop both losses share. For every chunk of rows: the drafter's logits, their argmax hits,
// then `loss(chunk)`, which adds the chunk's sums and, with `with_grad`, turns chunk.logits in
// place into d(loss)/d(logits) per unit weight; the loop then forms the gradient with respect to
// `hidden` while the chunk's logits exist: that times w, times head. `d_hidden`: [R, H] when
// with_grad.
template <typename ChunkLoss>
void ForEachLogitChunk(const torch::Tensor& hidden, const torch::Tensor& head,
                       const torch::Tensor& labels, const torch::Tensor& weights,
                       int64_t chunk_rows, bool with_grad, torch::ScalarType compute,
                       torch::Tensor& hits, torch::Tensor& d_hidden, ChunkLoss loss) {
  const int64_t rows = hidden.size(0), step = chunk_rows;
  torch::Tensor buffer;
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    const int64_t n = std::min(step, rows - r0);
    const torch::Tensor logits =
        ChunkLogits(compute, hidden.narrow(0, r0, n), head, std::min(step, rows), buffer);
    const LogitChunk c{r0,
                       n,
                       logits,
                       torch::logsumexp(logits, -1, /*keepdim=*/true),
                       labels.narrow(0, r0, n).unsqueeze(1),
                       weights.narrow(0, r0, n).unsqueeze(1)};
    hits.narrow(0, r0, n).copy_(c.logits.argmax(-1).eq(c.label.squeeze(1)).to(torch::kInt64));
    loss(c);
    if (with_grad) {
      c.logits.mul_(c.w);
      d_hidden.narrow(0, r0, n).copy_(MatmulIn(compute, c.logits, head));
    }
  }
}

// The gradient is formed in forward, chunk by chunk, while each chunk's logits exist:
// d(Σ w·CE)/dh = ((softmax − onehot) · w) · head, an [R, H] tensor, so backward is a scaling and no
// logits are kept or recomputed (as many matmuls as the unfused version, a fraction of its memory).
class ChunkedCrossEntropyFunction : public torch::autograd::Function<ChunkedCrossEntropyFunction> {
 public:
  // Returns {Σ w·CE, hits}; hits carry no gradient.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& hidden,
                                                const torch::Tensor& head,
                                                const torch::Tensor& labels,
                                                const torch::Tensor& weights, int64_t chunk_rows,
                                                bool with_grad, int64_t compute_dtype) {
    torch::Tensor total = torch::zeros({}, hidden.options());
    torch::Tensor hits = torch::empty({hidden.size(0)}, labels.options());
    torch::Tensor d_hidden = with_grad ? torch::empty_like(hidden) : torch::Tensor();
    ForEachLogitChunk(hidden, head, labels, weights, chunk_rows, with_grad,
                      static_cast<torch::ScalarType>(compute_dtype), hits, d_hidden,
                      [&](const LogitChunk& c) {
                        total += (c.w * (c.lse - c.logits.gather(1, c.label))).sum();
                        if (!with_grad) return;
                        // In place: logits become softmax − onehot.
                        c.logits.sub_(c.lse).exp_().scatter_add_(
                            1, c.label, -torch::ones({c.n, 1}, c.logits.options()));
                      });
    ctx->save_for_backward({d_hidden});
    ctx->mark_non_differentiable({hits});
    return {total, hits};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor d_hidden = ctx->get_saved_variables()[0];
    return {d_hidden * grads[0], torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(),     torch::Tensor(), torch::Tensor()};
  }
};

// The same with a teacher distribution (WeightedDistillation). Per chunk: d(loss)/dz_s =
// w·(p_s − α·onehot − (1−α)·p_t), formed in place of the drafter's logits.
class ChunkedDistillationFunction : public torch::autograd::Function<ChunkedDistillationFunction> {
 public:
  // Returns {Σ w·(αCE + (1−α)KL), Σ w·CE, Σ w·KL, hits}; only the first carries a gradient.
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& head,
      const torch::Tensor& labels, const torch::Tensor& teacher, const torch::Tensor& weights,
      double alpha, int64_t chunk_rows, bool with_grad, int64_t compute_dtype) {
    const auto compute = static_cast<torch::ScalarType>(compute_dtype);
    const int64_t buffer_rows = std::min(chunk_rows, hidden.size(0));
    torch::Tensor total = torch::zeros({}, hidden.options()), total_ce = torch::zeros_like(total),
                  total_kl = torch::zeros_like(total);
    torch::Tensor hits = torch::empty({hidden.size(0)}, labels.options());
    torch::Tensor d_hidden = with_grad ? torch::empty_like(hidden) : torch::Tensor();
    torch::Tensor teacher_buffer;
    ForEachLogitChunk(
        hidden, head, labels, weights, chunk_rows, with_grad, compute, hits, d_hidden,
        [&](const LogitChunk& c) {
          const torch::Tensor& zs = c.logits;
          torch::Tensor zt = ChunkLogits(compute, teacher.narrow(0, c.r0, c.n).to(hidden.dtype()),
                                         head, buffer_rows, teacher_buffer);
          const torch::Tensor lse_t = torch::logsumexp(zt, -1, /*keepdim=*/true);
          const torch::Tensor pt = (zt - lse_t).exp_();
          const torch::Tensor ce = c.lse - zs.gather(1, c.label);
          // Σ p_t·(z_t − z_s) in z_t's own memory: three [n, V] tensors live at once (z_s, z_t,
          // p_t).
          const torch::Tensor kl = zt.sub_(zs).mul_(pt).sum(-1, /*keepdim=*/true) + (c.lse - lse_t);
          total += (c.w * (alpha * ce + (1 - alpha) * kl)).sum();
          total_ce += (c.w * ce).sum();
          total_kl += (c.w * kl).sum();
          if (!with_grad) return;
          // In place: z_s becomes p_s − α·onehot − (1−α)·p_t.
          zs.sub_(c.lse).exp_().sub_(pt, 1 - alpha);
          zs.scatter_add_(1, c.label, torch::full({c.n, 1}, -alpha, zs.options()));
        });
    ctx->save_for_backward({d_hidden});
    ctx->mark_non_differentiable({total_ce, total_kl, hits});
    return {total, total_ce, total_kl, hits};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor d_hidden = ctx->get_saved_variables()[0];
    torch::autograd::variable_list out(9);
    out[0] = d_hidden * grads[0];
    return out;
  }
};

}  // namespace

WeightedDistillation ChunkedWeightedDistillation(
    const torch::Tensor& hidden, const torch::Tensor& head, const torch::Tensor& labels,
    const torch::Tensor& teacher, const torch::Tensor& weights, double ce_weight,
    torch::ScalarType compute, int64_t chunk_logit_bytes, int64_t min_chunk_rows) {
  TORCH_CHECK(ce_weight >= 0 && ce_weight < 1, "distillation: ce_weight in [0, 1)");
  TORCH_CHECK(
      teacher.dim() == 2 && teacher.size(0) == hidden.size(0) && teacher.size(1) == hidden.size(1),
      "distillation: teacher rows [R, H] like the drafter's");
  auto out = ChunkedDistillationFunction::apply(
      hidden, head.detach(), labels, teacher.detach(), weights.detach(), ce_weight,
      DistillationChunkRows(head.size(0), chunk_logit_bytes, min_chunk_rows),
      hidden.requires_grad() && torch::GradMode::is_enabled(), static_cast<int64_t>(compute));
  return {out[0], out[1], out[2], out[3]};
}

WeightedCrossEntropy ChunkedWeightedCrossEntropy(
    const torch::Tensor& hidden, const torch::Tensor& head, const torch::Tensor& labels,
    const torch::Tensor& weights, torch::ScalarType compute, int64_t chunk_logit_bytes,
    int64_t min_chunk_rows) {
  auto out = ChunkedCrossEntropyFunction::apply(
      hidden, head.detach(), labels, weights.detach(),
      LossChunkRows(head.size(0), chunk_logit_bytes, min_chunk_rows),
      hidden.requires_grad() && torch::GradMode::is_enabled(), static_cast<int64_t>(compute));
  return {out[0], out[1]};
}

}  // namespace flashdraft
