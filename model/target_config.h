// The shape and numerics of a Hugging Face target decoder (Qwen3, Llama incl. Llama-3 RoPE scaling)
// from its config.json, and the drafter config it implies; torch-free (config check, estimates).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/drafter_config.h"

namespace flashdraft {

struct TargetModelConfig {
  std::string model_type;  // "qwen3" | "llama"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  bool qk_norm = false;  // Qwen3
  // Llama-3 rope scaling ("rope_type": "llama3"); factor 0 = none.
  double rope_factor = 0, rope_low_freq_factor = 1, rope_high_freq_factor = 4;
  int64_t rope_original_max_position = 8192;
};

absl::StatusOr<TargetModelConfig> ParseTargetConfig(const std::string& json_text,
                                                    const std::string& source);

// The drafter config a target implies (DFLASH.md §2): its sizes, vocabulary, RoPE, the layers whose
// outputs condition the drafter; one drafter layer (the job decides), mask token the last
// embedding row unless `mask_token_id` >= 0.
DrafterModelConfig DrafterConfigForTarget(const TargetModelConfig& t,
                                          const std::vector<int>& layers, int64_t max_seq_len,
                                          int64_t mask_token_id);

// The number of weights of the target (a tied lm_head counted once).
int64_t TargetParameterCount(const TargetModelConfig& c);

}  // namespace flashdraft
