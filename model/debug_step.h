// `flashdraft debug drafter-step`: one forward + backward of the drafter on files only, for parity
// tests and for users chasing numerics bugs.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"

namespace flashdraft {

struct DrafterStepFiles {
  std::string config;   // HF-style drafter config.json
  std::string weights;  // drafter weights (HF names) + embed_tokens.weight (+ lm_head.weight)
  std::string batch;    // input_ids, loss_mask, hidden_states, anchors
  std::string out;      // loss, slot_accuracy, and the gradient of every trainable parameter
  std::optional<double> gamma;  // loss decay; default from the block size (7/5/4 for 16/10/8)
};

absl::Status RunDrafterDebugStep(const DrafterStepFiles& files);

}  // namespace flashdraft
