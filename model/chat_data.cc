#include "model/chat_data.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/generate.h"

namespace flashdraft {
namespace {

absl::StatusOr<std::vector<ChatMessage>> ParseChatMessages(const nlohmann::json& j) {
  std::vector<ChatMessage> messages;
  const bool openai = j.contains("messages");
  const nlohmann::json& list = openai ? j["messages"] : j["conversations"];
  if (!list.is_array() || list.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", openai ? "messages" : "conversations", "\" must be a non-empty list"));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& m = list[i];
    const char* role_key = openai ? "role" : "from";
    const char* content_key = openai ? "content" : "value";
    if (!m.is_object() || !m.contains(role_key) || !m[role_key].is_string() ||
        !m.contains(content_key) || !m[content_key].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, " needs string \"", role_key,
                                                     "\" and \"", content_key, "\""));
    }
    ChatMessage msg{m[role_key].get<std::string>(), m[content_key].get<std::string>(),
                    std::nullopt};
    if (openai && msg.role != "system" && msg.role != "user" && msg.role != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, ": role '", msg.role,
                       "' is not supported (supported: system, user, assistant)"));
    }
    if (!openai) {
      if (msg.role == "human" || msg.role == "user") {
        msg.role = "user";
      } else if (msg.role == "gpt" || msg.role == "assistant") {
        msg.role = "assistant";
      } else if (msg.role != "system") {
        return absl::InvalidArgumentError(
            absl::StrCat("message ", i, ": \"from\" is '", msg.role,
                         "' (supported: human, gpt, system, user, assistant)"));
      }
    }
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string()) {
      msg.reasoning_content = m["reasoning_content"].get<std::string>();
    }
    messages.push_back(std::move(msg));
  }
  return messages;
}

}  // namespace

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
    ChatTemplateOptions o;
    o.add_generation_prompt = true;
    FD_ASSIGN_OR_RETURN(RenderedChat prompt,
                        RenderQwen3Chat({messages.begin(), messages.begin() + i}, o));
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
  *is_chat = false;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", e.what()));
  }
  ids.clear();
  mask.clear();
  if (j.is_object() && !j.contains("input_ids") &&
      (j.contains("messages") || j.contains("conversations"))) {
    *is_chat = true;
    FD_ASSIGN_OR_RETURN(std::vector<ChatMessage> messages, ParseChatMessages(j));
    if (std::none_of(messages.begin(), messages.end(),
                     [](const ChatMessage& m) { return m.role == "assistant"; })) {
      return absl::InvalidArgumentError("the conversation has no assistant turn to learn");
    }
    FD_ASSIGN_OR_RETURN(const Tokenizer* tokenizer, GetTokenizer());
    if (regenerate) FD_RETURN_IF_ERROR(Regenerate(*tokenizer, messages));
    FD_ASSIGN_OR_RETURN(RenderedChat rendered, RenderQwen3Chat(messages));
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
  if (!j.is_object() || !j.contains("input_ids") || !j["input_ids"].is_array() ||
      !j.contains("loss_mask") || !j["loss_mask"].is_array()) {
    return absl::InvalidArgumentError(
        "needs \"input_ids\" and \"loss_mask\" lists, \"messages\" or \"conversations\"");
  }
  for (const auto& v : j["input_ids"]) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("input_ids entry ", v.dump(), " is not a token id in [0, ", vocab, ")"));
    }
    ids.push_back(v.get<int64_t>());
  }
  for (const auto& v : j["loss_mask"]) {
    if (!v.is_number_integer() || (v.get<int64_t>() != 0 && v.get<int64_t>() != 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("loss_mask entry ", v.dump(), " is not 0 or 1"));
    }
    mask.push_back(v.get<int64_t>());
  }
  if (ids.empty() || ids.size() != mask.size()) {
    return absl::InvalidArgumentError(absl::StrCat("input_ids (", ids.size(), ") and loss_mask (",
                                                   mask.size(),
                                                   ") must have the same, non-zero length"));
  }
  return absl::OkStatus();
}

}  // namespace flashdraft
