// The drafter's configuration as the HF export writes it (DFLASH.md §6). No LibTorch here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace flashdraft {

struct DrafterModelConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t block_size = 16;
  int64_t num_target_layers = 0;  // layers of the target model (informational)
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  bool tie_word_embeddings = false;
  int64_t mask_token_id = 0;
  std::vector<int> target_layer_ids;
  // Per layer, "full_attention" or "sliding_attention"; empty when every layer is full (a config
  // that lists only full layers reads back empty). A sliding layer's query at position p sees
  // context positions in (p - sliding_window, anchor) and its block's slots up to its own.
  std::vector<std::string> layer_types;
  int64_t sliding_window = 0;  // > 0 exactly when some layer slides

  // The window of layer `i`'s attention: 0 for full attention.
  int64_t WindowOfLayer(int64_t i) const {
    return !layer_types.empty() && layer_types[static_cast<size_t>(i)] == "sliding_attention"
               ? sliding_window
               : 0;
  }

  // n·H: the width of the concatenated target features.
  int64_t feature_size() const {
    return static_cast<int64_t>(target_layer_ids.size()) * hidden_size;
  }
};

// Parses config.json text. Accepts block_size / mask_token_id / target_layer_ids inside
// `dflash_config` or at the top level, and refuses features this trainer does not implement
// (among them causality overrides other than full layers non-causal, sliding layers causal).
absl::StatusOr<DrafterModelConfig> ParseDrafterConfig(const std::string& json_text,
                                                      const std::string& source);
absl::StatusOr<DrafterModelConfig> LoadDrafterConfig(const std::string& path);

// The HF export config.json (architectures DFlashDraftModel, model_type qwen3, dflash_config...).
std::string DrafterConfigToJson(const DrafterModelConfig& config);

// round(1 + i*(L-4)/(n-1)) for i = 0..n-1 (DFLASH.md §2); n = 1 gives {1}.
std::vector<int> DefaultTargetLayerIds(int num_target_layers, int n);

// The layers a target computes for a row of features: the drafter's `layers`, then with `teacher`
// its last layer, whose output (after the final norm) is what its lm_head reads.
inline std::vector<int> LayersWithTeacher(std::vector<int> layers, int num_target_layers,
                                          bool teacher) {
  if (teacher) layers.push_back(num_target_layers - 1);
  return layers;
}

}  // namespace flashdraft
