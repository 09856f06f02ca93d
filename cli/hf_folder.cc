#include "cli/hf_folder.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/bpe_trainer.h"
#include "common/crc32c.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace flashdraft {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A ChatML template for Hugging Face loaders (flashdraft itself renders chats with its Qwen3
// template, which produces the same turns plus the <think> block of the last assistant turn).
constexpr const char* kChatTemplate =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

}  // namespace

absl::StatusOr<std::vector<std::string>> ReadCorpus(const std::string& dir) {
  std::error_code ec;
  std::vector<fs::path> paths;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file() && !it->is_symlink()) paths.push_back(it->path());
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
  std::sort(paths.begin(), paths.end());
  std::vector<std::string> texts;
  for (const fs::path& p : paths) {
    FD_ASSIGN_OR_RETURN(std::string text, ReadFile(p.string()));
    texts.push_back(std::move(text));
  }
  if (texts.empty()) return absl::NotFoundError(absl::StrCat(dir, ": no text files"));
  return texts;
}

std::pair<uint32_t, size_t> CorpusDigest(const std::vector<std::string>& corpus) {
  uint32_t digest = 0;
  size_t bytes = 0;
  for (const std::string& t : corpus) {
    digest = Crc32cExtend(digest, t.data(), t.size());
    bytes += t.size();
  }
  return {digest, bytes};
}

absl::StatusOr<TrainedTokenizer> TrainCorpusTokenizer(const std::vector<std::string>& corpus,
                                                      int num_merges) {
  BpeTrainerOptions bpe;
  bpe.num_merges = num_merges;
  TrainedTokenizer t;
  FD_ASSIGN_OR_RETURN(t.json, TrainByteLevelBpe(corpus, bpe));
  FD_ASSIGN_OR_RETURN(t.tokenizer, Tokenizer::FromJson(t.json, "trained tokenizer"));
  t.endoftext = *t.tokenizer->TokenToId("<|endoftext|>");
  t.im_end = *t.tokenizer->TokenToId("<|im_end|>");
  return t;
}

absl::Status WriteTokenizerFiles(const TrainedTokenizer& t, int64_t model_max_length,
                                 const std::string& out) {
  FD_RETURN_IF_ERROR(WriteFileAtomically(out + "/tokenizer.json", t.json));
  const json tokenizer_config = {{"tokenizer_class", "Qwen2Tokenizer"},
                                 {"bos_token", nullptr},
                                 {"eos_token", "<|im_end|>"},
                                 {"pad_token", "<|endoftext|>"},
                                 {"model_max_length", model_max_length},
                                 {"chat_template", kChatTemplate}};
  FD_RETURN_IF_ERROR(
      WriteFileAtomically(out + "/tokenizer_config.json", tokenizer_config.dump(2) + "\n"));
  const json generation = {{"bos_token_id", t.endoftext},
                           {"eos_token_id", {t.im_end, t.endoftext}},
                           {"do_sample", false}};
  return WriteFileAtomically(out + "/generation_config.json", generation.dump(2) + "\n");
}

absl::Status WriteDemoChats(const std::vector<std::string>& corpus, const std::string& out) {
  constexpr int kTrain = 256, kHeldOut = 64;
  std::string chats[2];
  int num_chats = 0;
  for (const std::string& text : corpus) {
    std::vector<std::string> lines;
    for (size_t at = 0, next; at < text.size() && num_chats < kTrain + kHeldOut; at = next + 1) {
      next = text.find('\n', at);
      if (next == std::string::npos) next = text.size();
      if (next - at > 20) lines.push_back(text.substr(at, next - at));
    }
    for (size_t i = 0; i + 3 < lines.size() && num_chats < kTrain + kHeldOut; i += 4, ++num_chats) {
      const json chat = {
          {"messages",
           {{{"role", "user"}, {"content", "Continue: " + lines[i]}},
            {{"role", "assistant"},
             {"content", lines[i + 1] + "\n" + lines[i + 2] + "\n" + lines[i + 3]}}}}};
      chats[num_chats < kTrain ? 0 : 1] += chat.dump() + "\n";
    }
  }
  FD_RETURN_IF_ERROR(WriteFileAtomically(out + "/chats.jsonl", chats[0]));
  return WriteFileAtomically(out + "/heldout-chats.jsonl", chats[1]);
}

}  // namespace flashdraft
