// Trains a small byte-level BPE tokenizer (Qwen2 layout: NFC, the Qwen2 split pattern, GPT-2 byte
// alphabet) on text, for `flashdraft make-tiny-target`. Deterministic: ties between equally
// frequent pairs go to the smaller pair of ids.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace flashdraft {

struct BpeTrainerOptions {
  int num_merges = 512;
  // Added after the vocabulary, in order; the first three are marked special.
  std::vector<std::string> added_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>",
                                           "</think>"};
};

// Returns the tokenizer.json text; ids: 256 bytes, then merges, then the added tokens.
absl::StatusOr<std::string> TrainByteLevelBpe(const std::vector<std::string>& texts,
                                              const BpeTrainerOptions& options = {});

}  // namespace flashdraft
