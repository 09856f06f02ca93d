#include "model/weighted_cross_entropy.h"

#include <gtest/gtest.h>

namespace flashdraft {
namespace {

TEST(WeightedCrossEntropyTest, ChunkedMatchesDenseValueAndGradient) {
  torch::manual_seed(0);
  const int64_t rows = 37, hidden = 16, vocab = 53;
  const torch::Tensor head = torch::randn({vocab, hidden}, torch::kFloat64);
  const torch::Tensor labels = torch::randint(0, vocab, {rows}, torch::kInt64);
  const torch::Tensor weights = torch::rand({rows}, torch::kFloat64);
  for (int64_t chunk_bytes : {int64_t{1}, int64_t{vocab * 4 * 5}, int64_t{1} << 30}) {
    SCOPED_TRACE(chunk_bytes);
    torch::Tensor h1 = torch::randn({rows, hidden}, torch::kFloat64).requires_grad_(true);
    torch::Tensor h2 = h1.detach().clone().requires_grad_(true);
    WeightedCrossEntropy got =
        ChunkedWeightedCrossEntropy(h1, head, labels, weights, torch::kFloat32, chunk_bytes, 1);
    const torch::Tensor logits = torch::matmul(h2, head.t());
    const torch::Tensor want =
        (weights * torch::nn::functional::cross_entropy(
                       logits, labels,
                       torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone)))
            .sum();
    EXPECT_NEAR(got.weighted_sum.item<double>(), want.item<double>(), 1e-10);
    EXPECT_TRUE(torch::equal(got.hits, logits.argmax(-1).eq(labels).to(torch::kInt64)));
    (got.weighted_sum * 3.0).backward();
    (want * 3.0).backward();
    EXPECT_TRUE(torch::allclose(h1.grad(), h2.grad(), 1e-10, 1e-12));
  }
}

}  // namespace
}  // namespace flashdraft
