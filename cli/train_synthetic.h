// `flashdraft debug train-synthetic`: trains a drafter in this one process on the synthetic
// learnable language (model/synthetic_data.h), printing loss, per-slot accuracy and the τ estimate,
// and writing steps.jsonl. The single-process precursor of `flashdraft launch`.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace flashdraft {

struct SyntheticTrainingOptions {
  int64_t steps = 400;
  int64_t block_size = 8;
  int64_t hidden_size = 64;
  int64_t layers = 1;
  int64_t vocab_size = 128;
  int64_t batch = 4;
  int64_t seq_len = 128;
  int64_t max_anchors = 16;
  double noise = 0.1;
  double learning_rate = 1e-2;
  uint64_t seed = 0;
  int threads = 2;
  int64_t print_every = 25;
  std::string out_dir;  // steps.jsonl goes here when set
};

absl::Status RunSyntheticTraining(const SyntheticTrainingOptions& options);

}  // namespace flashdraft
