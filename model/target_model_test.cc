// Target decoders against the independent Python reference (tests/reference/target_reference.py),
// through `flashdraft debug target-features` on files, plus KV-cache decoding.
#include "model/target_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "model/generate.h"
#include "model/test_targets.h"
#include "model/wire_tensor.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::TempDir;
using ::testing::HasSubstr;

const std::string kReference = FLASHDRAFT_SOURCE_DIR "/tests/reference/target_reference.py";
const std::string kCli = FLASHDRAFT_CLI;

void MakeTarget(const std::string& dir, const std::string& flags) {
  auto r = RunCommand(
      absl::StrCat(::flashdraft::testing::kReferencePython, " ", kReference, " ", dir, " ", flags));
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

torch::Tensor Read(const std::string& path, const std::string& name) {
  auto file = SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  return ToTorch(*(*file)->Get(name)).to(torch::kFloat64);
}

double RelativeError(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).norm().item<double>() / std::max(want.norm().item<double>(), 1e-12);
}

TEST(TargetModelTest, MatchesReferenceForQwen3AndLlama) {
  FD_SKIP_WITHOUT_REFERENCE_PYTHON();
  struct Case {
    const char* label;
    std::string flags, layers;
  };
  const Case cases[] = {
      {"qwen3", "--arch qwen3 --ids-layers 0,2,3", "0,2,3"},
      {"qwen3 tied sharded", "--arch qwen3 --tied --sharded --ids-layers 3,1", "3,1"},
      {"llama", "--arch llama --layers 3 --ids-layers 1", "1"},
      {"llama3 rope scaling", "--arch llama --rope-scaling --ids-layers 0,1,2,3", "0,1,2,3"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    TempDir dir;
    MakeTarget(dir.path(), c.flags);
    auto r = RunCommand(absl::StrCat(kCli, " debug target-features --target ", dir.Join("model"),
                                     " --ids ", dir.Join("ids.safetensors"), " --layers ", c.layers,
                                     " --out ", dir.Join("out.safetensors")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const char* name : {"hidden_states", "logits"}) {
      const double err = RelativeError(Read(dir.Join("out.safetensors"), name),
                                       Read(dir.Join("ref.safetensors"), name));
      EXPECT_LE(err, 1e-5) << name << " relative error " << err;
    }
  }
}

TEST(TargetModelTest, IncrementalDecodingWithKvCacheMatchesFullForward) {
  FD_SKIP_WITHOUT_REFERENCE_PYTHON();
  TempDir dir;
  MakeTarget(dir.path(), "--arch qwen3");
  auto model = TargetModel::Load(dir.Join("model"));
  ASSERT_TRUE(model.ok()) << model.status();
  const torch::Tensor ids = Read(dir.Join("ids.safetensors"), "input_ids").to(torch::kInt64);
  auto full = (*model)->Forward(ids, {1}, true);
  ASSERT_TRUE(full.ok());
  KvCache cache;
  auto prefix = (*model)->Forward(ids.narrow(1, 0, 10), {1}, true, &cache);
  ASSERT_TRUE(prefix.ok());
  std::vector<torch::Tensor> logits = {prefix->logits}, feats = {prefix->features};
  for (int64_t t = 10; t < ids.size(1); ++t) {
    auto step = (*model)->Forward(ids.narrow(1, t, 1), {1}, true, &cache);
    ASSERT_TRUE(step.ok());
    logits.push_back(step->logits);
    feats.push_back(step->features);
  }
  EXPECT_EQ(cache.length(), ids.size(1));
  EXPECT_LE(
      RelativeError(torch::cat(logits, 1).to(torch::kFloat64), full->logits.to(torch::kFloat64)),
      1e-5);
  EXPECT_LE(
      RelativeError(torch::cat(feats, 1).to(torch::kFloat64), full->features.to(torch::kFloat64)),
      1e-5);
}

TEST(TargetModelTest, GreedyGenerateEqualsArgmaxOfFullForwards) {
  FD_SKIP_WITHOUT_REFERENCE_PYTHON();
  TempDir dir;
  MakeTarget(dir.path(), "--arch qwen3");
  auto model = TargetModel::Load(dir.Join("model"));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int64_t> prompt = {5, 17, 3, 99, 42};
  auto generated = GreedyGenerate(**model, prompt, 12, {});
  ASSERT_TRUE(generated.ok()) << generated.status();
  ASSERT_EQ(generated->size(), 12u);
  // Without a cache: the whole sequence again for each new token.
  std::vector<int64_t> seq = prompt;
  for (size_t i = 0; i < 12; ++i) {
    auto out = (*model)->Forward(torch::tensor(seq, torch::kInt64).unsqueeze(0), {}, true);
    ASSERT_TRUE(out.ok());
    seq.push_back(out->logits.index({0, -1}).argmax().item<int64_t>());
    EXPECT_EQ((*generated)[i], seq.back()) << "token " << i;
  }
  // A stop id ends generation and is included.
  auto stopped = GreedyGenerate(**model, prompt, 12, {seq[prompt.size() + 2]});
  ASSERT_TRUE(stopped.ok());
  EXPECT_LE(stopped->size(), 3u);
  EXPECT_EQ(stopped->back(), seq[prompt.size() + 2]);
}

TEST(TargetModelTest, TiledForwardEqualsDenseWithAndWithoutCache) {
  const TargetModelConfig config = ::flashdraft::testing::SmallQwen3();
  auto model = ::flashdraft::testing::RandomTarget(config, 1);
  torch::manual_seed(2);
  const torch::Tensor ids = torch::randint(0, config.vocab_size, {2, 300}, torch::kInt64);
  TargetForwardOptions dense;
  dense.dense_attention = true;
  model->SetForwardOptions(dense);
  auto want = model->Forward(ids, {0, 2}, true);
  ASSERT_TRUE(want.ok());
  // Small tiles: several query tiles, 64-key tiles, feed-forward chunks of 7 positions.
  TargetForwardOptions tiled;
  tiled.attention.query_tile = 48;
  tiled.attention.tile_score_bytes = 1;
  tiled.mlp_chunk_bytes = 7 * config.intermediate_size * 4 * 3;
  model->SetForwardOptions(tiled);
  auto got = model->Forward(ids, {0, 2}, true);
  ASSERT_TRUE(got.ok());
  EXPECT_LE(RelativeError(got->features, want->features), 1e-5);
  EXPECT_LE(RelativeError(got->logits, want->logits), 1e-5);
  // Without logits the layers past the deepest requested one are skipped: the same features.
  ASSERT_GT(config.num_hidden_layers, 1);
  auto all_layers = model->Forward(ids, {0}, true);
  auto first_layer_only = model->Forward(ids, {0}, false);
  ASSERT_TRUE(all_layers.ok() && first_layer_only.ok());
  EXPECT_TRUE(torch::equal(first_layer_only->features, all_layers->features));
  // Prefill then a block of 16 and single tokens on the cache, as verification and decoding do.
  KvCache cache;
  std::vector<torch::Tensor> feats;
  for (auto [t0, n] : {std::pair<int64_t, int64_t>{0, 250}, {250, 16}, {266, 1}, {267, 33}}) {
    auto part = model->Forward(ids.narrow(1, t0, n), {0, 2}, false, &cache);
    ASSERT_TRUE(part.ok());
    feats.push_back(part->features);
  }
  EXPECT_LE(RelativeError(torch::cat(feats, 1), want->features), 1e-5);
}

TEST(TargetModelTest, LongSequencesTakeMemoryLinearInLength) {
  FD_SKIP_WITHOUT_REFERENCE_PYTHON();
  TempDir dir;
  MakeTarget(dir.path(), "--arch qwen3");
  // 8,192 tokens: the dense form's scores alone are 4 heads x 8192^2 x 4 bytes = 1 GiB per layer.
  const int64_t s = 8192;
  const torch::Tensor ids = torch::arange(s, torch::kInt64).remainder(97).view({1, s});
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("input_ids", DType::kI64, {1, s}, ids.data_ptr(), ids.nbytes()).ok());
  ASSERT_TRUE(writer.Write(dir.Join("long.safetensors")).ok());
  auto r = RunCommand(absl::StrCat(kCli, " debug target-features --target ", dir.Join("model"),
                                   " --ids ", dir.Join("long.safetensors"), " --layers 1,3 --out ",
                                   dir.Join("out.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(r.peak_rss_bytes, int64_t{600} << 20)
      << "peak RSS " << (r.peak_rss_bytes >> 20) << " MiB at " << s << " tokens";
  EXPECT_EQ(Read(dir.Join("out.safetensors"), "hidden_states").sizes(),
            (std::vector<int64_t>{1, s, 2 * 32}));
}

TEST(TargetModelTest, BadFoldersGetClearErrors) {
  FD_SKIP_WITHOUT_REFERENCE_PYTHON();
  TempDir dir;
  MakeTarget(dir.path(), "--arch llama --layers 2 --ids-layers 1");
  const std::string config = dir.Join("model/config.json");
  auto text = ReadFile(config);
  ASSERT_TRUE(text.ok());

  std::string mistral = *text;
  mistral.replace(mistral.find("\"llama\""), 7, "\"mistral\"");
  ASSERT_TRUE(WriteFileAtomically(config, mistral).ok());
  EXPECT_THAT(
      std::string(TargetModel::Load(dir.Join("model")).status().message()),
      HasSubstr("unsupported architecture: model_type 'mistral' (supported: qwen3, llama)"));

  std::string deeper = *text;
  deeper.replace(deeper.find("\"num_hidden_layers\": 2"), 22, "\"num_hidden_layers\": 3");
  ASSERT_TRUE(WriteFileAtomically(config, deeper).ok());
  EXPECT_THAT(std::string(TargetModel::Load(dir.Join("model")).status().message()),
              HasSubstr("no tensor named 'model.layers.2.input_layernorm.weight'"));

  std::string wider = *text;
  wider.replace(wider.find("\"intermediate_size\": 64"), 23, "\"intermediate_size\": 65");
  ASSERT_TRUE(WriteFileAtomically(config, wider).ok());
  EXPECT_THAT(
      std::string(TargetModel::Load(dir.Join("model")).status().message()),
      HasSubstr("tensor 'model.layers.0.mlp.gate_proj.weight': shape [64, 32], expected [65, 32]"));

  ASSERT_TRUE(WriteFileAtomically(config, *text).ok());
  auto model = TargetModel::Load(dir.Join("model"));
  ASSERT_TRUE(model.ok());
  auto out = (*model)->Forward(torch::zeros({1, 4}, torch::kInt64), {2}, false);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("layer id 2 is outside [0, 2)"));
  auto bad_ids = (*model)->Forward(torch::full({1, 4}, 101, torch::kInt64), {1}, false);
  EXPECT_THAT(std::string(bad_ids.status().message()), HasSubstr("input_ids must be in [0, 101)"));
}

}  // namespace
}  // namespace flashdraft
