#include "model/dflash_math.h"

#include <algorithm>
#include <cmath>

namespace flashdraft {

double CosineLearningRate(double learning_rate, int64_t warmup_steps, int64_t total_steps,
                          int64_t step) {
  if (step < warmup_steps) {
    return learning_rate * static_cast<double>(step) / std::max<int64_t>(1, warmup_steps);
  }
  const double progress =
      static_cast<double>(step - warmup_steps) / std::max<int64_t>(1, total_steps - warmup_steps);
  return learning_rate * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress))));
}

std::vector<double> SlotAccuracy(const std::vector<int64_t>& correct,
                                 const std::vector<int64_t>& total) {
  std::vector<double> acc(total.size(), 0.0);
  for (size_t i = 0; i < acc.size() && i < correct.size(); ++i) {
    if (total[i] > 0) acc[i] = static_cast<double>(correct[i]) / total[i];
  }
  return acc;
}

double TauEstimate(const std::vector<double>& slot_accuracy) {
  double tau = 1.0, run = 1.0;
  for (double a : slot_accuracy) tau += (run *= a);
  return tau;
}

}  // namespace flashdraft
