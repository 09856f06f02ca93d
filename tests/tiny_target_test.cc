// `flashdraft make-tiny-target`: a trained Qwen3-shaped Hugging Face folder that an independent
// reference reads identically, that is cached, and that `prepare` turns into shards from chats.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/chat_line.h"
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
using ::testing::Not;

const std::string kCli = FLASHDRAFT_CLI;

TEST(TinyTargetTest, TrainsIsReadByTheReferenceIsCachedAndPrepares) {
  TempDir dir;
  const std::string make = absl::StrCat(kCli, " make-tiny-target --out ", dir.Join("tiny"),
                                        " --steps 20 --merges 64 --hidden 64 --layers 2");
  auto r = RunCommand(make);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(loss ([0-9.]+) -> ([0-9.]+))")))
      << r.output;
  EXPECT_LT(std::stod(m[2]), std::stod(m[1]) - 0.5) << "the loss must fall";
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json",
                        "tokenizer_config.json", "generation_config.json"}) {
    EXPECT_TRUE(std::filesystem::exists(dir.Join(std::string("tiny/") + f))) << f;
  }
  auto tokenizer = Tokenizer::FromFile(dir.Join("tiny/tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->Decode((*tokenizer)->Encode("GNU General Public License")),
            "GNU General Public License");

  auto again = RunCommand(make);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_THAT(again.output, HasSubstr("is up to date"));

  // Chats → shards with the folder's own tokenizer.
  std::ofstream(dir.Join("chats.jsonl"))
      << R"({"messages": [{"role": "user", "content": "What is this License?"}, )"
      << R"({"role": "assistant", "content": "The GNU General Public License."}]})"
      << "\n";
  auto prepared = RunCommand(absl::StrCat(kCli, " prepare --target ", dir.Join("tiny"), " --data ",
                                          dir.Join("chats.jsonl"), " --out ", dir.Join("shards"),
                                          " --layers 0,1 --regenerate"));
  ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  EXPECT_EQ(nlohmann::json::parse(*ReadFile(dir.Join("shards/manifest.json")))["num_samples"], 1);
  // Not on a terminal: no bar redrawn in place (plain progress lines come every 10 s).
  for (const auto* out : {&r.output, &prepared.output}) {
    EXPECT_EQ(out->find('\r'), std::string::npos) << *out;
    EXPECT_THAT(*out, Not(HasSubstr("[#")));
  }
  // On a terminal (script(1) gives it one): a bar with the rate and what was done.
  if (access("/usr/bin/script", X_OK) == 0) {
    auto on_tty = RunCommand(absl::StrCat(
        "script -qec '", kCli, " prepare --target ", dir.Join("tiny"), " --data ",
        dir.Join("chats.jsonl"), " --out ", dir.Join("tty-shards"), " --layers 0,1' /dev/null"));
    ASSERT_EQ(on_tty.exit_code, 0) << on_tty.output;
    EXPECT_THAT(on_tty.output,
                ::testing::ContainsRegex("\rprepare  \\[#+\\]  100%  [0-9.]+ B/[0-9.]+ B  .*/s  in "
                                         "[0-9]+:[0-9]+  1 samples, [0-9]+ tokens"));
  }

  // An independent float64 reference reads the folder as Hugging Face would.
  if (!::flashdraft::testing::ReferencePythonUnavailableReason().empty()) {
    GTEST_SKIP() << "the reference parity part needs /usr/bin/python3 with torch";
  }
  auto ref =
      RunCommand(absl::StrCat(::flashdraft::testing::kReferencePython, " ", FLASHDRAFT_SOURCE_DIR,
                              "/tests/reference/target_reference.py ", dir.Join("ref"),
                              " --existing ", dir.Join("tiny"), " --ids-layers 0,1"));
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  auto ours = RunCommand(absl::StrCat(kCli, " debug target-features --target ", dir.Join("tiny"),
                                      " --ids ", dir.Join("ref/ids.safetensors"),
                                      " --layers 0,1 --out ", dir.Join("ours.safetensors")));
  ASSERT_EQ(ours.exit_code, 0) << ours.output;
  auto want = SafetensorsFile::Open(dir.Join("ref/ref.safetensors"));
  auto got = SafetensorsFile::Open(dir.Join("ours.safetensors"));
  ASSERT_TRUE(want.ok() && got.ok());
  for (const char* name : {"hidden_states", "logits"}) {
    const TensorView a = *(*want)->Get(name), b = *(*got)->Get(name);
    ASSERT_EQ(a.nbytes, b.nbytes) << name;
    double diff = 0, norm = 0;
    for (size_t i = 0; i < a.nbytes / 4; ++i) {
      float x, y;
      std::memcpy(&x, a.data + 4 * i, 4);
      std::memcpy(&y, b.data + 4 * i, 4);
      diff += (x - y) * double(x - y);
      norm += double(x) * x;
    }
    EXPECT_LE(std::sqrt(diff / norm), 1e-5) << name;
  }
}

// job.yaml in `dir` for the tiny target `dir`/tiny (its layers 0 and 1, a one-layer drafter), with
// `data` and `train` as those sections' flow mappings.
void WriteTinyJob(const TempDir& dir, const std::string& data, const std::string& train) {
  ASSERT_TRUE(WriteFileAtomically(dir.Join("job.yaml"),
                                  absl::StrCat("target: {path: ", dir.Join("tiny"),
                                               ", layer_ids: [0, 1]}\n"
                                               "drafter: {num_hidden_layers: 1, block_size: 8, "
                                               "num_target_features: 2, max_anchors: 16}\n"
                                               "data: ",
                                               data, "\ntrain: ", train, "\n"))
                  .ok());
}

// `flashdraft launch` of `dir`/job.yaml with one worker into `dir`/`out`, stderr too.
::flashdraft::testing::CommandResult LaunchTinyJob(const TempDir& dir, const std::string& out,
                                                   const std::string& flags) {
  return RunCommand(absl::StrCat(kCli, " launch ", dir.Join("job.yaml"), " --workers 1 --out ",
                                 dir.Join(out), " ", flags, " 2>&1"));
}

// The drafter weights the launch into `dir`/`out` exported.
std::string ExportedDrafter(const TempDir& dir, const std::string& out) {
  return *ReadFile(dir.Join(out + "/drafter/model.safetensors"));
}

// data.sources: a file of weight 1 is the same job as data.jsonl, to the bit; weights repeat a
// file's lines (2) or keep a seeded share of them (0.5).
TEST(OnlineTargetTest, ADataMixWeighsItsFiles) {
  TempDir dir;
  auto made = RunCommand(
      absl::StrCat(kCli, " make-tiny-target --out ", dir.Join("tiny"),
                   " --steps 40 --merges 128 --hidden 64 --layers 2 && head -n 6 ",
                   dir.Join("tiny/chats.jsonl"), " >", dir.Join("a.jsonl"), " && sed -n 7,10p ",
                   dir.Join("tiny/chats.jsonl"), " >", dir.Join("b.jsonl")));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ASSERT_NO_FATAL_FAILURE(
      WriteTinyJob(dir, absl::StrCat("{source: target, jsonl: ", dir.Join("a.jsonl"), "}"),
                   "{max_steps: 3, global_batch_size: 2}"));
  auto launch = [&](const std::string& out, const std::string& flags) {
    return LaunchTinyJob(dir, out, flags);
  };
  auto drafter = [&](const std::string& out) { return ExportedDrafter(dir, out); };
  auto one = launch("one", "");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_THAT(one.output, HasSubstr("; 6 samples, 3 steps"));
  auto as_mix =
      launch("as-mix", absl::StrCat("--set \"data.jsonl=''\" --set 'data.sources=[{jsonl: ",
                                    dir.Join("a.jsonl"), "}]'"));
  ASSERT_EQ(as_mix.exit_code, 0) << as_mix.output;
  EXPECT_TRUE(drafter("one") == drafter("as-mix"));
  auto mix = launch(
      "mix",
      absl::StrCat("--set \"data.jsonl=''\" --set 'data.sources=[{jsonl: ", dir.Join("a.jsonl"),
                   ", weight: 2}, {jsonl: ", dir.Join("b.jsonl"), ", weight: 0.5}]'"));
  ASSERT_EQ(mix.exit_code, 0) << mix.output;
  EXPECT_THAT(mix.output, HasSubstr("a.jsonl: lines 1-6 of the mix, 6 sample(s), weight 2"));
  EXPECT_THAT(mix.output, HasSubstr("b.jsonl: lines 7-10 of the mix, 4 sample(s), weight 0.5"));
  EXPECT_THAT(mix.output, HasSubstr("; 14 samples, 3 steps"));  // 2 x 6 + 0.5 x 4
  EXPECT_FALSE(drafter("one") == drafter("mix"));
  // A file that is not there is named.
  auto missing = launch(
      "missing", absl::StrCat("--set \"data.jsonl=''\" --set 'data.sources=[{jsonl: ",
                              dir.Join("a.jsonl"), "}, {jsonl: ", dir.Join("none.jsonl"), "}]'"));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_THAT(missing.output, HasSubstr("none.jsonl: cannot open"));
}

// drafter.layer_types / sliding_window: a drafter with a sliding layer trains on the online
// target (not the bits of the same drafter with full layers), exports the config keys servers
// read, is served by `flashdraft eval`, and seeds a job with the same layers; a job whose layers
// differ from the drafter it starts from is refused naming both.
TEST(OnlineTargetTest, ASlidingWindowDrafterTrainsIsServedAndSeedsAJob) {
  TempDir dir;
  auto made = RunCommand(absl::StrCat(kCli, " make-tiny-target --out ", dir.Join("tiny"),
                                      " --steps 40 --merges 128 --hidden 64 --layers 2"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ASSERT_NO_FATAL_FAILURE(
      WriteTinyJob(dir, absl::StrCat("{source: target, jsonl: ", dir.Join("tiny/chats.jsonl"), "}"),
                   "{max_steps: 4, global_batch_size: 2}"));
  auto launch = [&](const std::string& out, const std::string& flags) {
    return LaunchTinyJob(dir, out, "--set drafter.num_hidden_layers=2 " + flags);
  };
  const std::string sliding =
      "--set 'drafter.layer_types=[sliding_attention, full_attention]' "
      "--set drafter.sliding_window=8";
  auto run = launch("run", sliding);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto full = launch("full", "");
  ASSERT_EQ(full.exit_code, 0) << full.output;
  EXPECT_FALSE(ExportedDrafter(dir, "run") == ExportedDrafter(dir, "full"));

  const nlohmann::json config =
      nlohmann::json::parse(*ReadFile(dir.Join("run/drafter/config.json")), nullptr, false);
  ASSERT_TRUE(config.is_object());
  EXPECT_EQ(config["layer_types"], nlohmann::json::array({"sliding_attention", "full_attention"}));
  EXPECT_EQ(config["sliding_window"], 8);
  EXPECT_EQ(config["use_sliding_window"], true);
  EXPECT_FALSE(nlohmann::json::parse(*ReadFile(dir.Join("full/drafter/config.json")))
                   .contains("layer_types"));

  auto served =
      RunCommand(absl::StrCat(kCli, " eval --target ", dir.Join("tiny"), " --drafter ",
                              dir.Join("run/drafter"), " --prompts ", dir.Join("tiny/chats.jsonl"),
                              " --limit 2 --max-new-tokens 24 --json 2>/dev/null"));
  ASSERT_EQ(served.exit_code, 0) << served.output;
  const nlohmann::json report = nlohmann::json::parse(served.output, nullptr, false);
  ASSERT_TRUE(report.is_object()) << served.output;
  EXPECT_EQ(report["lossless"], true);
  EXPECT_EQ(report["prompts"], 2);

  const std::string from = " --set drafter.init_from=" + dir.Join("run/drafter");
  auto tuned = launch("tuned", sliding + from);
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  EXPECT_THAT(tuned.output, HasSubstr("starts from " + dir.Join("run/drafter")));
  auto wrong = launch("wrong", from);
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_THAT(wrong.output,
              HasSubstr("run/drafter/config.json: its layers are [sliding_attention, "
                        "full_attention] with sliding_window 8 but the job's drafter has all "
                        "full_attention"));
}

// The step records of `run`/steps.jsonl.
std::vector<nlohmann::json> StepRecords(const std::string& run) {
  std::vector<nlohmann::json> steps;
  std::ifstream in(run + "/steps.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step") && j.contains("loss")) steps.push_back(std::move(j));
  }
  return steps;
}

// Element i of a float tensor (F32 or BF16) as float.
float FloatAt(const TensorView& t, int64_t i) {
  float x = 0;
  if (t.dtype == DType::kBF16) {
    uint16_t half;
    std::memcpy(&half, t.data + 2 * i, 2);
    const uint32_t bits = static_cast<uint32_t>(half) << 16;
    std::memcpy(&x, &bits, 4);
  } else {
    std::memcpy(&x, t.data + 4 * i, 4);
  }
  return x;
}

// The teacher columns of the first sample of the shards in `shards` (the last `hidden` of each
// row) through the target's lm_head give the target's own logits (`debug target-features`): the
// teacher is the state lm_head reads, after the final norm, up to its bf16 rounding.
void ExpectTheTeacherGivesTheTargetsLogits(const TempDir& dir, const std::string& shards,
                                           int64_t hidden) {
  auto shard = SafetensorsFile::Open(dir.Join(shards + "/shard-00000.safetensors"));
  auto frozen = SafetensorsFile::Open(dir.Join(shards + "/target.safetensors"));
  ASSERT_TRUE(shard.ok() && frozen.ok());
  const TensorView ids = *(*shard)->Get("input_ids"), rows = *(*shard)->Get("hidden_states");
  int64_t len = 0;
  std::memcpy(&len, (*(*shard)->Get("offsets")).data + 8, 8);  // sample 0: tokens 0 .. len-1
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("input_ids", DType::kI64, {1, len}, ids.data, len * 8).ok());
  ASSERT_TRUE(writer.Write(dir.Join("teacher-ids.safetensors")).ok());
  auto ran = RunCommand(absl::StrCat(kCli, " debug target-features --target ", dir.Join("tiny"),
                                     " --ids ", dir.Join("teacher-ids.safetensors"),
                                     " --layers 0 --out ", dir.Join("teacher-ref.safetensors")));
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  auto ref = SafetensorsFile::Open(dir.Join("teacher-ref.safetensors"));
  ASSERT_TRUE(ref.ok());
  const TensorView logits = *(*ref)->Get("logits");
  const TensorView head = (*frozen)->Contains("lm_head.weight")
                              ? *(*frozen)->Get("lm_head.weight")
                              : *(*frozen)->Get("embed_tokens.weight");
  const int64_t vocab = head.shape[0], row = rows.shape[1];
  ASSERT_EQ(logits.shape, (std::vector<int64_t>{1, len, vocab}));
  double diff = 0, norm = 0;
  for (int64_t t = 0; t < len; ++t) {
    for (int64_t v = 0; v < vocab; ++v) {
      double z = 0;
      for (int64_t h = 0; h < hidden; ++h) {
        z += double(FloatAt(rows, t * row + row - hidden + h)) * FloatAt(head, v * hidden + h);
      }
      const double want = FloatAt(logits, t * vocab + v);
      diff += (z - want) * (z - want);
      norm += want * want;
    }
  }
  EXPECT_LT(std::sqrt(diff / norm), 0.02) << "the teacher columns are not lm_head's input";
}

// train.loss kl / mix: the target's final hidden state travels with the features, from the online
// target, from a feeder (the same bits) and from shards prepared with --teacher (the same bits
// again); every step record says its KL, which falls. Shards without the teacher are refused for
// kl and train ce as before, and a teacher the loss does not use changes nothing.
TEST(OnlineTargetTest, DistillationTrainsFromTheTargetAFeederAndTeacherShards) {
  TempDir dir;
  auto made = RunCommand(absl::StrCat(kCli, " make-tiny-target --out ", dir.Join("tiny"),
                                      " --steps 40 --merges 128 --hidden 64 --layers 2"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ASSERT_NO_FATAL_FAILURE(
      WriteTinyJob(dir, absl::StrCat("{source: target, jsonl: ", dir.Join("tiny/chats.jsonl"), "}"),
                   "{max_steps: 8, global_batch_size: 4, learning_rate: 0.003}"));
  auto launch = [&](const std::string& out, const std::string& flags) {
    return LaunchTinyJob(dir, out, flags);
  };
  auto drafter = [&](const std::string& out) { return ExportedDrafter(dir, out); };
  auto kl = launch("kl", "--set train.loss=kl");
  ASSERT_EQ(kl.exit_code, 0) << kl.output;
  const std::vector<nlohmann::json> steps = StepRecords(dir.Join("kl"));
  ASSERT_EQ(steps.size(), 8u);
  for (const nlohmann::json& r : steps) {
    ASSERT_TRUE(r.contains("kl")) << r.dump();
    EXPECT_GT(r["kl"].get<double>(), 0.0) << r.dump();
  }
  EXPECT_LT(steps.back()["kl"].get<double>(), steps.front()["kl"].get<double>());
  auto ce = launch("ce", "");
  ASSERT_EQ(ce.exit_code, 0) << ce.output;
  EXPECT_FALSE(StepRecords(dir.Join("ce")).front().contains("kl"));
  EXPECT_FALSE(drafter("kl") == drafter("ce"));
  auto mix = launch("mix", "--set train.loss=mix --set train.ce_weight=0.5");
  ASSERT_EQ(mix.exit_code, 0) << mix.output;
  EXPECT_FALSE(drafter("mix") == drafter("kl"));
  EXPECT_FALSE(drafter("mix") == drafter("ce"));

  auto fed = launch("fed", "--set train.loss=kl --feeders 1");
  ASSERT_EQ(fed.exit_code, 0) << fed.output;
  EXPECT_TRUE(drafter("fed") == drafter("kl")) << "a feeder's teacher is the coordinator's";

  const std::string prepare = absl::StrCat(kCli, " prepare --target ", dir.Join("tiny"), " --data ",
                                           dir.Join("tiny/chats.jsonl"), " --layers 0,1 --out ");
  auto teacher = RunCommand(prepare + dir.Join("teacher") + " --teacher");
  ASSERT_EQ(teacher.exit_code, 0) << teacher.output;
  EXPECT_EQ(nlohmann::json::parse(*ReadFile(dir.Join("teacher/manifest.json")))["teacher_size"],
            64);
  ASSERT_NO_FATAL_FAILURE(ExpectTheTeacherGivesTheTargetsLogits(dir, "teacher", 64));
  auto plain = RunCommand(prepare + dir.Join("plain"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto shards = [&](const std::string& name) {
    return absl::StrCat("--set data.source=shards --set data.shards_dir=", dir.Join(name));
  };
  auto from_shards = launch("kl-shards", "--set train.loss=kl " + shards("teacher"));
  ASSERT_EQ(from_shards.exit_code, 0) << from_shards.output;
  EXPECT_TRUE(drafter("kl-shards") == drafter("kl")) << "prepared teacher = the online one";
  auto refused = launch("kl-plain", "--set train.loss=kl " + shards("plain"));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(
      refused.output,
      HasSubstr("train.loss: kl needs the target's final hidden state, and " + dir.Join("plain") +
                ": shards hold none: prepare the shards with "
                "`flashdraft prepare --teacher`"));
  auto ce_teacher = launch("ce-teacher", shards("teacher"));
  ASSERT_EQ(ce_teacher.exit_code, 0) << ce_teacher.output;
  auto ce_plain = launch("ce-plain", shards("plain"));
  ASSERT_EQ(ce_plain.exit_code, 0) << ce_plain.output;
  EXPECT_TRUE(drafter("ce-teacher") == drafter("ce-plain"));

  // The report draws the KL beside the cross-entropy.
  auto report = RunCommand(
      absl::StrCat(kCli, " report --job ", dir.Join("kl"), " --out ", dir.Join("kl.html")));
  ASSERT_EQ(report.exit_code, 0) << report.output;
  if (access("/usr/bin/chromium", X_OK) != 0) {
    GTEST_SKIP() << "rendering the report needs /usr/bin/chromium (scripts/setup.sh --tests)";
  }
  auto dom = RunCommand(absl::StrCat("cd ", dir.path(),
                                     " && chromium --headless --no-sandbox --disable-gpu "
                                     "--dump-dom file://",
                                     dir.Join("kl.html"), " 2>/dev/null"));
  EXPECT_THAT(dom.output, HasSubstr(">KL(target || drafter)</text>"));
  EXPECT_THAT(dom.output, HasSubstr(">loss (weighted, nats)</text>"));
}

}  // namespace
}  // namespace flashdraft

namespace flashdraft {
namespace {

// data.source 'target': the coordinator runs the tiny target online over chat data and two
// workers train on the hidden states it streams; no shards are written.
// Evaluations every 6 steps with checkpoint.keep_best and keep_last 1: the best.json record names
// the evaluation of the highest τ (the earliest of equals), its checkpoint survived the pruning
// beside the newest one, and drafter-best was exported from it.
void ExpectTheBestCheckpointKept(const std::string& run, size_t evaluations) {
  const std::vector<nlohmann::json> evals =
      ::flashdraft::testing::ReadEvents(run + "/steps.jsonl", "eval");
  ASSERT_EQ(evals.size(), evaluations);
  size_t best = 0;
  for (size_t i = 0; i < evals.size(); ++i) {
    const nlohmann::json& e = evals[i];
    EXPECT_EQ(e["completed_steps"], 6 * (i + 1));
    EXPECT_EQ(e["prompts"], 2);
    EXPECT_GE(e["tau"].get<double>(), 1.0);
    EXPECT_GE(e["tau_zlab"].get<double>(), 1.0);
    EXPECT_GE(e["tau_sglang"].get<double>(), 1.0);
    EXPECT_GT(e["num_drafts"].get<int64_t>(), 0);
    EXPECT_EQ(e["num_draft_tokens"].get<int64_t>(), 7 * e["num_drafts"].get<int64_t>());
    EXPECT_DOUBLE_EQ(e["tau_pooled"].get<double>(),
                     1.0 + e["num_accepted_tokens"].get<double>() / e["num_drafts"].get<double>());
    EXPECT_EQ(e["acceptance_per_position"].size(), 7u);
    if (e["tau"].get<double>() > evals[best]["tau"].get<double>()) best = i;
  }
  const nlohmann::json record =
      nlohmann::json::parse(*ReadFile(run + "/checkpoints/best.json"), nullptr, false);
  ASSERT_TRUE(record.is_object());
  EXPECT_EQ(record["completed_steps"], evals[best]["completed_steps"]);
  EXPECT_DOUBLE_EQ(record["tau"].get<double>(), evals[best]["tau"].get<double>());
  std::set<std::string> kept;
  for (const auto& entry : std::filesystem::directory_iterator(run + "/checkpoints")) {
    if (entry.is_directory()) kept.insert(entry.path().filename().string());
  }
  const std::string best_dir = record["checkpoint"].get<std::string>();
  EXPECT_EQ(kept, (std::set<std::string>{best_dir, "step-00000024"}))
      << "best " << best_dir << " (" << evals[best]["completed_steps"] << ")";
  auto exported = RunCommand(absl::StrCat(kCli, " export --checkpoint ", run, "/checkpoints/",
                                          best_dir, " --out ", run, "/best-again"));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_EQ(*ReadFile(run + "/drafter-best/model.safetensors"),
            *ReadFile(run + "/best-again/model.safetensors"));
}

TEST(OnlineTargetTest, TwoWorkersTrainOnHiddenStatesComputedOnline) {
  TempDir dir;
  auto made = RunCommand(absl::StrCat(kCli, " make-tiny-target --out ", dir.Join("tiny"),
                                      " --steps 40 --merges 128 --hidden 64 --layers 2"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  // Chats from a license text: continue a line with the next ones.
  absl::StatusOr<std::string> text = ReadFile("/usr/share/common-licenses/GPL-3");
  ASSERT_TRUE(text.ok()) << "needs /usr/share/common-licenses/GPL-3 (Debian base-files)";
  std::vector<std::string> lines;
  for (size_t at = 0, next; at < text->size(); at = next + 1) {
    next = text->find('\n', at);
    if (next == std::string::npos) next = text->size();
    if (next - at > 20) lines.push_back(text->substr(at, next - at));
  }
  std::ofstream chats(dir.Join("chats.jsonl"));
  for (size_t i = 0; i + 4 < lines.size() && i < 4 * 48; i += 4) {
    nlohmann::json j;
    j["messages"] = {{{"role", "user"}, {"content", "Continue: " + lines[i]}},
                     {{"role", "assistant"},
                      {"content", lines[i + 1] + "\n" + lines[i + 2] + "\n" + lines[i + 3]}}};
    chats << j.dump() << "\n";
  }
  chats.close();
  ASSERT_TRUE(
      WriteFileAtomically(dir.Join("job.yaml"),
                          absl::StrCat(R"(
output_dir: )",
                                       dir.Join("run"), R"(
target: {path: )",
                                       dir.Join("tiny"), R"(, layer_ids: [0, 1]}
drafter: {num_hidden_layers: 1, block_size: 8, num_target_features: 2, max_anchors: 16}
data: {source: target, jsonl: )",
                                       dir.Join("chats.jsonl"), R"(}
train: {max_steps: 24, global_batch_size: 8, learning_rate: 0.003, warmup_ratio: 0.1,
        min_lr_ratio: 0.1}
checkpoint: {keep_last: 1, keep_best: true}
eval: {every_steps: 6, prompts: )",
                                       dir.Join("chats.jsonl"), R"(, limit: 2, max_new_tokens: 16}
)"))
          .ok());
  auto run = RunCommand(absl::StrCat(kCli, " launch ", dir.Join("job.yaml"), " --workers 2"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("job finished: 24 steps"));
  std::vector<double> losses;
  std::vector<double> rates;
  for (const auto& step : ::flashdraft::testing::ReadSteps(dir.Join("run/steps.jsonl"))) {
    losses.push_back(step["loss"].get<double>());
    rates.push_back(step["learning_rate"].get<double>());
  }
  ASSERT_EQ(losses.size(), 24u);
  // 2 warmup steps (0.1 of 24), then half a cosine toward the floor 0.1 x 0.003.
  EXPECT_DOUBLE_EQ(rates[0], 0.0);
  EXPECT_DOUBLE_EQ(rates[1], 0.0015);
  EXPECT_DOUBLE_EQ(rates[2], 0.003);
  EXPECT_NEAR(rates[13], 0.0003 + 0.0027 * 0.5, 1e-15);
  EXPECT_NEAR(rates[23], 0.0003 + 0.0027 * 0.5 * (1 + std::cos(M_PI * 21 / 22)), 1e-15);
  ExpectTheBestCheckpointKept(dir.Join("run"), 4);
  EXPECT_THAT(run.output, HasSubstr("eval after step 24: tau "));
  const double first = (losses[0] + losses[1] + losses[2]) / 3;
  const double last = (losses[21] + losses[22] + losses[23]) / 3;
  EXPECT_LT(last, first - 0.3) << "first " << first << " last " << last;
  EXPECT_FALSE(std::filesystem::exists(dir.Join("run/shard-00000.safetensors")));

  // The exported drafter, run the way a server runs it: speculative decoding returns exactly the
  // target's greedy output and accepts more than the target's own token per cycle (τ > 1).
  const std::string eval = absl::StrCat(kCli, " eval --target ", dir.Join("tiny"), " --drafter ",
                                        dir.Join("run/drafter"), " --prompts ",
                                        dir.Join("chats.jsonl"), " --limit 6 --max-new-tokens 32");
  auto good = RunCommand(eval + " --json 2>/dev/null");
  ASSERT_EQ(good.exit_code, 0) << good.output;
  const nlohmann::json report = nlohmann::json::parse(good.output, nullptr, false);
  ASSERT_TRUE(report.is_object()) << good.output;
  EXPECT_EQ(report["lossless"], true);
  EXPECT_EQ(report["prompts"], 6);
  EXPECT_GT(report["tau"].get<double>(), 1.0) << good.output;
  EXPECT_EQ(report["accepted_length_histogram"].size(), 8u);
  EXPECT_EQ(report["acceptance_per_position"].size(), 7u);
  EXPECT_GT(report["acceptance_per_position"][0].get<double>(), 0);
  EXPECT_GT(report["speculative"]["tokens_per_second"].get<double>(), 0);
  // The prompts rendered with the job's chat options: the system turn added and, without thinking,
  // the empty think block the server writes, token for token as the template renders them.
  auto tokenizer = Tokenizer::FromFile(dir.Join("tiny/tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::ifstream prompts(dir.Join("chats.jsonl"));
  std::string first_line;
  ASSERT_TRUE(std::getline(prompts, first_line));
  auto prompt_tokens = [&](const ChatRenderOptions& options) -> size_t {
    auto chat = ParseChatLine(first_line, 1 << 30);
    EXPECT_TRUE(chat.ok() && chat->is_chat) << chat.status();
    if (!chat.ok()) return 0;
    ApplyChatOptions(options, chat->messages);
    auto turns = chat->messages.begin();
    while (turns != chat->messages.end() && turns->role != "assistant") ++turns;
    auto rendered = RenderChatPrompt({chat->messages.begin(), turns}, options);
    EXPECT_TRUE(rendered.ok()) << rendered.status();
    return rendered.ok() ? (*tokenizer)->Encode(rendered->text).size() : 0;
  };
  EXPECT_EQ(report["per_prompt"][0]["prompt_tokens"], prompt_tokens({}));
  EXPECT_EQ(report["enable_thinking"], true);
  const ChatRenderOptions brief{false, "Answer briefly."};
  auto with_options = RunCommand(
      eval + " --enable-thinking false --system-prompt 'Answer briefly.' --json 2>/dev/null");
  ASSERT_EQ(with_options.exit_code, 0) << with_options.output;
  const nlohmann::json options_report = nlohmann::json::parse(with_options.output, nullptr, false);
  ASSERT_TRUE(options_report.is_object()) << with_options.output;
  EXPECT_EQ(options_report["enable_thinking"], false);
  EXPECT_EQ(options_report["system_prompt"], "Answer briefly.");
  EXPECT_EQ(options_report["lossless"], true);
  EXPECT_EQ(options_report["per_prompt"][0]["prompt_tokens"], prompt_tokens(brief));
  EXPECT_GT(prompt_tokens(brief), prompt_tokens({}) + 4);
  auto table = RunCommand(eval + " --block-size 4");
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_THAT(table.output, HasSubstr("acceptance by block position:  1: "));
  EXPECT_THAT(table.output, HasSubstr("lossless: all 6 output(s) equal the target's own greedy"));
  // The job's report with the evaluation in it (its rendering is ReportTest's).
  ASSERT_TRUE(WriteFileAtomically(dir.Join("eval.json"), good.output).ok());
  auto page = RunCommand(absl::StrCat(kCli, " report --job ", dir.Join("run"), " --eval ",
                                      dir.Join("eval.json"), " --out ", dir.Join("report.html")));
  ASSERT_EQ(page.exit_code, 0) << page.output;
  const std::string html = *ReadFile(dir.Join("report.html"));
  EXPECT_THAT(html, HasSubstr("Evaluation (flashdraft eval)"));
  EXPECT_THAT(html, HasSubstr("every output equals the target's greedy decoding"));
  EXPECT_THAT(html, HasSubstr("\"accepted_length_histogram\""));
  // A server that accepted drafts without verifying them: the check catches it.
  auto broken = RunCommand("FLASHDRAFT_EVAL_FAULT=accept-drafts " + eval);
  EXPECT_EQ(broken.exit_code, 1) << broken.output;
  EXPECT_THAT(
      broken.output,
      ::testing::ContainsRegex("lossless check FAILED on [1-6] of 6 prompt\\(s\\): prompt [1-6] "
                               "differs at new token [0-9]+: the target's greedy decoding gives"));
  // A folder that is not a drafter is refused by name.
  auto other = RunCommand(absl::StrCat(kCli, " eval --target ", dir.Join("tiny"), " --drafter ",
                                       dir.Join("run"), " --prompts ", dir.Join("chats.jsonl")));
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_THAT(other.output, HasSubstr("run/config.json"));
  // target.device: cuda where the coordinator's LibTorch has no CUDA: refused before any work.
  auto gpu =
      RunCommand(absl::StrCat(kCli, " launch ", dir.Join("job.yaml"),
                              " --workers 1 --set target.device=cuda --out ", dir.Join("gpu-run")));
  EXPECT_EQ(gpu.exit_code, 1) << gpu.output;
  EXPECT_THAT(gpu.output, HasSubstr("target.device is cuda, but this process's LibTorch has no "
                                    "CUDA device"));
}

// data.regenerate: the target's replies are kept in the job's output folder; a job that starts
// with them there reads them instead of regenerating (the same bits), and a changed data file
// starts them over. data.enable_thinking and data.system_prompt apply alike whether the
// coordinator or a feeder regenerates (the options travel with each line), and replies kept under
// other options are not read.
TEST(OnlineTargetTest, RegeneratedRepliesAreKeptForTheNextStart) {
  TempDir dir;
  // Trained long enough that its answers are not all an immediate <|im_end|>: the drafters train
  // on loss tokens, so that comparing them means something.
  auto made =
      RunCommand(absl::StrCat(kCli, " make-tiny-target --out ", dir.Join("tiny"),
                              " --steps 150 --merges 128 --hidden 64 --layers 2 && head -n 12 ",
                              dir.Join("tiny/chats.jsonl"), " >", dir.Join("chats.jsonl")));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ASSERT_NO_FATAL_FAILURE(
      WriteTinyJob(dir,
                   absl::StrCat("{source: target, jsonl: ", dir.Join("chats.jsonl"),
                                ", regenerate: true, max_new_tokens: 12}"),
                   "{max_steps: 3, global_batch_size: 4}"));
  auto launch = [&](const std::string& out, const std::string& flags = "") {
    return RunCommand(absl::StrCat(kCli, " launch ", dir.Join("job.yaml"), " --workers 1 --out ",
                                   dir.Join(out), " ", flags, " 2>&1"));
  };
  // A launch into `out` that finds there the replies `from` kept.
  auto launch_with_kept = [&](const std::string& from, const std::string& out,
                              const std::string& flags = "") {
    std::filesystem::create_directories(dir.Join(out));
    std::filesystem::copy_file(dir.Join(from + "/regenerated-replies.bin"),
                               dir.Join(out + "/regenerated-replies.bin"));
    return launch(out, flags);
  };
  auto drafter = [&](const std::string& out) {
    return *ReadFile(dir.Join(out + "/drafter/model.safetensors"));
  };
  auto first = launch("a");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  for (const auto& step : ::flashdraft::testing::ReadSteps(dir.Join("a/steps.jsonl"))) {
    if (step.contains("loss")) {
      EXPECT_GT(step["tokens"].get<int64_t>(), 0) << step.dump();
    }
  }
  EXPECT_THAT(first.output, ::testing::Not(HasSubstr("not regenerated again")));
  ASSERT_TRUE(std::filesystem::exists(dir.Join("a/regenerated-replies.bin"))) << first.output;
  auto second = launch_with_kept("a", "b");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_THAT(second.output, HasSubstr("12 line(s) read from"));
  EXPECT_TRUE(drafter("a") == drafter("b"));
  // A feeder regenerates them instead: the same drafter, and replies kept as the coordinator
  // keeps them (a job without feeders reads them).
  auto fed = launch("d", "--feeders 1");
  ASSERT_EQ(fed.exit_code, 0) << fed.output;
  EXPECT_THAT(fed.output, HasSubstr("the feeders regenerate the replies of 12 line(s)"));
  EXPECT_TRUE(drafter("a") == drafter("d"));
  auto read_back = launch_with_kept("d", "e");
  ASSERT_EQ(read_back.exit_code, 0) << read_back.output;
  EXPECT_THAT(read_back.output, HasSubstr("12 line(s) read from"));
  EXPECT_TRUE(drafter("a") == drafter("e"));
  // The chat options, here and on a feeder: the same drafter, another than the defaults give.
  const std::string options =
      "--set data.enable_thinking=false --set 'data.system_prompt=Answer briefly.'";
  auto here = launch("here", options);
  ASSERT_EQ(here.exit_code, 0) << here.output;
  auto fed_options = launch("fed", options + " --feeders 1");
  ASSERT_EQ(fed_options.exit_code, 0) << fed_options.output;
  EXPECT_THAT(fed_options.output, HasSubstr("the feeders regenerate the replies of 12 line(s)"));
  EXPECT_TRUE(drafter("here") == drafter("fed"));
  EXPECT_FALSE(drafter("a") == drafter("here"));
  // Their kept replies name the options, and a job with the defaults regenerates its own.
  EXPECT_THAT(*ReadFile(dir.Join("here/regenerated-replies.bin")),
              HasSubstr("; thinking off; system prompt "));
  auto defaults = launch_with_kept("here", "f");
  ASSERT_EQ(defaults.exit_code, 0) << defaults.output;
  EXPECT_THAT(defaults.output, HasSubstr("made for another target, data file or settings"));
  EXPECT_TRUE(drafter("a") == drafter("f"));
  // Another data file: the kept replies are not used.
  const std::string chats = *ReadFile(dir.Join("chats.jsonl"));
  ASSERT_TRUE(
      WriteFileAtomically(dir.Join("chats.jsonl"), chats + chats.substr(0, chats.find('\n') + 1))
          .ok());
  auto changed = launch_with_kept("a", "c");
  EXPECT_THAT(changed.output, HasSubstr("made for another target, data file or settings"));
  EXPECT_THAT(changed.output, ::testing::Not(HasSubstr("not regenerated again")));
}

}  // namespace
}  // namespace flashdraft
