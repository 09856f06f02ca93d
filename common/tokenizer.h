// Byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (Qwen2/Qwen3, Llama-3 and
// other GPT-2-style byte-level BPE tokenizers): added/special tokens matched leftmost-longest on
// the raw text, NFC normalizer, the Qwen2 or Llama-3 split pattern implemented as a hand-written
// matcher with the regex's exact (ordered, backtracking) semantics and Unicode properties from ICU,
// GPT-2 byte-to-unicode mapping, ranked merges. Anything else in the file is refused by name rather
// than silently tokenized differently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace flashdraft {

// The split patterns of Qwen2/Qwen3 (\p{N}) and Llama-3 (\p{N}{1,3}) tokenizer.json files.
// Token ids are below this (the largest vocabularies in use have ~256K tokens).
inline constexpr int64_t kMaxVocabulary = int64_t{1} << 22;

inline constexpr absl::string_view kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr absl::string_view kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class Tokenizer {
 public:
  struct Encoding {
    std::vector<int32_t> ids;
    // Byte range [first, second) of each token in the encoded text.
    std::vector<std::pair<size_t, size_t>> offsets;
  };

  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(absl::string_view json,
                                                             const std::string& label);
  ~Tokenizer();

  // Added tokens in `text` (e.g. "<|im_start|>") become their ids.
  std::vector<int32_t> Encode(absl::string_view text) const;
  Encoding EncodeWithOffsets(absl::string_view text) const;
  // Invalid UTF-8 produced by a partial byte sequence decodes to U+FFFD, as in Hugging Face.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The normalized text cut by the split pattern (no added-token matching): for tests and
  // debugging.
  std::vector<std::string> PreTokenize(absl::string_view text) const;

  // One more than the largest id (vocabulary and added tokens).
  int32_t vocab_size() const { return vocab_size_; }
  std::optional<int32_t> TokenToId(absl::string_view token) const;
  bool IsSpecial(int32_t id) const;

 private:
  struct AddedToken {
    std::string content;
    int32_t id;
    bool special;
  };
  struct Merge {
    int32_t rank;
    int32_t merged;
  };

  Tokenizer() = default;
  // Encodes text without added tokens, appending ids and offsets (shifted by `base`).
  void EncodeOrdinary(absl::string_view text, size_t base, Encoding* out) const;
  // Byte ranges of the split pattern's pieces in normalized text.
  std::vector<std::pair<size_t, size_t>> SplitPieces(absl::string_view normalized) const;
  // BPE of one pre-token (raw bytes), appending ids and per-token byte lengths.
  void Bpe(absl::string_view piece, std::vector<int32_t>* ids, std::vector<size_t>* lengths) const;

  std::unordered_map<std::string, int32_t> vocab_;  // byte-level strings and added tokens
  std::vector<std::string> id_to_token_;            // byte-level strings ("" for gaps)
  std::unordered_map<uint64_t, Merge> merges_;      // (left id << 32 | right id)
  int32_t byte_ids_[256] = {};                      // id of each single byte's token
  std::vector<AddedToken> added_;                   // longest first within the same first byte
  std::vector<std::vector<size_t>> added_by_first_byte_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  bool nfc_ = false;
  int max_digits_ = 1;  // \p{N} (Qwen2) or \p{N}{1,3} (Llama-3)
  bool ignore_merges_ = false;
  int32_t vocab_size_ = 0;
};

// The GPT-2 byte-level alphabet: the UTF-8 string standing for `byte` in vocabulary entries.
std::string ByteLevelChar(uint8_t byte);

}  // namespace flashdraft
