// Small DFlash formulas shared by the torch side (trainer, drafter) and the torch-free coordinator.
#pragma once

#include <cstdint>
#include <vector>

namespace flashdraft {

// Hugging Face's cosine schedule with linear warmup: lr·s/warmup while s < warmup, then
// lr·0.5·(1 + cos(π·progress)) with progress = (s − warmup)/(total − warmup), clamped to [0, 1].
double CosineLearningRate(double learning_rate, int64_t warmup_steps, int64_t total_steps,
                          int64_t step);

// acc_k = correct_k / total_k (0 where total_k = 0).
std::vector<double> SlotAccuracy(const std::vector<int64_t>& correct,
                                 const std::vector<int64_t>& total);

// τ_est = 1 + Σ_k Π_{i≤k} acc_i (DFLASH.md §4).
double TauEstimate(const std::vector<double>& slot_accuracy);

}  // namespace flashdraft
