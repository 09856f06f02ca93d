// Small random-weight target decoders built in memory, for the model's tests.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "model/target_model.h"

namespace flashdraft {
namespace testing {

// Norms 1, matrices N(0, 0.3²), lm_head its own (untied), seeded.
inline std::unique_ptr<TargetModel> RandomTarget(const TargetModelConfig& c, uint64_t seed) {
  torch::manual_seed(seed);
  auto model = TargetModel::FromWeights(
      c,
      [](const std::string& name,
         const std::vector<int64_t>& shape) -> absl::StatusOr<torch::Tensor> {
        if (name.find("norm") != std::string::npos) return torch::ones(shape);
        return torch::randn(shape) * 0.3;
      },
      [](const std::string&) { return true; });
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

// Qwen3-shaped (qk-norm, two query heads per key/value head), 3 layers, vocabulary 48.
inline TargetModelConfig SmallQwen3() {
  TargetModelConfig c;
  c.model_type = "qwen3";
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  c.vocab_size = 48;
  c.qk_norm = true;
  return c;
}

}  // namespace testing
}  // namespace flashdraft
