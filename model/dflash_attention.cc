#include "model/dflash_attention.h"

#include <cmath>

#include "model/precision.h"

namespace flashdraft {
namespace {

using torch::indexing::Slice;

// Shapes and the scores of one chunk of blocks [j0, j0 + nc).
// Context keys [kv_begin, kv_end) are the only ones any query of the chunk may see.
struct Chunk {
  int64_t j0, nc, kv_begin, kv_end;
  int64_t kv_len() const { return kv_end - kv_begin; }
};

struct Dims {
  int64_t b, h, nb, d, s, n, block;
  int64_t window;  // 0: full attention
  double scale;
  torch::ScalarType compute;
};

Dims DimsOf(const torch::Tensor& q, const torch::Tensor& kc, int64_t block,
            torch::ScalarType compute = torch::kFloat32, int64_t window = 0) {
  Dims m;
  m.compute = compute;
  m.window = window;
  m.b = q.size(0);
  m.h = q.size(1);
  m.nb = q.size(2);
  m.d = q.size(3);
  m.s = kc.size(2);
  m.block = block;
  m.n = m.nb / block;
  m.scale = 1.0 / std::sqrt(static_cast<double>(m.d));
  return m;
}

std::vector<Chunk> PlanChunks(const Dims& m, const torch::Tensor& anchors,
                              const torch::Tensor& keep, const torch::Tensor& begin,
                              int64_t chunk_score_bytes) {
  const int64_t per_block = m.b * m.h * m.block * (m.s + m.block) * 4;
  const int64_t blocks_per_chunk =
      std::max<int64_t>(1, chunk_score_bytes / std::max<int64_t>(1, per_block));
  // Context keys past the chunk's largest anchor are masked for every query in it, and so are
  // those before the window (or the sample) of its earliest kept block's first slot: skip them.
  const torch::Tensor anchors_cpu = anchors.to(torch::kCPU).contiguous();
  const torch::Tensor keep_cpu = keep.to(torch::kCPU).contiguous();
  const torch::Tensor begin_cpu = begin.to(torch::kCPU).contiguous();
  const int64_t* a = anchors_cpu.data_ptr<int64_t>();
  const bool* kept = keep_cpu.data_ptr<bool>();
  const int64_t* first = begin_cpu.data_ptr<int64_t>();
  std::vector<Chunk> chunks;
  for (int64_t j0 = 0; j0 < m.n; j0 += blocks_per_chunk) {
    const int64_t nc = std::min(blocks_per_chunk, m.n - j0);
    int64_t kv_end = 0, kv_begin = m.s;
    for (int64_t i = 0; i < m.b; ++i) {
      for (int64_t j = j0; j < j0 + nc; ++j) {
        kv_end = std::max(kv_end, a[i * m.n + j]);
        if (kept[i * m.n + j]) {
          const int64_t window_first = m.window > 0 ? a[i * m.n + j] - m.window + 1 : 0;
          kv_begin = std::min(kv_begin, std::max(window_first, first[i * m.n + j]));
        }
      }
    }
    kv_end = std::min(kv_end, m.s);
    chunks.push_back({j0, nc, std::clamp<int64_t>(kv_begin, 0, kv_end), kv_end});
  }
  return chunks;
}

// Probabilities of one chunk: pc [b,h,Q,kv_end] over context keys, pb [b,h,nc,B,B] within blocks.
// With `lse` given (backward) they are recomputed from it; otherwise lse_out receives it.
std::pair<torch::Tensor, torch::Tensor> ChunkProbs(
    const Dims& m, const Chunk& c, const torch::Tensor& qs, const torch::Tensor& kc,
    const torch::Tensor& kbs, const torch::Tensor& anchors, const torch::Tensor& keep,
    const torch::Tensor& begin, const torch::Tensor* lse_in, torch::Tensor* lse_out) {
  const int64_t rows = c.nc * m.block;
  const torch::Tensor a_rows = anchors.narrow(1, c.j0, c.nc).repeat_interleave(m.block, 1);
  const torch::Tensor keep_chunk = keep.narrow(1, c.j0, c.nc);
  const torch::Tensor keep_rows = keep_chunk.repeat_interleave(m.block, 1);
  const torch::Tensor kv = torch::arange(c.kv_begin, c.kv_end, anchors.options());
  // Strict bound: the anchor token itself is the block's first slot, not context.
  const torch::Tensor begin_rows = begin.narrow(1, c.j0, c.nc).repeat_interleave(m.block, 1);
  torch::Tensor ctx_allowed = (kv.view({1, 1, -1}) < a_rows.unsqueeze(-1))
                                  .logical_and(kv.view({1, 1, -1}) >= begin_rows.unsqueeze(-1))
                                  .logical_and(keep_rows.unsqueeze(-1));
  torch::Tensor blk_allowed = keep_chunk.view({m.b, 1, c.nc, 1, 1});
  if (m.window > 0) {
    const torch::Tensor slot = torch::arange(m.block, anchors.options());
    const torch::Tensor lowest = a_rows + slot.repeat({c.nc}).unsqueeze(0) - (m.window - 1);
    ctx_allowed = ctx_allowed.logical_and(kv.view({1, 1, -1}) >= lowest.unsqueeze(-1));
    blk_allowed = blk_allowed.logical_and(slot.view({1, -1}) <= slot.view({-1, 1}));
  }
  torch::Tensor sc =
      MatmulIn(m.compute, qs, kc.narrow(2, c.kv_begin, c.kv_len()).transpose(-1, -2)) * m.scale;
  sc = sc.masked_fill(ctx_allowed.unsqueeze(1).logical_not(), -INFINITY);
  const torch::Tensor qblk = qs.view({m.b, m.h, c.nc, m.block, m.d});
  torch::Tensor sb = MatmulIn(m.compute, qblk, kbs.transpose(-1, -2)) * m.scale;
  sb = sb.masked_fill(blk_allowed.logical_not(), -INFINITY);
  const torch::Tensor all = torch::cat({sc, sb.view({m.b, m.h, rows, m.block})}, -1);
  torch::Tensor lse;
  if (lse_in != nullptr) {
    lse = lse_in->narrow(2, c.j0 * m.block, rows);
  } else {
    lse = torch::logsumexp(all, -1);
    // Rows with nothing to attend to: lse = -inf; use 0 so that exp(-inf - 0) = 0, not NaN.
    lse = torch::where(torch::isinf(lse), torch::zeros_like(lse), lse);
    *lse_out = lse;
  }
  const torch::Tensor p = torch::exp(all - lse.unsqueeze(-1));
  return {p.narrow(-1, 0, c.kv_len()),
          p.narrow(-1, c.kv_len(), m.block).reshape({m.b, m.h, c.nc, m.block, m.block})};
}

class BlockAttentionFunction : public torch::autograd::Function<BlockAttentionFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& kc, const torch::Tensor& vc,
                               const torch::Tensor& kb, const torch::Tensor& vb,
                               const torch::Tensor& anchors, const torch::Tensor& keep,
                               const torch::Tensor& begin, int64_t block, int64_t chunk_score_bytes,
                               int64_t compute, int64_t window) {
    const Dims m = DimsOf(q, kc, block, static_cast<torch::ScalarType>(compute), window);
    torch::Tensor out = torch::empty_like(q);
    torch::Tensor lse = torch::empty({m.b, m.h, m.nb}, q.options());
    for (const Chunk& c : PlanChunks(m, anchors, keep, begin, chunk_score_bytes)) {
      const int64_t rows = c.nc * m.block;
      const torch::Tensor qs = q.narrow(2, c.j0 * m.block, rows);
      const torch::Tensor kbs =
          kb.narrow(2, c.j0 * m.block, rows).view({m.b, m.h, c.nc, m.block, m.d});
      const torch::Tensor vbs =
          vb.narrow(2, c.j0 * m.block, rows).view({m.b, m.h, c.nc, m.block, m.d});
      torch::Tensor lse_chunk;
      auto [pc, pb] = ChunkProbs(m, c, qs, kc, kbs, anchors, keep, begin, nullptr, &lse_chunk);
      torch::Tensor o = MatmulIn(m.compute, pc, vc.narrow(2, c.kv_begin, c.kv_len())) +
                        MatmulIn(m.compute, pb, vbs).view({m.b, m.h, rows, m.d});
      out.narrow(2, c.j0 * m.block, rows).copy_(o);
      lse.narrow(2, c.j0 * m.block, rows).copy_(lse_chunk);
    }
    ctx->save_for_backward({q, kc, vc, kb, vb, anchors, keep, begin, out, lse});
    ctx->saved_data["block"] = block;
    ctx->saved_data["chunk_score_bytes"] = chunk_score_bytes;
    ctx->saved_data["compute"] = compute;
    ctx->saved_data["window"] = window;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &kc = saved[1], &vc = saved[2], &kb = saved[3],
                        &vb = saved[4], &anchors = saved[5], &keep = saved[6], &begin = saved[7],
                        &out = saved[8], &lse = saved[9];
    const int64_t block = ctx->saved_data["block"].toInt();
    const Dims m =
        DimsOf(q, kc, block, static_cast<torch::ScalarType>(ctx->saved_data["compute"].toInt()),
               ctx->saved_data["window"].toInt());
    const torch::Tensor d_out = grads[0].contiguous();
    torch::Tensor dq = torch::zeros_like(q), dkc = torch::zeros_like(kc),
                  dvc = torch::zeros_like(vc), dkb = torch::zeros_like(kb),
                  dvb = torch::zeros_like(vb);
    for (const Chunk& c :
         PlanChunks(m, anchors, keep, begin, ctx->saved_data["chunk_score_bytes"].toInt())) {
      const int64_t rows = c.nc * m.block;
      const int64_t r0 = c.j0 * m.block;
      const torch::Tensor qs = q.narrow(2, r0, rows);
      const torch::Tensor qblk = qs.view({m.b, m.h, c.nc, m.block, m.d});
      const torch::Tensor kbs = kb.narrow(2, r0, rows).view({m.b, m.h, c.nc, m.block, m.d});
      const torch::Tensor vbs = vb.narrow(2, r0, rows).view({m.b, m.h, c.nc, m.block, m.d});
      const torch::Tensor kcs = kc.narrow(2, c.kv_begin, c.kv_len()),
                          vcs = vc.narrow(2, c.kv_begin, c.kv_len());
      auto [pc, pb] = ChunkProbs(m, c, qs, kc, kbs, anchors, keep, begin, &lse, nullptr);
      const torch::Tensor dos = d_out.narrow(2, r0, rows);
      const torch::Tensor dob = dos.view({m.b, m.h, c.nc, m.block, m.d});
      // softmax backward: dS = P ⊙ (dP − rowsum(dO ⊙ O))
      const torch::Tensor delta = (dos * out.narrow(2, r0, rows)).sum(-1, /*keepdim=*/true);
      const torch::Tensor dsc = pc * (MatmulIn(m.compute, dos, vcs.transpose(-1, -2)) - delta);
      const torch::Tensor dsb = pb * (MatmulIn(m.compute, dob, vbs.transpose(-1, -2)) -
                                      delta.view({m.b, m.h, c.nc, m.block, 1}));
      dvc.narrow(2, c.kv_begin, c.kv_len()).add_(MatmulIn(m.compute, pc.transpose(-1, -2), dos));
      dvb.narrow(2, r0, rows)
          .copy_(MatmulIn(m.compute, pb.transpose(-1, -2), dob).view({m.b, m.h, rows, m.d}));
      dq.narrow(2, r0, rows)
          .copy_((MatmulIn(m.compute, dsc, kcs) +
                  MatmulIn(m.compute, dsb, kbs).view({m.b, m.h, rows, m.d})) *
                 m.scale);
      dkc.narrow(2, c.kv_begin, c.kv_len())
          .add_(MatmulIn(m.compute, dsc.transpose(-1, -2), qs) * m.scale);
      dkb.narrow(2, r0, rows)
          .copy_(MatmulIn(m.compute, dsb.transpose(-1, -2), qblk).view({m.b, m.h, rows, m.d}) *
                 m.scale);
    }
    return {dq,
            dkc,
            dvc,
            dkb,
            dvb,
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor DFlashBlockAttention(const torch::Tensor& q, const torch::Tensor& kc,
                                   const torch::Tensor& vc, const torch::Tensor& kb,
                                   const torch::Tensor& vb, const torch::Tensor& anchors,
                                   const torch::Tensor& keep, const BlockAttentionOptions& options,
                                   const torch::Tensor& context_begin) {
  TORCH_CHECK(q.dim() == 4 && q.size(2) % options.block_size == 0,
              "DFlashBlockAttention: q must be [b, heads, N*B, d]");
  TORCH_CHECK(anchors.scalar_type() == torch::kInt64 && keep.scalar_type() == torch::kBool,
              "DFlashBlockAttention: anchors int64, keep bool");
  const torch::Tensor begin = context_begin.defined() ? context_begin : torch::zeros_like(anchors);
  TORCH_CHECK(begin.scalar_type() == torch::kInt64 && begin.sizes() == anchors.sizes(),
              "DFlashBlockAttention: context_begin int64 like anchors");
  return BlockAttentionFunction::apply(
      q.contiguous(), kc.contiguous(), vc.contiguous(), kb.contiguous(), vb.contiguous(),
      anchors.contiguous(), keep.contiguous(), begin.contiguous(), options.block_size,
      options.chunk_score_bytes, static_cast<int64_t>(options.compute), options.sliding_window);
}

torch::Tensor DFlashBlockAttentionDense(const torch::Tensor& q, const torch::Tensor& kc,
                                        const torch::Tensor& vc, const torch::Tensor& kb,
                                        const torch::Tensor& vb, const torch::Tensor& anchors,
                                        const torch::Tensor& keep, int64_t block_size,
                                        int64_t sliding_window) {
  const Dims m = DimsOf(q, kc, block_size);
  const auto opts = anchors.options();
  const torch::Tensor j =
      torch::arange(m.nb, opts).div(block_size, "floor");  // block of each query
  const torch::Tensor kv = torch::arange(m.s + m.nb, opts);
  const torch::Tensor a = anchors.index_select(1, j);  // [b, NB]
  const torch::Tensor k = keep.index_select(1, j);     // [b, NB]
  torch::Tensor ctx_ok =
      (kv.view({1, 1, -1}) < m.s).logical_and(kv.view({1, 1, -1}) < a.unsqueeze(-1));
  torch::Tensor blk_ok =
      (kv.view({1, 1, -1}) >= m.s)
          .logical_and((kv - m.s).div(block_size, "floor").view({1, 1, -1}) == j.view({1, -1, 1}));
  if (sliding_window > 0) {  // position of query row r: a + r mod B; of block key c: a + c mod B
    const torch::Tensor t = torch::arange(m.nb, opts).remainder(block_size);
    ctx_ok = ctx_ok.logical_and(kv.view({1, 1, -1}) >
                                (a + t.view({1, -1})).unsqueeze(-1) - sliding_window);
    blk_ok =
        blk_ok.logical_and((kv - m.s).remainder(block_size).view({1, 1, -1}) <= t.view({1, -1, 1}));
  }
  const torch::Tensor allow = k.unsqueeze(-1).logical_and(ctx_ok.logical_or(blk_ok)).unsqueeze(1);
  const torch::Tensor keys = torch::cat({kc, kb}, 2), values = torch::cat({vc, vb}, 2);
  torch::Tensor scores = torch::matmul(q, keys.transpose(-1, -2)) * m.scale;
  scores = scores.masked_fill(allow.logical_not(), -INFINITY);
  torch::Tensor p = torch::softmax(scores, -1);
  p = torch::where(allow, p, torch::zeros_like(p));
  return torch::matmul(p, values);
}

}  // namespace flashdraft
