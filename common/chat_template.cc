#include "common/chat_template.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"

namespace flashdraft {
namespace {

std::string LStripNewlines(absl::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return std::string(s);
}
std::string RStripNewlines(absl::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return std::string(s);
}

// Python's s.split(sep)[0] and s.split(sep)[-1].
absl::string_view FirstPart(absl::string_view s, absl::string_view sep) {
  const size_t at = s.find(sep);
  return at == absl::string_view::npos ? s : s.substr(0, at);
}
absl::string_view LastPart(absl::string_view s, absl::string_view sep) {
  const size_t at = s.rfind(sep);
  return at == absl::string_view::npos ? s : s.substr(at + sep.size());
}

constexpr absl::string_view kEmptyThink = "<think>\n\n</think>\n\n";

}  // namespace

absl::StatusOr<RenderedChat> RenderQwen3Chat(const std::vector<ChatMessage>& messages,
                                             const ChatTemplateOptions& options) {
  if (messages.empty()) return absl::InvalidArgumentError("the conversation has no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, ": role '", role,
                       "' is not supported (supported: system, user, assistant)"));
    }
  }
  RenderedChat out;
  std::string& text = out.text;
  if (messages[0].role == "system") {
    absl::StrAppend(&text, "<|im_start|>system\n", messages[0].content, "<|im_end|>\n");
  }
  // The last user query that is not a tool response: assistant turns after it keep their thinking.
  size_t last_query = messages.size() - 1;
  for (size_t k = messages.size(); k-- > 0;) {
    const ChatMessage& m = messages[k];
    if (m.role == "user" && !(absl::StartsWith(m.content, "<tool_response>") &&
                              absl::EndsWith(m.content, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      absl::StrAppend(&text, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
      continue;
    }
    if (m.role != "assistant") continue;  // the first system message, rendered above
    std::string content = m.content;
    std::string reasoning;
    if (m.reasoning_content.has_value()) {
      reasoning = *m.reasoning_content;
    } else if (absl::StrContains(m.content, "</think>")) {
      content = LStripNewlines(LastPart(m.content, "</think>"));
      reasoning =
          LStripNewlines(LastPart(RStripNewlines(FirstPart(m.content, "</think>")), "<think>"));
    }
    text += "<|im_start|>assistant\n";
    const size_t begin = text.size();
    const bool last = i + 1 == messages.size();
    if (i > last_query && (last || !reasoning.empty())) {
      absl::StrAppend(&text, "<think>\n", LStripNewlines(RStripNewlines(reasoning)),
                      "\n</think>\n\n", LStripNewlines(content));
    } else {
      text += content;
    }
    text += "<|im_end|>";
    out.assistant_spans.emplace_back(begin, text.size());
    text += "\n";
  }
  if (options.add_generation_prompt) {
    text += "<|im_start|>assistant\n";
    if (options.enable_thinking.has_value() && !*options.enable_thinking) {
      text += "<think>\n\n</think>\n\n";
    }
  }
  return out;
}

TokenizedChat TokenizeChat(const Tokenizer& tokenizer, const RenderedChat& chat) {
  Tokenizer::Encoding enc = tokenizer.EncodeWithOffsets(chat.text);
  TokenizedChat out;
  out.input_ids = std::move(enc.ids);
  out.loss_mask.assign(out.input_ids.size(), 0);
  size_t span = 0;
  for (size_t k = 0; k < enc.offsets.size(); ++k) {
    const auto [begin, end] = enc.offsets[k];
    while (span < chat.assistant_spans.size() && chat.assistant_spans[span].second <= begin) {
      ++span;
    }
    if (span < chat.assistant_spans.size() && end > chat.assistant_spans[span].first &&
        begin < chat.assistant_spans[span].second) {
      out.loss_mask[k] = 1;
    }
  }
  return out;
}

void ApplyChatOptions(const ChatRenderOptions& options, std::vector<ChatMessage>& messages) {
  const bool has_system = std::any_of(messages.begin(), messages.end(),
                                      [](const ChatMessage& m) { return m.role == "system"; });
  if (!options.system_prompt.empty() && !has_system) {
    messages.insert(messages.begin(), ChatMessage{"system", options.system_prompt, std::nullopt});
  }
  if (options.enable_thinking) return;
  for (ChatMessage& m : messages) {
    if (m.role != "assistant") continue;
    m.reasoning_content.reset();
    // As the template splits it: the answer is what follows the last </think>.
    if (absl::StrContains(m.content, "</think>")) {
      m.content = LStripNewlines(LastPart(m.content, "</think>"));
    }
  }
}

absl::StatusOr<RenderedChat> RenderTrainingChat(const std::vector<ChatMessage>& messages,
                                                const ChatRenderOptions& options) {
  absl::StatusOr<RenderedChat> chat = RenderQwen3Chat(messages);
  if (!chat.ok() || options.enable_thinking) return chat;
  for (auto& [begin, end] : chat->assistant_spans) {
    if (absl::StartsWith(absl::string_view(chat->text).substr(begin, end - begin), kEmptyThink)) {
      begin += kEmptyThink.size();
    }
  }
  return chat;
}

absl::StatusOr<RenderedChat> RenderChatPrompt(const std::vector<ChatMessage>& messages,
                                              const ChatRenderOptions& options) {
  ChatTemplateOptions o;
  o.add_generation_prompt = true;
  if (!options.enable_thinking) o.enable_thinking = false;
  return RenderQwen3Chat(messages, o);
}

std::string ChatOptionsKey(const ChatRenderOptions& options) {
  std::string key;
  if (!options.enable_thinking) key += "; thinking off";
  if (!options.system_prompt.empty()) {
    absl::StrAppendFormat(&key, "; system prompt %08x (%d B)",
                          Crc32c(options.system_prompt.data(), options.system_prompt.size()),
                          options.system_prompt.size());
  }
  return key;
}

}  // namespace flashdraft
