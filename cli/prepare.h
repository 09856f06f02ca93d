// `flashdraft prepare`: offline shards from a real target model. Reads tokenized chat data (JSONL,
// one {"input_ids": [...], "loss_mask": [...]} per line), runs the target (model/target_model.h) to
// get the outputs of the conditioning layers, and writes shards + target.safetensors (the target's
// embedding and lm_head) + manifest.json with the drafter config derived from the target.
// Resumable: complete shards of an interrupted run are kept and their samples skipped.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace flashdraft {

struct PrepareOptions {
  std::string target;  // Hugging Face folder
  std::string data;    // tokenized JSONL
  std::string out;
  std::vector<int> layer_ids;  // empty: DFLASH.md §2 formula with num_features
  int num_features = 5;
  int64_t mask_token_id = -1;  // -1: the last row of the embedding table
  int64_t max_seq_len = 3072;
  int64_t samples_per_shard = 256;
  bool skip_bad_lines = false;    // otherwise the first bad line is fatal
  bool float32_features = false;  // default BF16
};

absl::Status Prepare(const PrepareOptions& options);

}  // namespace flashdraft
