// `flashdraft make-tiny-target --out DIR`: a small Qwen3-shaped Hugging Face folder (config.json,
// model.safetensors, tokenizer.json, tokenizer_config.json, generation_config.json, and
// chats.jsonl: demo chat data from the same corpus) whose
// tokenizer (byte-level BPE) and weights are trained here on text every Debian system ships
// (/usr/share/common-licenses), so that its greedy continuations are non-trivial and learnable —
// the target of the online demo and of tests. Deterministic for a given thread count; cached: a
// rerun with the same options and corpus finds the folder up to date and returns at once.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace flashdraft {

struct MakeTinyTargetOptions {
  std::string out;
  std::string corpus_dir = "/usr/share/common-licenses";
  int num_merges = 512;
  int64_t hidden_size = 128;
  int64_t num_layers = 4;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t intermediate_size = 384;
  int64_t steps = 300;
  int64_t batch_size = 16;
  int64_t seq_len = 128;
  double learning_rate = 3e-3;
  uint64_t seed = 0;
  int threads = 2;
  bool force = false;  // retrain even when the cache says up to date
};

absl::Status MakeTinyTarget(const MakeTinyTargetOptions& options);

}  // namespace flashdraft
