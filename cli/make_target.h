// `flashdraft make-target --shape qwen3-8b --layers 2 --out DIR`: a random-weight Hugging Face
// target with the layer shape, vocabulary, RoPE and tying of a named real model (fewer decoder
// layers with --layers, so that a real shape fits a CI machine), a byte-level BPE tokenizer trained
// on the system's license texts whose ids fit the vocabulary, demo chats (chats.jsonl,
// heldout-chats.jsonl) and long-chats.jsonl (replies of about --max-seq-len tokens) — for jobs,
// benches and tests at real sizes without downloading weights. Deterministic; a rerun with the same
// options finds the folder up to date.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace flashdraft {

struct MakeTargetOptions {
  std::string shape;  // a name of TargetShapeNames()
  std::string out;
  int64_t layers = 0;          // 0: the real model's count
  std::string dtype = "bf16";  // of the weights: bf16 (as published) or fp32
  int64_t max_seq_len = 0;     // model_max_length of the tokenizer; 0: 32768
  std::string corpus_dir = "/usr/share/common-licenses";
  int num_merges = 512;
  uint64_t seed = 0;
  bool force = false;
};

// The shapes make-target knows, e.g. "qwen3-0.6b", "qwen3-8b", "llama3-8b".
std::vector<std::string> TargetShapeNames();

absl::Status MakeTarget(const MakeTargetOptions& options);

}  // namespace flashdraft
