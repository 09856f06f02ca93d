// One line of chat data (JSONL), parsed without a tokenizer (shared by `flashdraft prepare` and the
// online target source through model/chat_data.h):
//   {"input_ids": [...], "loss_mask": [...]}                 already tokenized
//   {"messages": [{"role": "user", "content": "..."}, ...]}    OpenAI style (+ reasoning_content)
//   {"conversations": [{"from": "human", "value": "..."}, ...]} ShareGPT style (human/gpt/system)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat_template.h"

namespace flashdraft {

struct ChatLine {
  bool is_chat = false;
  std::vector<ChatMessage> messages;  // a chat: its turns (roles user, assistant, system)
  std::vector<int64_t> input_ids;     // tokenized: ids in [0, vocab) and their 0/1 loss mask
  std::vector<int64_t> loss_mask;
};

// An error names what is wrong (callers add file:line): not JSON, neither form, a role that is not
// supported, a chat without an assistant turn, ids outside [0, vocab), masks that are not 0/1 or
// lengths that differ.
absl::StatusOr<ChatLine> ParseChatLine(const std::string& line, int64_t vocab);

}  // namespace flashdraft
