// Pieces of the Hugging Face folders flashdraft makes for demos and tests (make-tiny-target,
// make-target): the text corpus, a byte-level BPE tokenizer trained on it with its config files,
// and demo chat data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer.h"

namespace flashdraft {

// The corpus: regular files of `dir` (not links, which repeat them) in name order.
absl::StatusOr<std::vector<std::string>> ReadCorpus(const std::string& dir);

// The CRC-32C of the corpus's texts in order and their total bytes (cache stamps).
std::pair<uint32_t, size_t> CorpusDigest(const std::vector<std::string>& corpus);

struct TrainedTokenizer {
  std::string json;  // tokenizer.json
  std::unique_ptr<Tokenizer> tokenizer;
  int64_t endoftext = 0, im_end = 0;  // <|endoftext|> and <|im_end|>
};

// A byte-level BPE of `num_merges` merges trained on the corpus, with ChatML's special tokens.
absl::StatusOr<TrainedTokenizer> TrainCorpusTokenizer(const std::vector<std::string>& corpus,
                                                      int num_merges);

// tokenizer.json, tokenizer_config.json (ChatML template) and generation_config.json in `out`.
absl::Status WriteTokenizerFiles(const TrainedTokenizer& t, int64_t model_max_length,
                                 const std::string& out);

// Demo chat data from the corpus: "Continue: <line>" answered by the next three lines; the first
// 256 chats are the training chats (chats.jsonl), the next 64 held-out prompts for evaluation
// (heldout-chats.jsonl) that no drafter trained on. Cheap and deterministic.
absl::Status WriteDemoChats(const std::vector<std::string>& corpus, const std::string& out);

}  // namespace flashdraft
