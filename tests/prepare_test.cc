// `flashdraft prepare` on a real (tiny, random) Hugging Face target written by the Python
// reference, then training on what it wrote.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/bpe_trainer.h"
#include "common/chat_template.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::TempDir;
using ::testing::HasSubstr;

const std::string kBin = FLASHDRAFT_BIN_DIR;
const std::string kTargetReference = FLASHDRAFT_SOURCE_DIR "/tests/reference/target_reference.py";

// A tiny random Hugging Face target under <dir>/model, written by the Python reference.
void MakeReferenceTarget(const TempDir& dir, const std::string& flags) {
  auto made = RunCommand(absl::StrCat(::flashdraft::testing::kReferencePython, " ",
                                      kTargetReference, " ", dir.path(), " ", flags));
  ASSERT_EQ(made.exit_code, 0) << made.output;
}

TEST(PrepareTest, ShardsFromARealTargetTrainAndResume) {
  FD_SKIP_WITHOUT_REFERENCE_PYTHON();
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(MakeReferenceTarget(dir, "--arch qwen3 --layers 4 --ids-layers 1"));
  // 40 samples with a prompt (loss_mask 0) then a response (1); line 5 is broken.
  std::ofstream data(dir.Join("data.jsonl"));
  std::mt19937 rng(3);
  for (int i = 0; i < 41; ++i) {
    if (i == 4) {
      data << R"({"input_ids": [1, 2, 999], "loss_mask": [0, 1, 1]})"
           << "\n";
      continue;
    }
    const int len = 30 + static_cast<int>(rng() % 30), prompt = 5;
    nlohmann::json j;
    for (int t = 0; t < len; ++t) {
      j["input_ids"].push_back(static_cast<int>(rng() % 101));
      j["loss_mask"].push_back(t >= prompt ? 1 : 0);
    }
    data << j.dump() << "\n";
  }
  data.close();
  const std::string prepare = absl::StrCat(
      kBin, "/flashdraft prepare --target ", dir.Join("model"), " --data ", dir.Join("data.jsonl"),
      " --out ", dir.Join("shards"), " --layers 1,3 --float32 --samples-per-shard 16");
  auto strict = RunCommand(prepare);
  EXPECT_EQ(strict.exit_code, 1);
  EXPECT_THAT(strict.output,
              HasSubstr("data.jsonl:5: input_ids entry 999 is not a token id in [0, 101)"));

  auto r = RunCommand(prepare + " --skip-bad-lines");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("1 bad line(s) skipped"));
  auto manifest = nlohmann::json::parse(*ReadFile(dir.Join("shards/manifest.json")));
  EXPECT_EQ(manifest["num_samples"], 40);
  EXPECT_EQ(manifest["feature_size"], 64);

  // The features of sample 0 are the target's layers 1 and 3 for its ids.
  auto shard = SafetensorsFile::Open(dir.Join("shards/shard-00000.safetensors"));
  ASSERT_TRUE(shard.ok());
  const TensorView offsets = *(*shard)->Get("offsets");
  int64_t len;
  std::memcpy(&len, offsets.data + 8, 8);
  const TensorView ids = *(*shard)->Get("input_ids");
  SafetensorsWriter ids_writer;
  ASSERT_TRUE(ids_writer.Add("input_ids", DType::kI64, {1, len}, ids.data, len * 8).ok());
  ASSERT_TRUE(ids_writer.Write(dir.Join("ids0.safetensors")).ok());
  auto f = RunCommand(absl::StrCat(kBin, "/flashdraft debug target-features --target ",
                                   dir.Join("model"), " --ids ", dir.Join("ids0.safetensors"),
                                   " --layers 1,3 --out ", dir.Join("f0.safetensors")));
  ASSERT_EQ(f.exit_code, 0) << f.output;
  auto expected = SafetensorsFile::Open(dir.Join("f0.safetensors"));
  ASSERT_TRUE(expected.ok());
  const TensorView want = *(*expected)->Get("hidden_states");
  const TensorView got = *(*shard)->Get("hidden_states");
  ASSERT_EQ(want.nbytes, static_cast<size_t>(len * 64 * 4));
  EXPECT_EQ(std::memcmp(want.data, got.data, want.nbytes), 0);

  // An interrupted run: the manifest and the last shard are gone; a rerun keeps the rest.
  std::filesystem::remove(dir.Join("shards/manifest.json"));
  std::filesystem::remove(dir.Join("shards/shard-00002.safetensors"));
  auto resumed = RunCommand(prepare + " --skip-bad-lines");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("resuming: 32 samples already in complete shards"));
  EXPECT_EQ(nlohmann::json::parse(*ReadFile(dir.Join("shards/manifest.json")))["num_samples"], 40);

  // And the drafter trains on them: coordinator + 2 workers.
  ASSERT_TRUE(WriteFileAtomically(dir.Join("job.yaml"), absl::StrCat(R"(
output_dir: )",
                                                                     dir.Join("run"), R"(
drafter: {num_hidden_layers: 1, block_size: 8, num_target_features: 2, max_anchors: 8}
data: {source: shards, shards_dir: )",
                                                                     dir.Join("shards"), R"(}
train: {max_steps: 8, global_batch_size: 4}
)"))
                  .ok());
  auto run =
      RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir.Join("job.yaml"), " --workers 2"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("job finished: 8 steps"));
}

TEST(PrepareTest, ChatLinesAreRenderedTokenizedAndRegenerated) {
  FD_SKIP_WITHOUT_REFERENCE_PYTHON();
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(
      MakeReferenceTarget(dir, "--arch qwen3 --layers 2 --ids-layers 1 --vocab 300"));
  std::ofstream data(dir.Join("chats.jsonl"));
  data
      << R"({"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hello there"}]})"
      << "\n"
      << R"({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yes"}, {"from": "human", "value": "and?"}, {"from": "gpt", "value": "no"}]})"
      << "\n"
      << R"({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "x"}, {"role": "assistant", "content": "a"}]})"
      << "\n"
      << R"({"conversations": [{"from": "human", "value": "only a question"}]})"
      << "\n";
  data.close();
  const std::string base =
      absl::StrCat(kBin, "/flashdraft prepare --target ", dir.Join("model"), " --data ",
                   dir.Join("chats.jsonl"), " --layers 1 --float32");
  // Without a tokenizer.json in the target folder the chat lines cannot be read.
  auto no_tokenizer = RunCommand(base + " --out " + dir.Join("none"));
  EXPECT_EQ(no_tokenizer.exit_code, 1);
  EXPECT_THAT(no_tokenizer.output, HasSubstr("chats.jsonl:1: chat lines need a tokenizer"));
  EXPECT_THAT(no_tokenizer.output, HasSubstr("(give --tokenizer)"));

  // A byte-level BPE in the Qwen2 layout with the ChatML tokens, ids below the target's 300.
  BpeTrainerOptions bpe;
  bpe.num_merges = 2;
  auto tokenizer_json = TrainByteLevelBpe({"hello hello there"}, bpe);
  ASSERT_TRUE(tokenizer_json.ok()) << tokenizer_json.status();
  ASSERT_TRUE(WriteFileAtomically(dir.Join("model/tokenizer.json"), *tokenizer_json).ok());
  auto strict = RunCommand(base + " --out " + dir.Join("strict"));
  EXPECT_EQ(strict.exit_code, 1);
  EXPECT_THAT(strict.output, HasSubstr("chats.jsonl:3: message 1: role 'tool' is not supported"));
  auto r = RunCommand(base + " --out " + dir.Join("shards") + " --skip-bad-lines");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("chats.jsonl:4: the conversation has no assistant turn"));
  EXPECT_THAT(r.output, HasSubstr("2 bad line(s) skipped"));

  // Sample 0 is the rendered, tokenized conversation with the loss on the assistant's answer.
  auto tokenizer = Tokenizer::FromFile(dir.Join("model/tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto rendered = RenderQwen3Chat({{"user", "hello", {}}, {"assistant", "hello there", {}}});
  ASSERT_TRUE(rendered.ok());
  const TokenizedChat want = TokenizeChat(**tokenizer, *rendered);
  auto shard = SafetensorsFile::Open(dir.Join("shards/shard-00000.safetensors"));
  ASSERT_TRUE(shard.ok()) << shard.status();
  const TensorView ids = *(*shard)->Get("input_ids");
  const TensorView mask = *(*shard)->Get("loss_mask");
  ASSERT_GE(ids.nbytes / 8, want.input_ids.size());
  std::vector<int32_t> masked;
  for (size_t k = 0; k < want.input_ids.size(); ++k) {
    int64_t id;
    std::memcpy(&id, ids.data + 8 * k, 8);
    EXPECT_EQ(id, want.input_ids[k]) << k;
    const bool in_loss = mask.data[k * ElementSize(mask.dtype)] != 0;
    EXPECT_EQ(in_loss, want.loss_mask[k] != 0) << k;
    if (in_loss) masked.push_back(static_cast<int32_t>(id));
  }
  EXPECT_EQ((*tokenizer)->Decode(masked), "<think>\n\n</think>\n\nhello there<|im_end|>");

  // The job's chat options: a system turn for chats without one, and without thinking the empty
  // think block is the prompt's (the server writes it), not the drafter's.
  auto options =
      RunCommand(base + " --out " + dir.Join("options") +
                 " --skip-bad-lines --enable-thinking false --system-prompt 'Be brief.'");
  ASSERT_EQ(options.exit_code, 0) << options.output;
  const ChatRenderOptions brief{false, "Be brief."};
  std::vector<ChatMessage> messages = {{"user", "hello", {}}, {"assistant", "hello there", {}}};
  ApplyChatOptions(brief, messages);
  auto with_options = RenderTrainingChat(messages, brief);
  ASSERT_TRUE(with_options.ok());
  const TokenizedChat want_options = TokenizeChat(**tokenizer, *with_options);
  auto options_shard = SafetensorsFile::Open(dir.Join("options/shard-00000.safetensors"));
  ASSERT_TRUE(options_shard.ok()) << options_shard.status();
  std::vector<int32_t> options_masked;
  for (size_t k = 0; k < want_options.input_ids.size(); ++k) {
    int64_t id;
    std::memcpy(&id, (*options_shard)->Get("input_ids")->data + 8 * k, 8);
    EXPECT_EQ(id, want_options.input_ids[k]) << k;
    const TensorView options_mask = *(*options_shard)->Get("loss_mask");
    if (options_mask.data[k * ElementSize(options_mask.dtype)] != 0) {
      options_masked.push_back(static_cast<int32_t>(id));
    }
  }
  EXPECT_EQ((*tokenizer)->Decode(options_masked), "hello there<|im_end|>");
  EXPECT_EQ((*tokenizer)->Decode(want_options.input_ids).rfind("<|im_start|>system\nBe brief.", 0),
            0u);

  // --regenerate: the answers are the (random) target's own, at most 3 tokens each.
  auto regen = RunCommand(base + " --out " + dir.Join("regen") +
                          " --skip-bad-lines --regenerate --max-new-tokens 3");
  ASSERT_EQ(regen.exit_code, 0) << regen.output;
  auto regen_shard = SafetensorsFile::Open(dir.Join("regen/shard-00000.safetensors"));
  ASSERT_TRUE(regen_shard.ok());
  const TensorView regen_ids = *(*regen_shard)->Get("input_ids");
  int64_t first_len;  // offsets[1]: the end of sample 0
  std::memcpy(&first_len, (*regen_shard)->Get("offsets")->data + 8, 8);
  std::vector<int64_t> got(static_cast<size_t>(first_len));
  std::memcpy(got.data(), regen_ids.data, got.size() * 8);
  // The prompt part is the same; the answer is the target's (≤ 3 tokens + the template's).
  const size_t prompt = static_cast<size_t>(
      std::find(want.loss_mask.begin(), want.loss_mask.end(), 1) - want.loss_mask.begin());
  ASSERT_GT(got.size(), prompt);
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + prompt, want.input_ids.begin()));
  EXPECT_NE(got, std::vector<int64_t>(want.input_ids.begin(), want.input_ids.end()));
  // <think>\n\n</think>\n\n (6 tokens here), the answer's 3 tokens as text (a partial UTF-8
  // sequence decodes to U+FFFD, 3 byte tokens when encoded again), <|im_end|>.
  EXPECT_LE(got.size(), prompt + 6 + 3 * 3 + 1);
}

TEST(PrepareTest, ImportsSpecForgeSamplesWrittenByTorchSave) {
  FD_SKIP_WITHOUT_REFERENCE_PYTHON();
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(MakeReferenceTarget(dir, "--arch qwen3 --layers 4 --ids-layers 1"));
  // SpecForge's layout: one torch.save dict per sample under rows_*/; data_3 has the wrong
  // width, data_5 is not a torch file; data_10 sorts after data_6.
  auto written = ::flashdraft::testing::RunReferencePython(R"(
import json, os, sys, torch
root = sys.argv[1]
os.makedirs(root + "/rows_0")
g = torch.Generator().manual_seed(7)
summary = []
for i in [0, 1, 2, 3, 4, 5, 6, 10]:
    path = f"{root}/rows_0/data_{i}.ckpt"
    if i == 5:
        open(path, "wb").write(b"not a pickle")
        continue
    L = 10 + i
    ids = torch.randint(0, 101, (1, L), generator=g)
    mask = (torch.arange(L) >= 4).long().unsqueeze(0)
    width = 48 if i == 3 else 64
    hs = torch.randn(1, L, width, generator=g, dtype=torch.float32)
    torch.save({"input_ids": ids, "loss_mask": mask, "hidden_states": hs}, path)
    if i != 3:
        summary.append({"ids": ids[0].tolist(), "sum": float(hs.double().sum())})
print(json.dumps(summary))
)",
                                                           {dir.Join("sf")});
  ASSERT_TRUE(written.ok()) << written.status();
  const nlohmann::json expected = nlohmann::json::parse(*written);
  const std::string prepare =
      absl::StrCat(kBin, "/flashdraft prepare --target ", dir.Join("model"), " --import-specforge ",
                   dir.Join("sf"), " --out ", dir.Join("shards"), " --float32");
  auto strict = RunCommand(prepare);
  EXPECT_EQ(strict.exit_code, 1);
  EXPECT_THAT(strict.output,
              HasSubstr("data_3.ckpt: hidden_states width 48 is not 2 layers x "
                        "hidden size 32 = 64 (--skip-bad-lines to skip such files)"));
  auto r = RunCommand(prepare + " --skip-bad-lines");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("data_5.ckpt: not a torch.save file"));
  EXPECT_THAT(r.output, HasSubstr("2 bad file(s) skipped"));
  auto manifest = nlohmann::json::parse(*ReadFile(dir.Join("shards/manifest.json")));
  EXPECT_EQ(manifest["num_samples"], 6);
  // Samples in natural file order, ids and features as saved.
  auto shard = SafetensorsFile::Open(dir.Join("shards/shard-00000.safetensors"));
  ASSERT_TRUE(shard.ok());
  const TensorView offsets = *(*shard)->Get("offsets");
  const TensorView ids = *(*shard)->Get("input_ids");
  const TensorView feats = *(*shard)->Get("hidden_states");
  ASSERT_EQ(expected.size(), 6u);
  for (size_t k = 0; k < expected.size(); ++k) {
    int64_t begin, end;
    std::memcpy(&begin, offsets.data + 8 * k, 8);
    std::memcpy(&end, offsets.data + 8 * (k + 1), 8);
    std::vector<int64_t> got(static_cast<size_t>(end - begin));
    std::memcpy(got.data(), ids.data + 8 * begin, got.size() * 8);
    EXPECT_EQ(got, expected[k]["ids"].get<std::vector<int64_t>>()) << "sample " << k;
    double sum = 0;
    for (int64_t i = begin * 64; i < end * 64; ++i) {
      float v;
      std::memcpy(&v, feats.data + 4 * i, 4);
      sum += v;
    }
    EXPECT_NEAR(sum, expected[k]["sum"].get<double>(), 1e-9) << "sample " << k;
  }
}

TEST(PrepareTest, MissingInputsAreNamed) {
  TempDir dir;
  auto r = RunCommand(absl::StrCat(kBin, "/flashdraft prepare --target ", dir.Join("nope"),
                                   " --data ", dir.Join("d.jsonl"), " --out ", dir.Join("o")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("nope/config.json: cannot open"));
  for (const std::string& inputs :
       {std::string(""), absl::StrCat(" --data x.jsonl --import-specforge ", dir.path())}) {
    auto both = RunCommand(absl::StrCat(kBin, "/flashdraft prepare --target ", dir.Join("nope"),
                                        " --out ", dir.Join("o"), inputs));
    EXPECT_EQ(both.exit_code, 1);
    EXPECT_THAT(both.output, HasSubstr("give exactly one of --data and --import-specforge"));
  }
  auto empty =
      RunCommand(absl::StrCat(kBin, "/flashdraft prepare --target ", dir.Join("nope"), " --out ",
                              dir.Join("o"), " --import-specforge ", dir.Join("none")));
  EXPECT_EQ(empty.exit_code, 1);
  auto teacher =
      RunCommand(absl::StrCat(kBin, "/flashdraft prepare --target ", dir.Join("nope"), " --out ",
                              dir.Join("o"), " --import-specforge ", dir.path(), " --teacher"));
  EXPECT_EQ(teacher.exit_code, 1);
  EXPECT_THAT(teacher.output, HasSubstr("--teacher needs --data"));
  // A system prompt the job file would refuse is refused here too, before any work.
  auto prompt = RunCommand(absl::StrCat(kBin, "/flashdraft prepare --target ", dir.Join("nope"),
                                        " --data ", dir.Join("d.jsonl"), " --out ", dir.Join("o"),
                                        " --system-prompt \"$(printf 'a\\rb')\""));
  EXPECT_NE(prompt.exit_code, 0);
  EXPECT_THAT(prompt.output, HasSubstr("--system-prompt: the text has a control character (byte 1 "
                                       "is 0x0d)"));
}

}  // namespace
}  // namespace flashdraft
