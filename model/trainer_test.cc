#include "model/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "model/anchors.h"
#include "model/dflash_math.h"
#include "model/precision.h"
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

LearningRatePlan Plan(LrSchedule schedule, double min_lr_ratio) {
  LearningRatePlan p;
  p.schedule = schedule;
  p.learning_rate = 1.0;
  p.warmup_steps = 10;
  p.total_steps = 100;
  p.decay_steps = 20;
  p.min_lr_ratio = min_lr_ratio;
  return p;
}

TEST(ScheduleTest, EveryScheduleWarmsUpLinearlyFromZero) {
  for (LrSchedule s :
       {LrSchedule::kCosine, LrSchedule::kLinear, LrSchedule::kConstant, LrSchedule::kWsd}) {
    EXPECT_DOUBLE_EQ(LearningRateAt(Plan(s, 0.1), 0), 0.0);
    EXPECT_DOUBLE_EQ(LearningRateAt(Plan(s, 0.1), 5), 0.5);
    EXPECT_DOUBLE_EQ(LearningRateAt(Plan(s, 0.1), 10), 1.0);
  }
}

TEST(ScheduleTest, SchedulesFallToTheFloorAsHuggingFaceComputesThem) {
  // Half-way through the 90 steps after warmup: halfway between 1 and the floor 0.1.
  EXPECT_NEAR(LearningRateAt(Plan(LrSchedule::kCosine, 0.1), 55), 0.55, 1e-12);
  EXPECT_NEAR(LearningRateAt(Plan(LrSchedule::kLinear, 0.1), 55), 0.55, 1e-12);
  EXPECT_NEAR(LearningRateAt(Plan(LrSchedule::kLinear, 0.1), 99), 0.1 + 0.9 / 90, 1e-12);
  EXPECT_NEAR(LearningRateAt(Plan(LrSchedule::kLinear, 0.0), 100), 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(LearningRateAt(Plan(LrSchedule::kConstant, 0.1), 99), 1.0);
  // wsd: stable until the last 20 steps, then a straight line.
  EXPECT_DOUBLE_EQ(LearningRateAt(Plan(LrSchedule::kWsd, 0.1), 79), 1.0);
  EXPECT_DOUBLE_EQ(LearningRateAt(Plan(LrSchedule::kWsd, 0.1), 80), 1.0);
  EXPECT_NEAR(LearningRateAt(Plan(LrSchedule::kWsd, 0.1), 90), 0.55, 1e-12);
  EXPECT_NEAR(LearningRateAt(Plan(LrSchedule::kWsd, 0.1), 99), 0.1 + 0.9 / 20, 1e-12);
  // A decay longer than the steps after warmup starts at the warmup's end.
  LearningRatePlan long_decay = Plan(LrSchedule::kWsd, 0.0);
  long_decay.decay_steps = 1000;
  EXPECT_NEAR(LearningRateAt(long_decay, 55), 0.5, 1e-12);
}

// The expression every job before train.lr_schedule trained with, written out.
double EarlierCosine(double lr, int64_t warmup, int64_t total, int64_t step) {
  if (step < warmup) return lr * static_cast<double>(step) / std::max<int64_t>(1, warmup);
  const double progress = static_cast<double>(step - warmup) / std::max<int64_t>(1, total - warmup);
  return lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress))));
}

TEST(ScheduleTest, CosineWithoutAFloorIsTheEarlierScheduleToTheBit) {
  for (int64_t step = 0; step <= 100; ++step) {
    EXPECT_EQ(LearningRateAt(Plan(LrSchedule::kCosine, 0.0), step),
              EarlierCosine(1.0, 10, 100, step));
    EXPECT_EQ(CosineLearningRate(0.003, 7, 93, step), EarlierCosine(0.003, 7, 93, step));
  }
}

TEST(ScheduleTest, NamesParse) {
  LrSchedule s = LrSchedule::kCosine;
  EXPECT_TRUE(ParseLrSchedule("wsd", &s));
  EXPECT_EQ(s, LrSchedule::kWsd);
  EXPECT_TRUE(ParseLrSchedule("constant", &s));
  EXPECT_EQ(s, LrSchedule::kConstant);
  EXPECT_FALSE(ParseLrSchedule("step", &s));
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

// A drafter of the CPU demo's shape (the tiny target's hidden 128, vocabulary 832, 2 target
// features, block 8) on `device`, computing in `compute`, with the language's frozen tensors.
Drafter DemoShapeDrafter(const SyntheticLanguage& lang, const DrafterModelConfig& config,
                         uint64_t seed, torch::ScalarType compute,
                         torch::Device device = torch::kCPU) {
  Drafter d(config);
  d->InitWeights(seed);
  d->MoveTo(device);
  d->SetFrozen(lang.feature_table.narrow(1, 0, 128), lang.feature_table.narrow(1, 128, 128));
  d->SetComputeDtype(compute);
  return d;
}

// train.precision: bf16 rounds the products' inputs; one step's loss and gradients stay close to
// fp32's (the norms, softmax and loss are fp32 in both).
TEST(PrecisionTest, Bf16StepIsCloseToFp32) {
  torch::set_num_threads(1);
  SyntheticLanguage lang = MakeSyntheticLanguage(832, 256, 0.1, 5);
  DrafterModelConfig config = SyntheticDrafterConfig(lang, 8, 128, 1);
  SyntheticBatchOptions o;
  o.batch = 2;
  o.seq_len = 96;
  o.max_anchors = 8;
  DrafterBatch batch = MakeSyntheticBatch(lang, o, 3, 0);
  batch.hidden_states = batch.hidden_states.to(torch::kBFloat16);  // as they travel
  auto run = [&](torch::ScalarType compute) {
    Drafter d = DemoShapeDrafter(lang, config, 2, compute);
    DrafterLossResult r = d->Loss(batch, 4.0);
    r.loss.backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : d->parameters()) grads.push_back(p.grad().reshape(-1));
    return std::make_pair(r.loss.item<double>(), torch::cat(grads));
  };
  const auto [loss32, grad32] = run(torch::kFloat32);
  const auto [loss16, grad16] = run(torch::kBFloat16);
  EXPECT_NEAR(loss16, loss32, 0.01 * loss32);
  const double cosine =
      (grad16 * grad32).sum().item<double>() / (grad16.norm() * grad32.norm()).item<double>();
  EXPECT_GT(cosine, 0.999);
  EXPECT_NE(loss16, loss32);  // it did compute in bf16
  EXPECT_EQ(ComputeDtypeFromName("bf16"), torch::kBFloat16);
  EXPECT_EQ(ComputeDtypeFromName("fp16"), torch::ScalarType::Undefined);
}

// 50 steps of the demo's shape (the tiny target's hidden 128, 4 heads / 2 KV heads, vocabulary
// 832, 2 target features, block 8, one layer) in fp32 and in bf16 from the same start on the same
// batches: every step's bf16 loss is within 3% of fp32's, and the bf16 run learns (its loss more
// than halves).
TEST(PrecisionTest, Bf16TrainingFollowsFp32OnTheDemoShape) {
  torch::set_num_threads(1);
  SyntheticLanguage lang = MakeSyntheticLanguage(832, 256, 0.05, 9);
  DrafterModelConfig config = SyntheticDrafterConfig(lang, 8, 128, 1);
  SyntheticBatchOptions o;
  o.batch = 4;
  o.seq_len = 128;
  o.max_anchors = 16;
  constexpr int kSteps = 50;
  std::vector<DrafterBatch> batches;
  for (int i = 0; i < kSteps; ++i) {
    batches.push_back(MakeSyntheticBatch(lang, o, 100 + i, 0));
    batches.back().hidden_states = batches.back().hidden_states.to(torch::kBFloat16);
  }
  auto train = [&](torch::ScalarType compute) {
    Drafter d = DemoShapeDrafter(lang, config, 4, compute);
    OptimizerOptions opt;
    opt.learning_rate = 3e-3;
    opt.warmup_steps = 5;
    opt.total_steps = kSteps;
    DrafterTrainer trainer(d, opt);
    std::vector<double> losses;
    for (int step = 0; step < kSteps; ++step) {
      losses.push_back(trainer.Accumulate(batches[step], 4.0).loss.item<double>());
      trainer.Apply(step);
    }
    return losses;
  };
  const std::vector<double> fp32 = train(torch::kFloat32), bf16 = train(torch::kBFloat16);
  double worst = 0;
  for (int i = 0; i < kSteps; ++i) {
    const double rel = std::abs(bf16[i] - fp32[i]) / fp32[i];
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 0.03) << "step " << i << ": fp32 " << fp32[i] << ", bf16 " << bf16[i];
  }
  EXPECT_LT(bf16.back(), 0.5 * bf16.front()) << "bf16 " << bf16.front() << " -> " << bf16.back();
  std::printf("fp32 %.4f -> %.4f, bf16 %.4f -> %.4f, largest step difference %.2f%%\n",
              fp32.front(), fp32.back(), bf16.front(), bf16.back(), 100 * worst);
}

// worker.device: cuda — one step (loss, gradients, weights after AdamW) on the GPU against the CPU
// reference: fp32 within 1e-4, bf16 within the bf16-vs-fp32 tolerance above. Skipped without a
// CUDA LibTorch and a GPU (scripts/gpu-check.sh runs it on one).
TEST(DeviceTest, DrafterStepOnCudaMatchesCpu) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "needs a LibTorch built with CUDA and an NVIDIA GPU";
  }
  SyntheticLanguage lang = MakeSyntheticLanguage(832, 256, 0.1, 5);
  DrafterModelConfig config = SyntheticDrafterConfig(lang, 8, 128, 2);
  SyntheticBatchOptions o;
  o.batch = 2;
  o.seq_len = 128;
  o.max_anchors = 12;
  const DrafterBatch batch = MakeSyntheticBatch(lang, o, 3, 0);
  auto step = [&](const torch::Device& device, torch::ScalarType compute) {
    Drafter d = DemoShapeDrafter(lang, config, 2, compute, device);
    DrafterTrainer trainer(d, OptimizerOptions{});
    DrafterBatch b;
    b.input_ids = batch.input_ids.to(device);
    b.loss_mask = batch.loss_mask.to(device);
    b.hidden_states = batch.hidden_states.to(device);
    b.anchors = batch.anchors.to(device);
    const double loss = trainer.Accumulate(b, 4.0).loss.item<double>();
    std::vector<torch::Tensor> grads, weights;
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& item : d->named_parameters()) {
      grads.push_back(item.value().grad().reshape(-1).cpu());
      named.emplace_back(item.key(), grads.back());
    }
    trainer.Apply(5);
    for (const auto& p : d->parameters()) weights.push_back(p.detach().reshape(-1).cpu());
    return std::make_tuple(loss, torch::cat(grads), torch::cat(weights), named);
  };
  const auto [loss_cpu, grad_cpu, w_cpu, named_cpu] = step(torch::kCPU, torch::kFloat32);
  const auto [loss_gpu, grad_gpu, w_gpu, named_gpu] = step(torch::kCUDA, torch::kFloat32);
  EXPECT_NEAR(loss_gpu, loss_cpu, 1e-4 * loss_cpu);
  const double allowed = 1e-4 * grad_cpu.abs().max().item<double>();
  for (size_t i = 0; i < named_cpu.size(); ++i) {  // each parameter by name: where it differs
    const torch::Tensor& g_cpu = named_cpu[i].second;
    const torch::Tensor& g_gpu = named_gpu[i].second;
    EXPECT_LE((g_gpu - g_cpu).abs().max().item<double>(), allowed)
        << named_cpu[i].first << ": |grad| cpu " << g_cpu.norm().item<double>() << ", gpu "
        << g_gpu.norm().item<double>() << ", cosine "
        << (g_cpu * g_gpu).sum().item<double>() /
               (g_cpu.norm() * g_gpu.norm() + 1e-30).item<double>();
  }
  EXPECT_LE((w_gpu - w_cpu).abs().max().item<double>(), 1e-4);
  const auto [loss_bf16, grad_bf16, w_bf16, named_bf16] = step(torch::kCUDA, torch::kBFloat16);
  EXPECT_NEAR(loss_bf16, loss_cpu, 0.01 * loss_cpu);
  const double cosine = (grad_bf16 * grad_cpu).sum().item<double>() /
                        (grad_bf16.norm() * grad_cpu.norm()).item<double>();
  EXPECT_GT(cosine, 0.999);
}

}  // namespace
}  // namespace flashdraft
