#include "model/causal_attention.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace flashdraft {
namespace {

struct Qkv {
  torch::Tensor q, k, v;
};

// New tokens s after a cache of `past`, heads sharing kv_heads (GQA when heads > kv_heads).
Qkv MakeQkv(int64_t b, int64_t heads, int64_t kv_heads, int64_t past, int64_t s, int64_t d,
            torch::ScalarType dtype, uint64_t seed) {
  torch::manual_seed(seed);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  // Scaled up so that softmax rows are peaked: the running maximum is exercised.
  return {(torch::randn({b, heads, s, d}, f32) * 3).to(dtype),
          (torch::randn({b, kv_heads, past + s, d}, f32) * 3).to(dtype),
          torch::randn({b, kv_heads, past + s, d}, f32).to(dtype)};
}

double MaxRelativeError(const torch::Tensor& got, const torch::Tensor& want) {
  const torch::Tensor g = got.to(torch::kFloat64), w = want.to(torch::kFloat64);
  return ((g - w).abs().max() / w.abs().max()).item<double>();
}

TEST(CausalAttentionTest, TiledEqualsDenseToFp32Rounding) {
  struct Case {
    int64_t b, heads, kv_heads, past, s, query_tile;
  };
  // Several query and key tiles (the key tile is at least 64), a cache continued by several tokens
  // and by one (decode), a partial last tile, multi-head and grouped heads, a batch.
  const Case cases[] = {{1, 4, 2, 0, 300, 32},  {2, 4, 4, 0, 130, 64}, {1, 8, 2, 200, 37, 16},
                        {1, 4, 1, 257, 1, 256}, {1, 2, 2, 0, 1, 8},    {1, 6, 3, 70, 129, 128}};
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("b=", c.b, " heads=", c.heads, "/", c.kv_heads, " past=", c.past,
                              " s=", c.s, " query_tile=", c.query_tile));
    const Qkv in = MakeQkv(c.b, c.heads, c.kv_heads, c.past, c.s, 16, torch::kFloat32, 7);
    CausalAttentionOptions options;
    options.query_tile = c.query_tile;
    options.tile_score_bytes = 1;  // the smallest key tile: 64 keys
    const torch::Tensor tiled = CausalAttention(in.q, in.k, in.v, options);
    const torch::Tensor dense = CausalAttentionDense(in.q, in.k, in.v);
    ASSERT_EQ(tiled.sizes(), dense.sizes());
    EXPECT_LE(MaxRelativeError(tiled, dense), 2e-6);
    // The default tiles (one tile here) agree too.
    EXPECT_LE(MaxRelativeError(CausalAttention(in.q, in.k, in.v), dense), 2e-6);
  }
}

TEST(CausalAttentionTest, CausalityHoldsAcrossTiles) {
  // Changing the keys and values of later positions leaves earlier queries' outputs unchanged.
  Qkv in = MakeQkv(1, 4, 2, 0, 200, 16, torch::kFloat32, 11);
  CausalAttentionOptions options;
  options.query_tile = 48;
  options.tile_score_bytes = 1;
  const torch::Tensor before = CausalAttention(in.q, in.k, in.v, options);
  in.k.narrow(2, 150, 50).normal_();
  in.v.narrow(2, 150, 50).add_(100);
  const torch::Tensor after = CausalAttention(in.q, in.k, in.v, options);
  EXPECT_TRUE(torch::equal(before.narrow(2, 0, 150), after.narrow(2, 0, 150)));
  EXPECT_FALSE(torch::allclose(before.narrow(2, 150, 50), after.narrow(2, 150, 50)));
}

TEST(CausalAttentionTest, Bf16FollowsFp32) {
  const Qkv in = MakeQkv(1, 4, 2, 30, 170, 32, torch::kFloat32, 3);
  CausalAttentionOptions options;
  options.query_tile = 40;
  options.tile_score_bytes = 1;
  const torch::Tensor ref = CausalAttentionDense(in.q, in.k, in.v);
  const torch::Tensor bf16 = CausalAttention(in.q.to(torch::kBFloat16), in.k.to(torch::kBFloat16),
                                             in.v.to(torch::kBFloat16), options);
  EXPECT_EQ(bf16.scalar_type(), torch::kBFloat16);
  // Products in bf16 (8 significant bits); the running sums in fp32 keep it near the dense bf16.
  const torch::Tensor dense_bf16 = CausalAttentionDense(
      in.q.to(torch::kBFloat16), in.k.to(torch::kBFloat16), in.v.to(torch::kBFloat16));
  EXPECT_LE(MaxRelativeError(bf16, ref), 0.05);
  EXPECT_LE(MaxRelativeError(bf16, ref), 2 * MaxRelativeError(dense_bf16, ref) + 0.01);
}

TEST(DeviceTest, CausalAttentionOnCudaMatchesCpu) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "needs a LibTorch built with CUDA and an NVIDIA GPU";
  }
  struct Case {
    int64_t past, s;
  };
  // Prefill and decode take the fused kernel on LibTorch 2.x, a cache continued by a block the
  // tiled path.
  for (const Case& c : {Case{0, 300}, Case{300, 1}, Case{200, 16}}) {
    SCOPED_TRACE(absl::StrCat("past=", c.past, " s=", c.s));
    const Qkv in = MakeQkv(1, 8, 2, c.past, c.s, 64, torch::kFloat32, 5);
    const torch::Tensor cpu = CausalAttentionDense(in.q, in.k, in.v);
    const torch::Device gpu(torch::kCUDA, 0);
    const torch::Tensor fp32 =
        CausalAttention(in.q.to(gpu), in.k.to(gpu), in.v.to(gpu)).to(torch::kCPU);
    EXPECT_LE(MaxRelativeError(fp32, cpu), 1e-3);  // TF32 may be on
    const torch::Tensor bf16 =
        CausalAttention(in.q.to(gpu, torch::kBFloat16), in.k.to(gpu, torch::kBFloat16),
                        in.v.to(gpu, torch::kBFloat16))
            .to(torch::kCPU);
    EXPECT_LE(MaxRelativeError(bf16, cpu), 0.05);
  }
}

}  // namespace
}  // namespace flashdraft
