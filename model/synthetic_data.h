// A small synthetic-but-learnable "language" for demos, tests and benchmarks until real targets
// feed the trainer: each token is followed by its fixed successor with probability 1 − noise, by a
// random token otherwise; the "target features" of a position are a fixed random vector of its
// token. A drafter that learns the successor table drafts long accepted blocks; noise bounds how
// long.
#pragma once

#include <torch/torch.h>

#include "model/drafter.h"

namespace flashdraft {

struct SyntheticLanguage {
  int64_t vocab_size = 0;  // ids 0..vocab_size-2 are tokens; vocab_size-1 is the MASK id
  int64_t feature_size = 0;
  double noise = 0.1;
  torch::Tensor successor;      // [V] int64
  torch::Tensor feature_table;  // [V, feature_size] float32
};

SyntheticLanguage MakeSyntheticLanguage(int64_t vocab_size, int64_t feature_size, double noise,
                                        uint64_t seed);

struct SyntheticBatchOptions {
  int64_t batch = 4;
  int64_t seq_len = 128;
  int64_t prompt_len = 8;  // leading positions with loss_mask 0
  int64_t max_anchors = 32;
  bool variable_length = true;  // right-pad later samples
};

// Batch `step` of the stream (deterministic in (seed, step)), anchors drawn as the coordinator
// will.
DrafterBatch MakeSyntheticBatch(const SyntheticLanguage& language,
                                const SyntheticBatchOptions& options, uint64_t seed, uint64_t step);

// The synthetic target's frozen embedding and lm_head [V, hidden] (row norms near 3, like a trained
// LLM's, so logits start small instead of saturated).
std::pair<torch::Tensor, torch::Tensor> MakeSyntheticTarget(const SyntheticLanguage& language,
                                                            int64_t hidden_size, uint64_t seed);

// A drafter config sized for a CPU demo over `language`.
DrafterModelConfig SyntheticDrafterConfig(const SyntheticLanguage& language, int64_t block_size,
                                          int64_t hidden_size, int64_t layers);

}  // namespace flashdraft
