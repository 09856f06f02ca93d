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

// α·CE + (1−α)·KL(p_t ‖ p_s), chunked, against the dense formula with log_softmax (float64).
TEST(WeightedDistillationTest, ChunkedMatchesDenseValueAndGradient) {
  torch::manual_seed(1);
  const int64_t rows = 29, hidden = 16, vocab = 41;
  const torch::Tensor head = torch::randn({vocab, hidden}, torch::kFloat64);
  const torch::Tensor labels = torch::randint(0, vocab, {rows}, torch::kInt64);
  const torch::Tensor weights = torch::rand({rows}, torch::kFloat64);
  const torch::Tensor teacher = torch::randn({rows, hidden}, torch::kFloat64);
  for (double alpha : {0.0, 0.25, 0.9}) {
    for (int64_t chunk_bytes : {int64_t{1}, int64_t{vocab * 4 * 10}, int64_t{1} << 30}) {
      SCOPED_TRACE(::testing::Message() << "alpha " << alpha << ", chunk " << chunk_bytes);
      torch::Tensor h1 = torch::randn({rows, hidden}, torch::kFloat64).requires_grad_(true);
      torch::Tensor h2 = h1.detach().clone().requires_grad_(true);
      WeightedDistillation got = ChunkedWeightedDistillation(
          h1, head, labels, teacher, weights, alpha, torch::kFloat32, chunk_bytes, 1);
      const torch::Tensor log_ps = torch::log_softmax(torch::matmul(h2, head.t()), -1);
      const torch::Tensor log_pt = torch::log_softmax(torch::matmul(teacher, head.t()), -1);
      const torch::Tensor ce = -log_ps.gather(1, labels.unsqueeze(1)).squeeze(1);
      const torch::Tensor kl = (log_pt.exp() * (log_pt - log_ps)).sum(-1);
      const torch::Tensor want = (weights * (alpha * ce + (1 - alpha) * kl)).sum();
      EXPECT_NEAR(got.weighted_sum.item<double>(), want.item<double>(), 1e-10);
      EXPECT_NEAR(got.weighted_ce.item<double>(), (weights * ce).sum().item<double>(), 1e-10);
      EXPECT_NEAR(got.weighted_kl.item<double>(), (weights * kl).sum().item<double>(), 1e-10);
      EXPECT_TRUE(torch::equal(got.hits, log_ps.argmax(-1).eq(labels).to(torch::kInt64)));
      (got.weighted_sum * 3.0).backward();
      (want * 3.0).backward();
      EXPECT_TRUE(torch::allclose(h1.grad(), h2.grad(), 1e-10, 1e-12));
    }
  }
}

// KL is 0, to the bit, with a zero gradient, exactly when the drafter's logits are the target's;
// a teacher that differs in one row makes both non-zero. With α the loss is then α·CE alone.
TEST(WeightedDistillationTest, KlIsExactlyZeroWhenTheLogitsAreTheTargets) {
  torch::manual_seed(2);
  const int64_t rows = 12, hidden = 8, vocab = 300;
  const torch::Tensor head = torch::randn({vocab, hidden});
  const torch::Tensor labels = torch::randint(0, vocab, {rows}, torch::kInt64);
  const torch::Tensor weights = torch::rand({rows}) + 0.5;
  for (torch::ScalarType compute : {torch::kFloat32, torch::kBFloat16}) {
    torch::Tensor h = torch::randn({rows, hidden}).requires_grad_(true);
    WeightedDistillation same = ChunkedWeightedDistillation(h, head, labels, h.detach(), weights,
                                                            0.0, compute, vocab * 4 * 5, 1);
    EXPECT_EQ(same.weighted_kl.item<float>(), 0.0f);
    EXPECT_EQ(same.weighted_sum.item<float>(), 0.0f);
    same.weighted_sum.backward();
    EXPECT_TRUE(h.grad().eq(0).all().item<bool>());

    torch::Tensor other = h.detach().clone();
    other[3] += 0.5;
    h.mutable_grad() = torch::Tensor();
    WeightedDistillation off = ChunkedWeightedDistillation(h, head, labels, other, weights, 0.0,
                                                           compute, vocab * 4 * 5, 1);
    EXPECT_GT(off.weighted_kl.item<float>(), 0.0f);
    off.weighted_sum.backward();
    EXPECT_FALSE(h.grad().eq(0).all().item<bool>());

    WeightedDistillation mixed = ChunkedWeightedDistillation(h, head, labels, h.detach(), weights,
                                                             0.4, compute, vocab * 4 * 5, 1);
    EXPECT_EQ(mixed.weighted_kl.item<float>(), 0.0f);
    EXPECT_NEAR(mixed.weighted_sum.item<float>(), 0.4f * mixed.weighted_ce.item<float>(), 1e-4);
  }
}

}  // namespace
}  // namespace flashdraft
