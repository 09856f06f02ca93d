// The job's chat options (ChatRenderOptions) on top of the Qwen3 template; the template itself is
// checked against Python's Jinja2 in tests/tokenizer_reference_test.cc.
#include "common/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "common/crc32c.h"

namespace flashdraft {
namespace {

using ::testing::IsEmpty;

std::string Spans(const RenderedChat& chat) {
  std::string out;
  for (const auto& [begin, end] : chat.assistant_spans) {
    out += "[" + chat.text.substr(begin, end - begin) + "]";
  }
  return out;
}

std::vector<ChatMessage> Thinking() {
  return {{"user", "2+2?", std::nullopt},
          {"assistant", "<think>\nadd\n</think>\n\n4", std::nullopt},
          {"user", "3+3?", std::nullopt},
          {"assistant", "6", std::string("add again")}};
}

TEST(ChatOptionsTest, TheDefaultsChangeNothing) {
  std::vector<ChatMessage> messages = Thinking();
  ApplyChatOptions({}, messages);
  auto applied = RenderTrainingChat(messages, {});
  auto plain = RenderQwen3Chat(Thinking());
  ASSERT_TRUE(applied.ok() && plain.ok());
  EXPECT_EQ(applied->text, plain->text);
  EXPECT_EQ(applied->assistant_spans, plain->assistant_spans);
  EXPECT_THAT(ChatOptionsKey({}), IsEmpty());
  ChatTemplateOptions generation;
  generation.add_generation_prompt = true;
  EXPECT_EQ(RenderChatPrompt({{"user", "q", std::nullopt}}, {})->text,
            RenderQwen3Chat({{"user", "q", std::nullopt}}, generation)->text);
}

TEST(ChatOptionsTest, NonThinkingDropsTheReasoningAndKeepsTheEmptyBlockOutOfTheLoss) {
  ChatRenderOptions options;
  options.enable_thinking = false;
  std::vector<ChatMessage> messages = Thinking();
  ApplyChatOptions(options, messages);
  EXPECT_EQ(messages[1].content, "4");
  EXPECT_EQ(messages[3].reasoning_content, std::nullopt);
  auto chat = RenderTrainingChat(messages, options);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->text,
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n6<|im_end|>\n");
  // The server writes the empty block into the prompt (below): only the answers are drafted.
  EXPECT_EQ(Spans(*chat), "[4<|im_end|>][6<|im_end|>]");
  auto prompt = RenderChatPrompt({messages.begin(), messages.begin() + 3}, options);
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(prompt->text,
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // Training text = prompt + drafted answer, as the server's context will be.
  EXPECT_EQ(chat->text, prompt->text + "6<|im_end|>\n");
  EXPECT_EQ(ChatOptionsKey(options), "; thinking off");
}

TEST(ChatOptionsTest, TheSystemPromptGoesWhereAChatHasNone) {
  ChatRenderOptions options;
  options.system_prompt = "Be brief.";
  std::vector<ChatMessage> none = {{"user", "q", std::nullopt}, {"assistant", "a", std::nullopt}};
  ApplyChatOptions(options, none);
  ASSERT_EQ(none.size(), 3u);
  EXPECT_EQ(none[0].role, "system");
  EXPECT_EQ(none[0].content, "Be brief.");
  EXPECT_EQ(RenderChatPrompt({none.begin(), none.begin() + 2}, options)->text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\n");
  // A chat with its own system turn, wherever it is, keeps it and gets no second one.
  std::vector<ChatMessage> own = {{"user", "q", std::nullopt},
                                  {"system", "late", std::nullopt},
                                  {"assistant", "a", std::nullopt}};
  ApplyChatOptions(options, own);
  EXPECT_EQ(own.size(), 3u);
  EXPECT_EQ(own[0].role, "user");
  EXPECT_EQ(ChatOptionsKey(options),
            "; system prompt " + absl::StrFormat("%08x", Crc32c("Be brief.", 9)) + " (9 B)");
  options.system_prompt = "Be brief!";
  EXPECT_NE(ChatOptionsKey(options),
            "; system prompt " + absl::StrFormat("%08x", Crc32c("Be brief.", 9)) + " (9 B)");
}

}  // namespace
}  // namespace flashdraft
