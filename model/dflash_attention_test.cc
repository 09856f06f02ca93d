#include "model/dflash_attention.h"

#include <gtest/gtest.h>

namespace flashdraft {
namespace {

struct Inputs {
  torch::Tensor q, kc, vc, kb, vb, anchors, keep;
};

Inputs MakeInputs(int64_t b, int64_t h, int64_t n, int64_t block, int64_t s, int64_t d,
                  uint64_t seed) {
  torch::manual_seed(seed);
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  Inputs in;
  in.q = torch::randn({b, h, n * block, d}, f64).requires_grad_(true);
  in.kb = torch::randn({b, h, n * block, d}, f64).requires_grad_(true);
  in.vb = torch::randn({b, h, n * block, d}, f64).requires_grad_(true);
  in.kc = torch::randn({b, h, s, d}, f64).requires_grad_(true);
  in.vc = torch::randn({b, h, s, d}, f64).requires_grad_(true);
  // Sorted anchors, including 0 (no context at all) and empty slots at the end of sample 1.
  in.anchors = std::get<0>(torch::randint(0, s - 1, {b, n}, torch::kInt64).sort(1));
  in.anchors.index_put_({0, 0}, 0);
  in.keep = torch::ones({b, n}, torch::kBool);
  if (b > 1) {
    in.keep.index_put_({1, torch::indexing::Slice(n - 2, torch::indexing::None)}, false);
    in.anchors.index_put_({1, torch::indexing::Slice(n - 2, torch::indexing::None)}, 0);
  }
  return in;
}

// The chunked kernel against the dense mask, forward and backward, at three chunkings (one block,
// a few, all).
void ExpectChunkedMatchesDense(int64_t h, int64_t window, int64_t middle_chunk_bytes,
                               uint64_t seed) {
  const int64_t b = 2, n = 5, block = 4, s = 23, d = 8;
  for (int64_t chunk_bytes : {int64_t{1}, middle_chunk_bytes, int64_t{1} << 30}) {
    SCOPED_TRACE(::testing::Message() << "window " << window << ", chunk " << chunk_bytes);
    Inputs a = MakeInputs(b, h, n, block, s, d, seed);
    Inputs r = MakeInputs(b, h, n, block, s, d, seed);
    BlockAttentionOptions options{block, chunk_bytes};
    options.sliding_window = window;
    torch::Tensor out =
        DFlashBlockAttention(a.q, a.kc, a.vc, a.kb, a.vb, a.anchors, a.keep, options);
    torch::Tensor ref =
        DFlashBlockAttentionDense(r.q, r.kc, r.vc, r.kb, r.vb, r.anchors, r.keep, block, window);
    ASSERT_FALSE(out.isnan().any().item<bool>());
    EXPECT_TRUE(torch::allclose(out, ref, 1e-10, 1e-12));
    torch::Tensor g = torch::randn_like(out);
    (out * g).sum().backward();
    (ref * g).sum().backward();
    for (auto [x, y] : std::vector<std::pair<torch::Tensor, torch::Tensor>>{
             {a.q, r.q}, {a.kc, r.kc}, {a.vc, r.vc}, {a.kb, r.kb}, {a.vb, r.vb}}) {
      EXPECT_TRUE(torch::allclose(x.grad(), y.grad(), 1e-10, 1e-12));
    }
  }
}

TEST(DFlashAttentionTest, ChunkedMatchesDenseForwardAndBackward) {
  ExpectChunkedMatchesDense(/*h=*/3, /*window=*/0, 2000, 1);
}

// Sliding-window layers: the chunked kernel (which also skips the keys before every window of a
// chunk) equals the dense mask, for windows of one block and longer.
TEST(DFlashAttentionTest, SlidingChunkedMatchesDenseForwardAndBackward) {
  for (int64_t window : {int64_t{4}, int64_t{7}, int64_t{40}}) {
    ExpectChunkedMatchesDense(/*h=*/2, window, 3000, 3);
  }
}

// The window's edges, key by key: the query at slot t of the block anchored at a sees context
// positions a + t - W < k < a and block slots <= t, and nothing else moves its output.
TEST(DFlashAttentionTest, SlidingWindowSeesExactlyItsKeys) {
  const int64_t block = 4, s = 20, d = 4, window = 6;
  Inputs in = MakeInputs(1, 1, 1, block, s, d, 4);
  torch::NoGradGuard no_grad;
  in.anchors.fill_(12);
  BlockAttentionOptions options{block, 1 << 20};
  options.sliding_window = window;
  const torch::Tensor out =
      DFlashBlockAttention(in.q, in.kc, in.vc, in.kb, in.vb, in.anchors, in.keep, options);
  for (int64_t t = 0; t < block; ++t) {
    for (int64_t k = 0; k < s; ++k) {
      torch::Tensor vc2 = in.vc.detach().clone();
      vc2.index_put_({0, 0, k}, 50.0);
      const torch::Tensor moved =
          DFlashBlockAttention(in.q, in.kc, vc2, in.kb, in.vb, in.anchors, in.keep, options);
      const bool seen = !torch::equal(moved.index({0, 0, t}), out.index({0, 0, t}));
      EXPECT_EQ(seen, k < 12 && k > 12 + t - window) << "slot " << t << ", context key " << k;
    }
    for (int64_t slot = 0; slot < block; ++slot) {
      torch::Tensor vb2 = in.vb.detach().clone();
      vb2.index_put_({0, 0, slot}, 50.0);
      const torch::Tensor moved =
          DFlashBlockAttention(in.q, in.kc, in.vc, in.kb, vb2, in.anchors, in.keep, options);
      const bool seen = !torch::equal(moved.index({0, 0, t}), out.index({0, 0, t}));
      EXPECT_EQ(seen, slot <= t) << "slot " << t << ", block key " << slot;
    }
  }
}

TEST(DFlashAttentionTest, EmptySlotsOutputZeroAndStrictContextBound) {
  const int64_t block = 4, s = 10, d = 4;
  Inputs in = MakeInputs(2, 1, 3, block, s, d, 2);
  torch::Tensor out =
      DFlashBlockAttention(in.q, in.kc, in.vc, in.kb, in.vb, in.anchors, in.keep, {block, 1 << 20});
  // Sample 1's last two blocks are empty: zero rows, no NaN.
  EXPECT_TRUE(out.index({1, 0, torch::indexing::Slice(block, 3 * block)}).eq(0).all().item<bool>());
  EXPECT_FALSE(out.isnan().any().item<bool>());
  // Changing the context key/value at the anchor position itself must not change that block.
  torch::NoGradGuard no_grad;
  const int64_t a = in.anchors.index({0, 1}).item<int64_t>();
  torch::Tensor kc2 = in.kc.detach().clone(), vc2 = in.vc.detach().clone();
  kc2.index_put_({0, 0, a}, 100.0);
  vc2.index_put_({0, 0, a}, 100.0);
  torch::Tensor out2 =
      DFlashBlockAttention(in.q, kc2, vc2, in.kb, in.vb, in.anchors, in.keep, {block, 1 << 20});
  EXPECT_TRUE(torch::allclose(out.index({0, 0, torch::indexing::Slice(block, 2 * block)}),
                              out2.index({0, 0, torch::indexing::Slice(block, 2 * block)})));
}

}  // namespace
}  // namespace flashdraft
