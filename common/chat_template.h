// The Qwen3 chat template (tokenizer_config.json's Jinja template, for system/user/assistant turns)
// rendered in C++, with the byte spans of the assistant turns so that the tokenized conversation
// gets its loss mask: the drafter learns the assistant's tokens only (DFLASH.md §4), exactly as the
// target sees them when serving.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer.h"

namespace flashdraft {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
  std::optional<std::string> reasoning_content;  // assistant only
};

struct ChatTemplateOptions {
  bool add_generation_prompt = false;
  std::optional<bool> enable_thinking;  // unset: the template's default
};

struct RenderedChat {
  std::string text;
  // Byte ranges of `text` written by the assistant: each turn's content (with its <think> block
  // where the template renders one) through its <|im_end|>; not the "<|im_start|>assistant\n"
  // header nor the newline after <|im_end|>.
  std::vector<std::pair<size_t, size_t>> assistant_spans;
};

// Errors name the message index and what is wrong (unknown role, empty conversation).
absl::StatusOr<RenderedChat> RenderQwen3Chat(const std::vector<ChatMessage>& messages,
                                             const ChatTemplateOptions& options = {});

struct TokenizedChat {
  std::vector<int32_t> input_ids;
  std::vector<uint8_t> loss_mask;  // 1 for tokens that overlap an assistant span
};

TokenizedChat TokenizeChat(const Tokenizer& tokenizer, const RenderedChat& chat);

}  // namespace flashdraft
