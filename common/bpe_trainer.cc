#include "common/bpe_trainer.h"

#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "common/status_macros.h"
#include "common/tokenizer.h"

namespace flashdraft {
namespace {

using json = nlohmann::json;

json TokenizerJson(const json& vocab, const json& merges, const std::vector<std::string>& added,
                   int first_added_id) {
  json added_tokens = json::array();
  for (size_t i = 0; i < added.size(); ++i) {
    added_tokens.push_back({{"id", first_added_id + static_cast<int>(i)},
                            {"content", added[i]},
                            {"single_word", false},
                            {"lstrip", false},
                            {"rstrip", false},
                            {"normalized", false},
                            {"special", i < 3}});
  }
  json byte_level = json::object();
  byte_level["type"] = "ByteLevel";
  byte_level["add_prefix_space"] = false;
  byte_level["trim_offsets"] = false;
  byte_level["use_regex"] = false;
  json split = json::object();
  split["type"] = "Split";
  split["pattern"] = json::object({{"Regex", std::string(kQwen2SplitPattern)}});
  split["behavior"] = "Isolated";
  split["invert"] = false;
  json pre = json::object();
  pre["type"] = "Sequence";
  pre["pretokenizers"] = json::array({split, byte_level});
  json model = json::object();
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = "";
  model["end_of_word_suffix"] = "";
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = false;
  model["vocab"] = vocab;
  model["merges"] = merges;
  json out = json::object();
  out["version"] = "1.0";
  out["truncation"] = nullptr;
  out["padding"] = nullptr;
  out["added_tokens"] = added_tokens;
  out["normalizer"] = json::object({{"type", "NFC"}});
  out["pre_tokenizer"] = pre;
  out["post_processor"] = byte_level;
  out["decoder"] = byte_level;
  out["model"] = model;
  return out;
}

}  // namespace

absl::StatusOr<std::string> TrainByteLevelBpe(const std::vector<std::string>& texts,
                                              const BpeTrainerOptions& options) {
  std::vector<std::string> names(256);
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    names[b] = ByteLevelChar(static_cast<uint8_t>(b));
    vocab[names[b]] = b;
  }
  // The pre-tokenizer of the result, to cut the text into words.
  FD_ASSIGN_OR_RETURN(
      std::unique_ptr<Tokenizer> splitter,
      Tokenizer::FromJson(TokenizerJson(vocab, json::array(), {}, 256).dump(), "bpe trainer"));
  std::map<std::string, int64_t> counts;
  for (const std::string& text : texts) {
    for (std::string& piece : splitter->PreTokenize(text)) ++counts[std::move(piece)];
  }
  struct Word {
    std::vector<int> symbols;
    int64_t count;
  };
  std::vector<Word> words;
  words.reserve(counts.size());
  for (const auto& [piece, count] : counts) {
    Word w{{}, count};
    for (unsigned char c : piece) w.symbols.push_back(c);
    words.push_back(std::move(w));
  }
  json merges = json::array();
  for (int m = 0; m < options.num_merges; ++m) {
    std::unordered_map<uint64_t, int64_t> pairs;
    for (const Word& w : words) {
      for (size_t i = 0; i + 1 < w.symbols.size(); ++i) {
        pairs[(uint64_t(w.symbols[i]) << 32) | uint32_t(w.symbols[i + 1])] += w.count;
      }
    }
    uint64_t best = 0;
    int64_t best_count = 0;
    for (const auto& [pair, count] : pairs) {
      if (count > best_count || (count == best_count && pair < best)) {
        best = pair;
        best_count = count;
      }
    }
    if (best_count < 2) break;  // nothing left worth merging
    const int left = static_cast<int>(best >> 32), right = static_cast<int>(best & 0xffffffff);
    const int merged = static_cast<int>(names.size());
    names.push_back(names[left] + names[right]);
    vocab[names.back()] = merged;
    merges.push_back(names[left] + " " + names[right]);
    for (Word& w : words) {
      std::vector<int> out;
      out.reserve(w.symbols.size());
      for (size_t i = 0; i < w.symbols.size(); ++i) {
        if (i + 1 < w.symbols.size() && w.symbols[i] == left && w.symbols[i + 1] == right) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(w.symbols[i]);
        }
      }
      w.symbols = std::move(out);
    }
  }
  return TokenizerJson(vocab, merges, options.added_tokens, static_cast<int>(names.size())).dump();
}

}  // namespace flashdraft
