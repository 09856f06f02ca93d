#include "common/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/chat_template.h"

namespace flashdraft {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A small byte-level BPE in the Qwen2 layout: the 256 byte tokens (ids 0-255) and a few merges.
json TinyTokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(static_cast<uint8_t>(b))] = b;
  const std::string sp = ByteLevelChar(' ');  // "Ġ"
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}, {sp, "w"}, {sp + "w", "o"}, {"e", "l"}};
  int id = 256;
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = id++;
    merge_list.push_back(a + " " + b);
  }
  return json{{"normalizer", {{"type", "NFC"}}},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"},
                   {"pattern", {{"Regex", std::string(kQwen2SplitPattern)}}},
                   {"behavior", "Isolated"},
                   {"invert", false}},
                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}},
              {"added_tokens",
               {{{"id", 1000}, {"content", "<|x|>"}, {"special", true}},
                {{"id", 1001}, {"content", "<|x|>y"}, {"special", false}}}}};
}

std::unique_ptr<Tokenizer> Load(const json& j) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromJson(j.dump(), "tiny.json");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(TokenizerTest, MergesByRankAndMatchesAddedTokensLeftmostLongest) {
  auto t = Load(TinyTokenizer());
  ASSERT_NE(t, nullptr);
  const int32_t hello = *t->TokenToId("hello"), wo = *t->TokenToId(ByteLevelChar(' ') + "wo");
  EXPECT_THAT(t->Encode("hello wo"), ElementsAre(hello, wo));
  // "el" has the lowest priority: "h e" merges first, so "hel" never becomes "h" + "el".
  EXPECT_THAT(t->Encode("hel"), ElementsAre(*t->TokenToId("he"), 'l'));
  EXPECT_THAT(t->Encode("a<|x|>yb<|x|>"), ElementsAre('a', 1001, 'b', 1000));
  EXPECT_EQ(t->Decode(t->Encode("a<|x|>yb<|x|> hello")), "a<|x|>yb<|x|> hello");
  EXPECT_EQ(t->Decode(t->Encode("a<|x|>b"), /*skip_special_tokens=*/true), "ab");
  EXPECT_TRUE(t->IsSpecial(1000));
  EXPECT_FALSE(t->IsSpecial(1001));
  EXPECT_EQ(t->vocab_size(), 1002);
}

TEST(TokenizerTest, SplitPatternPiecesFollowTheRegex) {
  auto t = Load(TinyTokenizer());
  ASSERT_NE(t, nullptr);
  struct Case {
    std::string text;
    std::vector<std::string> pieces;
  };
  const std::vector<Case> cases = {
      {"it's", {"it", "'s"}},
      {"IT'S", {"IT", "'S"}},
      {"a  b", {"a", " ", " b"}},  // \s+(?!\S) leaves the last space to " b"
      {"a  ", {"a", "  "}},        // at the end the whole run
      {"x\n\n  y", {"x", "\n\n", " ", " y"}},
      {"12ab", {"1", "2", "ab"}},      // \p{N} one digit at a time (Qwen2)
      {"!!!\n\nz", {"!!!\n\n", "z"}},  // punctuation takes the newlines after it
      {"?a", {"?a"}},                  // one non-letter may lead a word
  };
  for (const Case& c : cases) {
    EXPECT_EQ(t->PreTokenize(c.text), c.pieces) << c.text;
    // Offsets tile the text and the ids decode back to it.
    Tokenizer::Encoding e = t->EncodeWithOffsets(c.text);
    size_t last_end = 0;
    for (const auto& [begin, end] : e.offsets) {
      EXPECT_EQ(begin, last_end) << c.text;
      last_end = end;
    }
    EXPECT_EQ(last_end, c.text.size()) << c.text;
    EXPECT_EQ(t->Decode(e.ids), c.text);
  }
}

TEST(TokenizerTest, NfcNormalizesAndOffsetsPointIntoTheOriginalText) {
  auto t = Load(TinyTokenizer());
  ASSERT_NE(t, nullptr);
  const std::string decomposed =
      "caf"
      "e\xcc\x81"
      "!";  // e + combining acute
  Tokenizer::Encoding e = t->EncodeWithOffsets(decomposed);
  EXPECT_EQ(t->Decode(e.ids), "caf\xc3\xa9!");  // composed é
  ASSERT_FALSE(e.offsets.empty());
  EXPECT_EQ(e.offsets.front().first, 0u);
  EXPECT_EQ(e.offsets.back().second, decomposed.size());
}

TEST(TokenizerTest, DecodeReplacesInvalidUtf8) {
  auto t = Load(TinyTokenizer());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Decode({0xE6, 'a'}),
            "\xEF\xBF\xBD"
            "a");  // a lone lead byte
}

TEST(TokenizerTest, RefusesWhatItDoesNotImplementByName) {
  struct Case {
    std::string name;
    std::function<void(json&)> edit;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       },
       "normalizer 'NFKC'"},
      {"pattern",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+"; },
       "split pattern \\w+"},
      {"model", [](json& j) { j["model"]["type"] = "WordPiece"; }, "model.type 'WordPiece'"},
      {"byte token", [](json& j) { j["model"]["vocab"].erase(ByteLevelChar('a')); },
       "byte-level token of byte 97"},
      {"merge", [](json& j) { j["model"]["merges"].push_back("q zz"); }, "names tokens not in"},
      {"lstrip", [](json& j) { j["added_tokens"][0]["lstrip"] = true; }, "lstrip"},
      {"not json", [](json& j) { j = "x"; }, "not a JSON object"},
      // Ids are checked integers, not converted blindly (a fuzzer's finding: 2.4e104 as an id).
      {"float id", [](json& j) { j["model"]["vocab"]["ll"] = 2.4e104; }, "has id 2.4e+104"},
      {"huge id", [](json& j) { j["added_tokens"][0]["id"] = int64_t{1} << 31; },
       "not an integer in [0, 4194304)"},
      {"negative id", [](json& j) { j["model"]["vocab"]["ll"] = -3; }, "has id -3"},
  };
  for (const Case& c : cases) {
    json j = TinyTokenizer();
    c.edit(j);
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromJson(j.dump(), "tiny.json");
    ASSERT_FALSE(t.ok()) << c.name;
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(c.error)) << c.name;
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("tiny.json")) << c.name;
  }
}

TEST(ChatTemplateTest, RefusesUnknownRolesAndEmptyConversations) {
  EXPECT_FALSE(RenderQwen3Chat({}).ok());
  absl::StatusOr<RenderedChat> r = RenderQwen3Chat({{"user", "hi", {}}, {"tool", "x", {}}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("message 1: role 'tool'"));
}

TEST(ChatTemplateTest, LossMaskCoversAssistantTurnsOnly) {
  auto t = Load(TinyTokenizer());
  ASSERT_NE(t, nullptr);
  absl::StatusOr<RenderedChat> r =
      RenderQwen3Chat({{"user", "hello", {}}, {"assistant", "hello wo", {}}});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->assistant_spans.size(), 1u);
  const auto [begin, end] = r->assistant_spans[0];
  EXPECT_EQ(r->text.substr(begin, end - begin), "<think>\n\n</think>\n\nhello wo<|im_end|>");
  TokenizedChat chat = TokenizeChat(*t, *r);
  std::vector<int32_t> masked;
  for (size_t k = 0; k < chat.input_ids.size(); ++k) {
    if (chat.loss_mask[k]) masked.push_back(chat.input_ids[k]);
  }
  EXPECT_EQ(t->Decode(masked), "<think>\n\n</think>\n\nhello wo<|im_end|>");
}

}  // namespace
}  // namespace flashdraft
