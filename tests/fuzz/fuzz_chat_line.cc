// libFuzzer: chat data lines (JSONL): parsed, and chats rendered with the Qwen3 template.
#include <cstdint>
#include <string>

#include "common/chat_line.h"
#include "common/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto line = flashdraft::ParseChatLine(std::string(reinterpret_cast<const char*>(data), size),
                                        /*vocab=*/1000);
  if (line.ok() && line->is_chat) (void)flashdraft::RenderQwen3Chat(line->messages);
  return 0;
}
