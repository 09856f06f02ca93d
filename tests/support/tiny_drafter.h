// A small, valid drafter configuration for tests (no LibTorch): `hidden` wide, 2 heads of
// hidden/2, one layer, a vocabulary of 4·hidden, features of target layers 1 and 3 of 4.
#pragma once

#include <cstdint>

#include "model/drafter_config.h"

namespace flashdraft::testing {

inline DrafterModelConfig TinyDrafterConfig(int64_t hidden) {
  DrafterModelConfig config;
  config.hidden_size = hidden;
  config.intermediate_size = 2 * hidden;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 1;
  config.head_dim = hidden / 2;
  config.vocab_size = 4 * hidden;
  config.block_size = 4;
  config.num_target_layers = 4;
  config.max_position_embeddings = 8 * hidden;
  config.mask_token_id = 4 * hidden - 1;
  config.target_layer_ids = {1, 3};
  return config;
}

}  // namespace flashdraft::testing
