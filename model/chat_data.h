// Chat data lines (JSONL, the forms common/chat_line.h parses) → tokens, shared by `flashdraft
// prepare` and the online target source. Chats are rendered with the Qwen3 chat template and
// tokenized with the target's tokenizer.json (loss on the assistant turns); `regenerate` first
// replaces every assistant turn by the target's own greedy answer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/chat_line.h"
#include "common/chat_template.h"
#include "common/tokenizer.h"
#include "model/target_model.h"

namespace flashdraft {

struct ChatDataOptions {
  std::string target;     // Hugging Face folder (its tokenizer.json is the default tokenizer)
  std::string tokenizer;  // tokenizer.json; empty: <target>/tokenizer.json
  int64_t max_new_tokens = 512;  // per regenerated assistant turn
  ChatRenderOptions chat;        // thinking mode and system prompt, alike for all three uses
};

class ChatLineReader {
 public:
  ChatLineReader(ChatDataOptions options, const TargetModel& model)
      : options(std::move(options)), model(model) {}

  // One line → ids and mask, or an error naming what is wrong (callers add file:line); `is_chat`
  // tells whether the line was a chat (only those can be regenerated).
  absl::Status Parse(const std::string& line, int64_t vocab, bool regenerate,
                     std::vector<int64_t>& ids, std::vector<int64_t>& mask, bool* is_chat);

  // The prompt of a line, as a server would get it (evaluation): a chat's turns before its first
  // assistant turn, rendered with the generation prompt; a tokenized line's ids before its first
  // loss position (all of them when it has none).
  absl::StatusOr<std::vector<int64_t>> Prompt(const std::string& line, int64_t vocab);

 private:
  // The tokenizer, loaded on the first chat line.
  absl::StatusOr<const Tokenizer*> GetTokenizer();
  absl::Status Regenerate(const Tokenizer& tokenizer, std::vector<ChatMessage>& messages);

  const ChatDataOptions options;
  const TargetModel& model;
  std::unique_ptr<Tokenizer> tokenizer;
  absl::Status load_error;
  bool loaded = false;
};

}  // namespace flashdraft
