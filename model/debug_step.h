// `flashdraft debug drafter-step`: one forward + backward of the drafter on files only, for parity
// tests and for users chasing numerics bugs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace flashdraft {

struct DrafterStepFiles {
  std::string config;   // HF-style drafter config.json
  std::string weights;  // drafter weights (HF names) + embed_tokens.weight (+ lm_head.weight)
  std::string batch;    // input_ids, loss_mask, hidden_states, anchors
  std::string out;      // loss, slot_accuracy, and the gradient of every trainable parameter
  std::optional<double> gamma;  // loss decay; default from the block size (7/5/4 for 16/10/8)
  // α of α·CE + (1−α)·KL; below 1 the batch needs teacher_hidden [b, S, H] (the target's final-
  // normed last hidden state).
  double ce_weight = 1.0;
};

absl::Status RunDrafterDebugStep(const DrafterStepFiles& files);

// `flashdraft debug target-features`: runs the target over input_ids [b,S] (I64) and writes
// hidden_states [b,S,n·H] (F32, the outputs of `layers` in the given order) and logits [b,S,V]
// (F32). With `dense_attention`, attention forms whole score matrices (to compare the paths).
absl::Status RunTargetFeaturesDebug(const std::string& target_dir, const std::string& ids_path,
                                    const std::vector<int>& layers, const std::string& out_path,
                                    bool dense_attention = false);

}  // namespace flashdraft
