#include "model/chat_data.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/generate.h"

namespace flashdraft {

absl::StatusOr<const Tokenizer*> ChatLineReader::GetTokenizer() {
  if (!loaded) {
    loaded = true;
    const std::string path =
        options.tokenizer.empty() ? options.target + "/tokenizer.json" : options.tokenizer;
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromFile(path);
    if (!t.ok()) {
      load_error = absl::InvalidArgumentError(
          absl::StrCat("chat lines need a tokenizer: ", t.status().message(),
                       options.tokenizer.empty() ? " (give --tokenizer)" : ""));
    } else if (!(*t)->TokenToId("<|im_start|>") || !(*t)->TokenToId("<|im_end|>")) {
      load_error = absl::InvalidArgumentError(
          absl::StrCat(path,
                       " has no <|im_start|>/<|im_end|> tokens: chat lines are rendered "
                       "with the Qwen3 (ChatML) template; give tokenized lines instead"));
    } else {
      tokenizer = std::move(*t);
    }
  }
  if (!load_error.ok()) return load_error;
  return tokenizer.get();
}

// Replaces every assistant turn by the target's greedy answer to the conversation before it.
absl::Status ChatLineReader::Regenerate(const Tokenizer& tokenizer,
                                        std::vector<ChatMessage>& messages) {
  const std::vector<int64_t> stops = {*tokenizer.TokenToId("<|im_end|>"),
                                      tokenizer.TokenToId("<|endoftext|>").value_or(-1)};
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    FD_ASSIGN_OR_RETURN(RenderedChat prompt,
                        RenderChatPrompt({messages.begin(), messages.begin() + i}, options.chat));
    const std::vector<int32_t> ids = tokenizer.Encode(prompt.text);
    FD_ASSIGN_OR_RETURN(std::vector<int64_t> answer, GreedyGenerate(model, {ids.begin(), ids.end()},
                                                                    options.max_new_tokens, stops));
    if (!answer.empty() && std::find(stops.begin(), stops.end(), answer.back()) != stops.end()) {
      answer.pop_back();
    }
    messages[i].content = tokenizer.Decode(std::vector<int32_t>(answer.begin(), answer.end()));
    messages[i].reasoning_content.reset();
  }
  return absl::OkStatus();
}

// One JSONL line → ids and mask, or an error naming what is wrong (the caller adds file:line).
// `regenerate`: replace a chat's assistant turns by the target's answers first; `is_chat` tells
// whether the line was a chat.
absl::Status ChatLineReader::Parse(const std::string& line, int64_t vocab, bool regenerate,
                                   std::vector<int64_t>& ids, std::vector<int64_t>& mask,
                                   bool* is_chat) {
  FD_ASSIGN_OR_RETURN(ChatLine parsed, ParseChatLine(line, vocab));
  *is_chat = parsed.is_chat;
  ids = std::move(parsed.input_ids);
  mask = std::move(parsed.loss_mask);
  if (!parsed.is_chat) return absl::OkStatus();
  FD_ASSIGN_OR_RETURN(const Tokenizer* tokenizer, GetTokenizer());
  ApplyChatOptions(options.chat, parsed.messages);
  if (regenerate) {
    FD_RETURN_IF_ERROR(Regenerate(*tokenizer, parsed.messages));
    // A target that reasons even so: in non-thinking mode its reasoning is not trained on either.
    ApplyChatOptions(options.chat, parsed.messages);
  }
  FD_ASSIGN_OR_RETURN(RenderedChat rendered, RenderTrainingChat(parsed.messages, options.chat));
  TokenizedChat tokens = TokenizeChat(*tokenizer, rendered);
  for (size_t k = 0; k < tokens.input_ids.size(); ++k) {
    if (tokens.input_ids[k] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("the tokenizer produced id ", tokens.input_ids[k],
                       ", outside the target's vocabulary of ", vocab));
    }
    ids.push_back(tokens.input_ids[k]);
    mask.push_back(tokens.loss_mask[k]);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ChatLineReader::Prompt(const std::string& line,
                                                            int64_t vocab) {
  FD_ASSIGN_OR_RETURN(ChatLine parsed, ParseChatLine(line, vocab));
  std::vector<int64_t> ids;
  if (!parsed.is_chat) {
    for (size_t k = 0; k < parsed.input_ids.size() && parsed.loss_mask[k] == 0; ++k) {
      ids.push_back(parsed.input_ids[k]);
    }
    if (ids.empty())
      return absl::InvalidArgumentError("the first token already has loss: no prompt");
    return ids;
  }
  FD_ASSIGN_OR_RETURN(const Tokenizer* tokenizer, GetTokenizer());
  ApplyChatOptions(options.chat, parsed.messages);
  size_t turns = 0;
  while (turns < parsed.messages.size() && parsed.messages[turns].role != "assistant") ++turns;
  if (turns == 0) return absl::InvalidArgumentError("the chat starts with an assistant turn");
  FD_ASSIGN_OR_RETURN(
      RenderedChat prompt,
      RenderChatPrompt({parsed.messages.begin(), parsed.messages.begin() + turns}, options.chat));
  for (int32_t id : tokenizer->Encode(prompt.text)) {
    if (id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the tokenizer produced id ", id, ", outside the target's vocabulary of ", vocab));
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace flashdraft
