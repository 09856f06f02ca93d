#include "common/chat_line.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

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

absl::StatusOr<ChatLine> ParseChatLine(const std::string& line, int64_t vocab) {
  ChatLine out;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", e.what()));
  }
  if (j.is_object() && !j.contains("input_ids") &&
      (j.contains("messages") || j.contains("conversations"))) {
    out.is_chat = true;
    FD_ASSIGN_OR_RETURN(out.messages, ParseChatMessages(j));
    if (std::none_of(out.messages.begin(), out.messages.end(),
                     [](const ChatMessage& m) { return m.role == "assistant"; })) {
      return absl::InvalidArgumentError("the conversation has no assistant turn to learn");
    }
    return out;
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
    out.input_ids.push_back(v.get<int64_t>());
  }
  for (const auto& v : j["loss_mask"]) {
    if (!v.is_number_integer() || (v.get<int64_t>() != 0 && v.get<int64_t>() != 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("loss_mask entry ", v.dump(), " is not 0 or 1"));
    }
    out.loss_mask.push_back(v.get<int64_t>());
  }
  if (out.input_ids.empty() || out.input_ids.size() != out.loss_mask.size()) {
    return absl::InvalidArgumentError(absl::StrCat("input_ids (", out.input_ids.size(),
                                                   ") and loss_mask (", out.loss_mask.size(),
                                                   ") must have the same, non-zero length"));
  }
  return out;
}

}  // namespace flashdraft
