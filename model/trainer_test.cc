#include "model/trainer.h"

#include <gtest/gtest.h>

#include "model/anchors.h"
#include "model/synthetic_data.h"

namespace flashdraft {
namespace {

TEST(AnchorsTest, CandidatesNeedTwoConsecutiveLossTokens) {
  EXPECT_EQ(AnchorCandidates(std::vector<int64_t>{0, 1, 1, 0, 1, 1, 1}),
            (std::vector<int64_t>{1, 4, 5}));
  EXPECT_TRUE(AnchorCandidates(std::vector<int64_t>{1}).empty());
}

TEST(AnchorsTest, SampledAnchorsAreSortedDistinctDeterministicCandidates) {
  std::vector<int64_t> candidates(100);
  for (int i = 0; i < 100; ++i) candidates[i] = 3 * i;
  auto a = SampleAnchors(candidates, 10, 1, 7, 3);
  EXPECT_EQ(a, SampleAnchors(candidates, 10, 1, 7, 3));
  EXPECT_NE(a, SampleAnchors(candidates, 10, 1, 8, 3));
  ASSERT_EQ(a.size(), 10u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::adjacent_find(a.begin(), a.end()), a.end());
  for (int64_t x : a) EXPECT_EQ(x % 3, 0);
  EXPECT_EQ(SampleAnchors(candidates, 500, 1, 7, 3).size(), 100u);  // min(max, count)
}

TEST(AnchorsTest, BatchMatrixPadsWithMinusOne) {
  AnchorMatrix m = SampleBatchAnchors({{1, 1, 1, 1, 1, 1}, {0, 0, 0, 1, 1, 0}}, 512, 0, 0,
                                      std::vector<uint64_t>{0, 1});
  ASSERT_EQ(m.rows, 2);
  ASSERT_EQ(m.cols, 5);
  EXPECT_EQ(std::vector<int64_t>(m.values.begin(), m.values.begin() + 5),
            (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(std::vector<int64_t>(m.values.begin() + 5, m.values.end()),
            (std::vector<int64_t>{3, -1, -1, -1, -1}));
  EXPECT_FALSE(KeepSample(std::vector<int64_t>(31, 1), 16));
  EXPECT_TRUE(KeepSample(std::vector<int64_t>(32, 1), 16));
}

TEST(ScheduleTest, CosineWithWarmupFollowsHuggingFace) {
  OptimizerOptions o;
  o.learning_rate = 1.0;
  o.warmup_steps = 4;
  o.total_steps = 104;
  EXPECT_DOUBLE_EQ(CosineLearningRate(o, 0), 0.0);
  EXPECT_DOUBLE_EQ(CosineLearningRate(o, 2), 0.5);
  EXPECT_DOUBLE_EQ(CosineLearningRate(o, 4), 1.0);
  EXPECT_NEAR(CosineLearningRate(o, 54), 0.5, 1e-12);
  EXPECT_NEAR(CosineLearningRate(o, 104), 0.0, 1e-12);
}

TEST(TrainerTest, AccumulatedMicrobatchesEqualOneBatch) {
  // Two halves with the global normaliser give the gradient of the whole batch.
  SyntheticLanguage lang = MakeSyntheticLanguage(40, 64, 0.1, 3);
  DrafterModelConfig config = SyntheticDrafterConfig(lang, 8, 32, 1);
  SyntheticBatchOptions o;
  o.batch = 4;
  o.seq_len = 48;
  o.max_anchors = 6;
  DrafterBatch whole = MakeSyntheticBatch(lang, o, 1, 0);
  auto half = [&](int64_t start) {
    DrafterBatch h;
    h.input_ids = whole.input_ids.narrow(0, start, 2);
    h.loss_mask = whole.loss_mask.narrow(0, start, 2);
    h.hidden_states = whole.hidden_states.narrow(0, start, 2);
    h.anchors = whole.anchors.narrow(0, start, 2);
    return h;
  };
  Drafter a(config), b(config);
  a->InitWeights(1);
  b->InitWeights(1);
  a->SetFrozen(lang.feature_table.narrow(1, 0, 32), lang.feature_table.narrow(1, 32, 32));
  b->SetFrozen(lang.feature_table.narrow(1, 0, 32), lang.feature_table.narrow(1, 32, 32));
  DrafterLossResult full = a->Loss(whole, 4.0);
  full.loss.backward();
  const double sum_w = full.weight_sum;
  DrafterLossResult p0 = b->Loss(half(0), 4.0, sum_w);
  p0.loss.backward();
  DrafterLossResult p1 = b->Loss(half(2), 4.0, sum_w);
  p1.loss.backward();
  EXPECT_NEAR(p0.loss.item<double>() + p1.loss.item<double>(), full.loss.item<double>(), 1e-5);
  EXPECT_NEAR(p0.weight_sum + p1.weight_sum, sum_w, 1e-6);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& item : pa) {
    EXPECT_TRUE(torch::allclose(item.value().grad(), pb[item.key()].grad(), 1e-4, 1e-6))
        << item.key();
  }
}

TEST(TrainerTest, OverfitsOneBatch) {
  torch::set_num_threads(1);
  SyntheticLanguage lang = MakeSyntheticLanguage(64, 128, 0.0, 7);
  DrafterModelConfig config = SyntheticDrafterConfig(lang, 8, 64, 1);
  SyntheticBatchOptions o;
  o.batch = 2;
  o.seq_len = 64;
  o.max_anchors = 8;
  DrafterBatch batch = MakeSyntheticBatch(lang, o, 11, 0);
  Drafter drafter(config);
  drafter->InitWeights(0);
  drafter->SetFrozen(torch::randn({64, 64}), torch::randn({64, 64}));
  OptimizerOptions opt;
  opt.learning_rate = 3e-3;
  opt.warmup_steps = 10;
  opt.total_steps = 200;
  DrafterTrainer trainer(drafter, opt);
  double first = 0;
  DrafterLossResult last;
  for (int64_t step = 0; step < 200; ++step) {
    last = trainer.Accumulate(batch, 4.0);
    if (step == 0) first = last.loss.item<double>();
    trainer.Apply(step);
  }
  const double final_loss = last.loss.item<double>();
  EXPECT_LE(final_loss * 10, first) << "first " << first << " final " << final_loss;
  EXPECT_GE(last.SlotAccuracy()[0], 0.9);
}

}  // namespace
}  // namespace flashdraft
