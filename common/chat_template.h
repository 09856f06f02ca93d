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

// How a job renders its chats: the same in training, in regeneration and in evaluation, so that
// the drafter learns the text a server will show it.
struct ChatRenderOptions {
  // false: Qwen3's non-thinking mode, as a server runs it with `enable_thinking: false`. The
  // assistant turns lose their reasoning (the target writes none in that mode), and the empty
  // "<think>\n\n</think>\n\n" the template puts before an answer is out of the loss: the
  // server writes it into the prompt, the drafter never drafts it.
  bool enable_thinking = true;
  // Non-empty: the system turn of every chat that has none.
  std::string system_prompt;
};

// `messages` with the system prompt added (where the chat has no system turn) and, in non-thinking
// mode, the assistant turns' reasoning dropped.
void ApplyChatOptions(const ChatRenderOptions& options, std::vector<ChatMessage>& messages);

// A whole conversation for training (after ApplyChatOptions): rendered, with the assistant spans
// starting after the empty think block in non-thinking mode.
absl::StatusOr<RenderedChat> RenderTrainingChat(const std::vector<ChatMessage>& messages,
                                                const ChatRenderOptions& options);

// The prompt a server renders for `messages` (after ApplyChatOptions): the generation prompt, with
// the empty think block in non-thinking mode.
absl::StatusOr<RenderedChat> RenderChatPrompt(const std::vector<ChatMessage>& messages,
                                              const ChatRenderOptions& options);

// What a cache key and a log line say of `options`: empty for the defaults (so keys written before
// the options existed stay valid), otherwise e.g. "; thinking off; system prompt 1f2e3d4c (52 B)".
std::string ChatOptionsKey(const ChatRenderOptions& options);

}  // namespace flashdraft
