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
    const auto compute = static_cast<torch::ScalarType>(compute_dtype);
    const int64_t rows = hidden.size(0), step = chunk_rows;
    torch::Tensor total = torch::zeros({}, hidden.options());
    torch::Tensor hits = torch::empty({rows}, labels.options());
    torch::Tensor d_hidden = with_grad ? torch::empty_like(hidden) : torch::Tensor();
    torch::Tensor buffer;
    for (int64_t r0 = 0; r0 < rows; r0 += step) {
      const int64_t n = std::min(step, rows - r0);
      torch::Tensor logits =
          ChunkLogits(compute, hidden.narrow(0, r0, n), head, std::min(step, rows), buffer);
      const torch::Tensor lse = torch::logsumexp(logits, -1, /*keepdim=*/true);
      const torch::Tensor label = labels.narrow(0, r0, n).unsqueeze(1);
      const torch::Tensor w = weights.narrow(0, r0, n).unsqueeze(1);
      total += (w * (lse - logits.gather(1, label))).sum();
      hits.narrow(0, r0, n).copy_(logits.argmax(-1).eq(label.squeeze(1)).to(torch::kInt64));
      if (with_grad) {
        // In place: logits become (softmax − onehot) · w.
        logits.sub_(lse).exp_().scatter_add_(1, label, -torch::ones({n, 1}, logits.options()));
        logits.mul_(w);
        d_hidden.narrow(0, r0, n).copy_(MatmulIn(compute, logits, head));
      }
    }
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
    const int64_t rows = hidden.size(0), step = chunk_rows, buffer_rows = std::min(step, rows);
    torch::Tensor total = torch::zeros({}, hidden.options()), total_ce = torch::zeros_like(total),
                  total_kl = torch::zeros_like(total);
    torch::Tensor hits = torch::empty({rows}, labels.options());
    torch::Tensor d_hidden = with_grad ? torch::empty_like(hidden) : torch::Tensor();
    torch::Tensor buffer, teacher_buffer;
    for (int64_t r0 = 0; r0 < rows; r0 += step) {
      const int64_t n = std::min(step, rows - r0);
      torch::Tensor zs = ChunkLogits(compute, hidden.narrow(0, r0, n), head, buffer_rows, buffer);
      torch::Tensor zt = ChunkLogits(compute, teacher.narrow(0, r0, n).to(hidden.dtype()), head,
                                     buffer_rows, teacher_buffer);
      const torch::Tensor lse_s = torch::logsumexp(zs, -1, /*keepdim=*/true);
      const torch::Tensor lse_t = torch::logsumexp(zt, -1, /*keepdim=*/true);
      const torch::Tensor pt = (zt - lse_t).exp_();
      const torch::Tensor label = labels.narrow(0, r0, n).unsqueeze(1);
      const torch::Tensor w = weights.narrow(0, r0, n).unsqueeze(1);
      const torch::Tensor ce = lse_s - zs.gather(1, label);
      // Σ p_t·(z_t − z_s) in z_t's own memory: three [n, V] tensors live at once (z_s, z_t, p_t).
      const torch::Tensor kl = zt.sub_(zs).mul_(pt).sum(-1, /*keepdim=*/true) + (lse_s - lse_t);
      total += (w * (alpha * ce + (1 - alpha) * kl)).sum();
      total_ce += (w * ce).sum();
      total_kl += (w * kl).sum();
      hits.narrow(0, r0, n).copy_(zs.argmax(-1).eq(label.squeeze(1)).to(torch::kInt64));
      if (with_grad) {
        // In place: z_s becomes w·(p_s − α·onehot − (1−α)·p_t).
        zs.sub_(lse_s).exp_().sub_(pt, 1 - alpha);
        zs.scatter_add_(1, label, torch::full({n, 1}, -alpha, zs.options()));
        zs.mul_(w);
        d_hidden.narrow(0, r0, n).copy_(MatmulIn(compute, zs, head));
      }
    }
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
