// Parity of the C++ drafter with the independent Python reference (tests/reference/
// dflash_reference.py, dense mask, float64), driven through `flashdraft debug drafter-step` on
// files.
#include "model/drafter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "model/drafter_export.h"
#include "model/export.h"
#include "model/wire_tensor.h"
#include "tests/support/test_util.h"
#include "tests/support/tiny_drafter.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::RunReferencePython;
using ::flashdraft::testing::ShellQuote;
using ::flashdraft::testing::TempDir;
using ::testing::HasSubstr;

const std::string kReference = FLASHDRAFT_SOURCE_DIR "/tests/reference/dflash_reference.py";
const std::string kCli = FLASHDRAFT_CLI;

absl::Status MakeCase(const std::string& dir, const std::string& flags) {
  auto r = RunCommand(absl::StrCat(::flashdraft::testing::kReferencePython, " ", kReference, " ",
                                   ShellQuote(dir), " ", flags));
  if (r.exit_code != 0) return absl::InternalError(r.output);
  return absl::OkStatus();
}

::flashdraft::testing::CommandResult Step(const std::string& dir, const std::string& extra = "",
                                          const std::string& weights = "w.safetensors",
                                          const std::string& batch = "b.safetensors") {
  return RunCommand(absl::StrCat(kCli, " debug drafter-step --config ", dir, "/drafter.json",
                                 " --weights ", dir, "/", weights, " --batch ", dir, "/", batch,
                                 " --out ", dir, "/out.safetensors ", extra));
}

std::map<std::string, torch::Tensor> ReadAll(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  std::map<std::string, torch::Tensor> out;
  if (!file.ok()) return out;
  for (const std::string& name : (*file)->names()) {
    out[name] = ToTorch(*(*file)->Get(name)).to(torch::kFloat64);
  }
  return out;
}

struct ParityCase {
  const char* label;
  std::string flags;
  std::string step_flags;
};

TEST(DrafterParityTest, MatchesPythonReferenceOverConfigTable) {
  FD_SKIP_WITHOUT_REFERENCE_PYTHON();
  const ParityCase cases[] = {
      {"B4 GQA2 untied", "--block-size 4 --layers 1 --heads 4 --kv-heads 2 --gamma 3", "--gamma 3"},
      {"B8 GQA4 tied 2 layers", "--block-size 8 --layers 2 --heads 4 --kv-heads 1 --tied", ""},
      {"B16 MHA untied", "--block-size 16 --layers 1 --heads 2 --kv-heads 2 --seq 48 --anchors 4",
       ""},
      {"B8 3 layers batch 3 padded, empty slots",
       "--block-size 8 --layers 3 --heads 4 --kv-heads 4 --tied --batch 3 --seq 36 --anchors 7 "
       "--seed 5",
       ""},
      // Sliding-window layers (a window shorter than the context, and one of exactly a block).
      {"B4 sliding,full,sliding W6 GQA2",
       "--block-size 4 --layers 3 --heads 4 --kv-heads 2 --layer-types s,f,s --sliding-window 6 "
       "--gamma 3",
       "--gamma 3"},
      // Distillation: KL alone, and a mix with cross-entropy.
      {"B4 KL", "--block-size 4 --layers 1 --heads 4 --kv-heads 2 --gamma 3 --ce-weight 0",
       "--gamma 3 --ce-weight 0"},
      {"B8 0.3 CE + 0.7 KL, 2 layers padded",
       "--block-size 8 --layers 2 --heads 4 --kv-heads 1 --batch 3 --seq 36 --anchors 5 "
       "--ce-weight 0.3 --seed 3",
       "--ce-weight 0.3"},
      {"B8 sliding W8 (one block) padded",
       "--block-size 8 --layers 1 --heads 2 --kv-heads 1 "
       "--layer-types s --sliding-window 8 --batch 3 --seq 36 --anchors 5 --seed 2",
       ""},
  };
  for (const ParityCase& c : cases) {
    SCOPED_TRACE(c.label);
    TempDir dir;
    ASSERT_TRUE(MakeCase(dir.path(), c.flags).ok());
    auto r = Step(dir.path(), c.step_flags);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto out = ReadAll(dir.Join("out.safetensors"));
    auto ref = ReadAll(dir.Join("ref.safetensors"));
    ASSERT_EQ(out.size(), ref.size());
    for (const auto& [name, expected] : ref) {
      SCOPED_TRACE(name);
      ASSERT_TRUE(out.count(name));
      const torch::Tensor& got = out[name];
      ASSERT_EQ(got.sizes(), expected.sizes());
      const double scale = std::max(expected.norm().item<double>(), 1e-6);
      const double rel = (got - expected).norm().item<double>() / scale;
      EXPECT_LE(rel, 1e-5) << "relative error " << rel;
    }
    EXPECT_GT(ref["loss"].item<double>(), 0.0);
  }
}

// The export written without LibTorch from F32 weights (what the coordinator does with a
// checkpoint) holds the same BF16 bits as LibTorch's own conversion of the live parameters,
// including ties, subnormals, infinities and NaN.
TEST(DrafterExportTest, CheckpointExportHasLibTorchsBf16Bits) {
  TempDir dir;
  const DrafterModelConfig config = ::flashdraft::testing::TinyDrafterConfig(16);
  torch::manual_seed(3);
  auto drafter = std::make_shared<DrafterImpl>(config);
  {
    torch::NoGradGuard no_grad;
    auto first = drafter->parameters()[0].view(-1);
    const std::vector<float> special = {1.00390625f, 1.01171875f, -1.00390625f, 1e-40f, -1e-45f,
                                        3.4e38f,     INFINITY,    -INFINITY,    NAN};
    for (size_t i = 0; i < special.size(); ++i) first[static_cast<int64_t>(i)] = special[i];
  }
  ASSERT_TRUE(ExportDrafter(*drafter, dir.Join("torch")).ok());
  ASSERT_TRUE(WriteDrafterWeightsF32(*drafter, dir.Join("f32.safetensors")).ok());
  ASSERT_TRUE(ExportDrafterWeights(dir.Join("f32.safetensors"), config, dir.Join("plain")).ok());
  auto a = SafetensorsFile::Open(dir.Join("torch/model.safetensors"));
  auto b = SafetensorsFile::Open(dir.Join("plain/model.safetensors"));
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<std::string> names_a = (*a)->names(), names_b = (*b)->names();
  std::sort(names_a.begin(), names_a.end());
  std::sort(names_b.begin(), names_b.end());
  ASSERT_EQ(names_a, names_b);
  for (const std::string& name : names_a) {
    TensorView x = *(*a)->Get(name), y = *(*b)->Get(name);
    EXPECT_EQ(x.dtype, DType::kBF16);
    EXPECT_EQ(x.shape, y.shape) << name;
    ASSERT_EQ(x.nbytes, y.nbytes) << name;
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0) << name;
  }
  EXPECT_EQ(*ReadFile(dir.Join("torch/config.json")), *ReadFile(dir.Join("plain/config.json")));
}

// A refused step: exit code 1 and `want` in its output.
void ExpectRefused(const ::flashdraft::testing::CommandResult& r, const std::string& want) {
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr(want));
}

TEST(DrafterDebugStepTest, BadFilesGetClearErrors) {
  FD_SKIP_WITHOUT_REFERENCE_PYTHON();
  TempDir dir;
  ASSERT_TRUE(MakeCase(dir.path(), "--block-size 8 --layers 1").ok());
  auto weights = ReadAll(dir.Join("w.safetensors"));
  auto batch_file = SafetensorsFile::Open(dir.Join("b.safetensors"));
  ASSERT_TRUE(batch_file.ok());

  // Rewrites a file with one tensor removed or replaced.
  auto rewrite = [&](const std::string& path, const std::map<std::string, torch::Tensor>& tensors) {
    SafetensorsWriter writer;
    for (const auto& [name, t] : tensors) {
      ASSERT_TRUE(writer
                      .Add(name, *FromTorchDType(t.scalar_type()), t.sizes().vec(), t.data_ptr(),
                           t.nbytes())
                      .ok());
    }
    ASSERT_TRUE(writer.Write(path).ok());
  };
  std::map<std::string, torch::Tensor> w32;
  for (auto& [k, v] : weights) w32[k] = v.to(torch::kFloat32).contiguous();

  auto missing = w32;
  missing.erase("layers.0.self_attn.k_norm.weight");
  rewrite(dir.Join("w_missing.safetensors"), missing);
  ExpectRefused(Step(dir.path(), "", "w_missing.safetensors"),
                "no tensor named 'layers.0.self_attn.k_norm.weight'");

  auto wrong_shape = w32;
  wrong_shape["fc.weight"] = torch::zeros({3, 3});
  rewrite(dir.Join("w_shape.safetensors"), wrong_shape);
  ExpectRefused(Step(dir.path(), "", "w_shape.safetensors"),
                "tensor 'fc.weight': shape [3, 3], expected [32, 96]");

  std::map<std::string, torch::Tensor> batch;
  for (const std::string& name : (*batch_file)->names())
    batch[name] = ToTorch(*(*batch_file)->Get(name));
  auto bad_anchor_dtype = batch;
  bad_anchor_dtype["anchors"] = batch["anchors"].to(torch::kInt32).contiguous();
  rewrite(dir.Join("b_dtype.safetensors"), bad_anchor_dtype);
  ExpectRefused(Step(dir.path(), "", "w.safetensors", "b_dtype.safetensors"),
                "tensor 'anchors': dtype is I32, expected I64");

  auto bad_features = batch;
  bad_features["hidden_states"] = torch::zeros({2, 40, 95});
  rewrite(dir.Join("b_feat.safetensors"), bad_features);
  ExpectRefused(Step(dir.path(), "", "w.safetensors", "b_feat.safetensors"),
                "tensor 'hidden_states': shape [2, 40, 95], expected [2, 40, 96]");

  auto bad_anchor = batch;
  bad_anchor["anchors"] = batch["anchors"].clone();
  bad_anchor["anchors"].index_put_({0, 0}, 39);
  rewrite(dir.Join("b_anchor.safetensors"), bad_anchor);
  ExpectRefused(Step(dir.path(), "", "w.safetensors", "b_anchor.safetensors"),
                "anchors[0][0] = 39 is outside [0, S-2] = [0, 38]");

  auto no_mask = batch;
  no_mask.erase("loss_mask");
  rewrite(dir.Join("b_nomask.safetensors"), no_mask);
  ExpectRefused(Step(dir.path(), "", "w.safetensors", "b_nomask.safetensors"),
                "no tensor named 'loss_mask'");

  // Distillation needs the target's hidden states, of the target's width.
  ExpectRefused(Step(dir.path(), "--ce-weight 0.5"),
                "--ce-weight 0.5 (distillation) needs tensor 'teacher_hidden'");
  ExpectRefused(Step(dir.path(), "--ce-weight 1.5"), "--ce-weight must be in [0, 1], got 1.5");
  auto bad_teacher = batch;
  bad_teacher["teacher_hidden"] = torch::zeros({2, 40, 31});
  rewrite(dir.Join("b_teacher.safetensors"), bad_teacher);
  ExpectRefused(Step(dir.path(), "--ce-weight 0", "w.safetensors", "b_teacher.safetensors"),
                "tensor 'teacher_hidden': F32 [2, 40, 31], expected F32, BF16 "
                "or F16 [2, 40, 32]");

  // Block size 12 has no default decay.
  RunCommand(
      absl::StrCat("sed -i 's/\"block_size\": 8/\"block_size\": 12/' ", dir.Join("drafter.json")));
  ExpectRefused(Step(dir.path()), "--gamma is required for block_size 12");
}

}  // namespace
}  // namespace flashdraft

namespace flashdraft {
namespace {

// A drafter initialised from `seed`, then with larger random weights than the init (so that
// argmaxes are decided by the computation) and random frozen tensors, from torch's generator.
Drafter RandomDrafter(const DrafterModelConfig& config, uint64_t seed) {
  Drafter drafter(config);
  drafter->InitWeights(seed);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : drafter->parameters()) {
      if (p.dim() > 1) p.normal_(0, 0.3);
    }
  }
  drafter->SetFrozen(torch::randn({config.vocab_size, config.hidden_size}),
                     torch::randn({config.vocab_size, config.hidden_size}));
  return drafter;
}

// Inference drafts what training computes: a block at T over the context 0..T-1 gives the same
// logits' argmax whether the context was built at once or grew piece by piece (the KV cache a
// server keeps), and the same as the training forward for an anchor at T (GQA: 2 heads, 1 KV head).
// With a sliding layer (window 6 over a context of 11) the same holds.
void ExpectDraftingEqualsTheTrainingForward(const DrafterModelConfig& config) {
  torch::manual_seed(3);
  Drafter drafter = RandomDrafter(config, 7);
  const int64_t s = 11, block = config.block_size;
  const torch::Tensor features = torch::randn({1, s, config.feature_size()});
  const int64_t first = 5;

  DrafterContext whole, pieces;
  drafter->ExtendContext(whole, features);
  drafter->ExtendContext(pieces, features.narrow(1, 0, 4));
  drafter->ExtendContext(pieces, features.narrow(1, 4, 1));
  drafter->ExtendContext(pieces, features.narrow(1, 5, s - 5));
  EXPECT_EQ(pieces.length, s);
  const std::vector<int64_t> drafted = drafter->Draft(whole, first, block);
  EXPECT_EQ(drafter->Draft(pieces, first, block), drafted);

  torch::NoGradGuard no_grad;
  std::vector<int64_t> ids(block, config.mask_token_id);
  ids[0] = first;
  const torch::Tensor block_ids = torch::tensor(ids, torch::kInt64).view({1, 1, block});
  // The training forward: anchor T = s over features of 0..s (position s's own feature is never
  // attended: the context bound is strict).
  const torch::Tensor padded =
      torch::cat({features, torch::randn({1, 1, config.feature_size()})}, 1);
  const torch::Tensor hidden = drafter->Forward(
      padded, block_ids, torch::full({1, 1}, s, torch::kInt64), torch::ones({1, 1}, torch::kBool));
  const torch::Tensor want =
      torch::matmul(hidden.view({block, config.hidden_size}).narrow(0, 1, block - 1),
                    drafter->lm_head().t())
          .argmax(-1);
  EXPECT_EQ(drafted,
            std::vector<int64_t>(want.data_ptr<int64_t>(), want.data_ptr<int64_t>() + block - 1));
  // Not a constant: another context drafts something else.
  DrafterContext other;
  drafter->ExtendContext(other, torch::randn({1, s, config.feature_size()}));
  EXPECT_NE(drafter->Draft(other, first, block), drafted);
  EXPECT_EQ(drafter->Draft(whole, first, 2).size(), 1u);  // a shorter block: its slots only
}

TEST(DrafterInferenceTest, DraftingFromAGrowingContextEqualsTheTrainingForward) {
  DrafterModelConfig config = ::flashdraft::testing::TinyDrafterConfig(32);
  config.num_hidden_layers = 2;
  ExpectDraftingEqualsTheTrainingForward(config);
  SCOPED_TRACE("a sliding layer");
  config.layer_types = {"sliding_attention", "full_attention"};
  config.sliding_window = 6;
  ExpectDraftingEqualsTheTrainingForward(config);

  // Only sliding layers: context positions before every slot's window (0..5 of 11 for a window
  // of 6) change nothing drafted; a position inside it does.
  config.layer_types = {"sliding_attention", "sliding_attention"};
  torch::manual_seed(5);
  Drafter drafter(config);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : drafter->parameters()) {
      if (p.dim() > 1) p.normal_(0, 0.3);
    }
  }
  drafter->SetFrozen(torch::randn({config.vocab_size, config.hidden_size}),
                     torch::randn({config.vocab_size, config.hidden_size}));
  const torch::Tensor features = torch::randn({1, 11, config.feature_size()});
  DrafterContext base, early, late;
  drafter->ExtendContext(base, features);
  torch::Tensor changed = features.clone();
  changed.narrow(1, 0, 6).normal_(0, 3);
  drafter->ExtendContext(early, changed);
  changed = features.clone();
  changed.narrow(1, 10, 1).normal_(0, 30);
  drafter->ExtendContext(late, changed);
  const std::vector<int64_t> drafted = drafter->Draft(base, 5, config.block_size);
  EXPECT_EQ(drafter->Draft(early, 5, config.block_size), drafted);
  EXPECT_NE(drafter->Draft(late, 5, config.block_size), drafted);
  // Causal inside the block: a shorter block drafts the same first tokens.
  const std::vector<int64_t> shorter = drafter->Draft(base, 5, 3);
  EXPECT_EQ(shorter, std::vector<int64_t>(drafted.begin(), drafted.begin() + 2));

  // The training forward likewise: the block anchored at 11 is the same to the bit whatever the
  // features before its window, and not when one inside it changes.
  torch::NoGradGuard no_grad;
  const torch::Tensor padded = torch::cat({features, torch::randn({1, 1, features.size(2)})}, 1);
  std::vector<int64_t> ids(config.block_size, config.mask_token_id);
  ids[0] = 5;
  auto forward = [&](const torch::Tensor& f) {
    return drafter->Forward(f, torch::tensor(ids, torch::kInt64).view({1, 1, -1}),
                            torch::full({1, 1}, 11, torch::kInt64),
                            torch::ones({1, 1}, torch::kBool));
  };
  const torch::Tensor hidden = forward(padded);
  torch::Tensor moved = padded.clone();
  moved.narrow(1, 0, 6).normal_(0, 3);
  EXPECT_TRUE(torch::equal(forward(moved), hidden));
  moved = padded.clone();
  moved.narrow(1, 6, 1).normal_(0, 3);
  EXPECT_FALSE(torch::equal(forward(moved), hidden));
}

}  // namespace
}  // namespace flashdraft

namespace flashdraft {
namespace {

// Sample i of `lengths` as it is alone in a right-padded batch, and the same samples packed into
// one row; anchors per sample (sorted, -1 padded when unpacked).
struct PackedAndUnpacked {
  DrafterBatch unpacked, packed;
};

PackedAndUnpacked MakePackedBatches(const DrafterModelConfig& c,
                                    const std::vector<int64_t>& lengths,
                                    const std::vector<std::vector<int64_t>>& anchors) {
  const int64_t b = static_cast<int64_t>(lengths.size());
  const int64_t s = *std::max_element(lengths.begin(), lengths.end());
  int64_t total = 0, n = 0, packed_n = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    total += lengths[i];
    n = std::max<int64_t>(n, static_cast<int64_t>(anchors[i].size()));
    packed_n += static_cast<int64_t>(anchors[i].size());
  }
  PackedAndUnpacked out;
  DrafterBatch& u = out.unpacked;
  u.input_ids = torch::zeros({b, s}, torch::kInt64);
  u.loss_mask = torch::zeros({b, s}, torch::kInt64);
  u.hidden_states = torch::zeros({b, s, c.feature_size()});
  u.teacher_hidden = torch::zeros({b, s, c.hidden_size});
  u.anchors = torch::full({b, n}, -1, torch::kInt64);
  DrafterBatch& p = out.packed;
  std::vector<torch::Tensor> ids, mask, features, teacher, positions;
  std::vector<int64_t> packed_anchors;
  int64_t offset = 0;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t len = lengths[i];
    ids.push_back(torch::randint(c.vocab_size - 1, {len}, torch::kInt64));
    mask.push_back(torch::randint(2, {len}, torch::kInt64).index_fill_(0, torch::tensor({0}), 0));
    features.push_back(torch::randn({len, c.feature_size()}));
    teacher.push_back(torch::randn({len, c.hidden_size}));
    positions.push_back(torch::arange(len, torch::kInt64));
    u.input_ids[i].narrow(0, 0, len).copy_(ids.back());
    u.loss_mask[i].narrow(0, 0, len).copy_(mask.back());
    u.hidden_states[i].narrow(0, 0, len).copy_(features.back());
    u.teacher_hidden[i].narrow(0, 0, len).copy_(teacher.back());
    for (size_t j = 0; j < anchors[i].size(); ++j) {
      u.anchors[i][static_cast<int64_t>(j)] = anchors[i][j];
      packed_anchors.push_back(offset + anchors[i][j]);
    }
    offset += len;
  }
  EXPECT_EQ(offset, total);
  p.input_ids = torch::cat(ids).unsqueeze(0);
  p.loss_mask = torch::cat(mask).unsqueeze(0);
  p.hidden_states = torch::cat(features).unsqueeze(0);
  p.teacher_hidden = torch::cat(teacher).unsqueeze(0);
  p.positions = torch::cat(positions).unsqueeze(0);
  p.anchors = torch::tensor(packed_anchors, torch::kInt64).view({1, packed_n});
  return out;
}

// The loss, its parts and every gradient of `batch`.
struct StepOutcome {
  DrafterLossResult result;
  std::vector<torch::Tensor> grads;
};

StepOutcome RunStep(Drafter& drafter, const DrafterBatch& batch, double ce_weight) {
  drafter->zero_grad();
  StepOutcome o;
  o.result = drafter->Loss(batch, 3.0, std::nullopt, ce_weight);
  o.result.loss.backward();
  for (const auto& p : drafter->parameters()) o.grads.push_back(p.grad().clone());
  return o;
}

// Several samples packed into one row (DrafterBatch::positions) lose exactly what each loses alone
// in a padded row: the same weight, slot counts and, up to summation order, loss and gradients.
// Blocks near a sample's end predict nothing past it; a block never sees the sample before.
// `chunk_bytes`: the block attention's chunk budget (small: a chunk per block or two).
void ExpectPackedEqualsUnpacked(const DrafterModelConfig& config, double ce_weight,
                                int64_t chunk_bytes = int64_t{64} << 20) {
  torch::manual_seed(11);
  Drafter drafter = RandomDrafter(config, 3);
  drafter->attention_options.chunk_score_bytes = chunk_bytes;
  // The last anchor of each sample is within a block of its end.
  const PackedAndUnpacked batches =
      MakePackedBatches(config, {13, 6, 9}, {{1, 4, 11}, {0, 3}, {2, 5, 7}});
  const StepOutcome alone = RunStep(drafter, batches.unpacked, ce_weight);
  const StepOutcome packed = RunStep(drafter, batches.packed, ce_weight);
  EXPECT_EQ(packed.result.weight_sum, alone.result.weight_sum);
  EXPECT_EQ(packed.result.slot_total, alone.result.slot_total);
  EXPECT_EQ(packed.result.slot_correct, alone.result.slot_correct);
  EXPECT_NEAR(packed.result.weighted_ce_sum, alone.result.weighted_ce_sum,
              1e-5 * std::abs(alone.result.weighted_ce_sum));
  EXPECT_NEAR(packed.result.weighted_kl_sum, alone.result.weighted_kl_sum,
              1e-5 * std::abs(alone.result.weighted_kl_sum) + 1e-9);
  ASSERT_EQ(packed.grads.size(), alone.grads.size());
  for (size_t i = 0; i < alone.grads.size(); ++i) {
    EXPECT_TRUE(torch::allclose(packed.grads[i], alone.grads[i], 1e-4, 1e-6))
        << "gradient " << i << ": max difference "
        << (packed.grads[i] - alone.grads[i]).abs().max().item<double>();
  }
  // Without positions the same row is one long sample: blocks see the samples before theirs.
  DrafterBatch one_sample = batches.packed;
  one_sample.positions = torch::Tensor();
  const StepOutcome merged = RunStep(drafter, one_sample, ce_weight);
  EXPECT_GT(std::abs(merged.result.weighted_ce_sum - alone.result.weighted_ce_sum),
            1e-3 * std::abs(alone.result.weighted_ce_sum));
}

TEST(DrafterPackingTest, APackedRowLosesWhatItsSamplesLoseAlone) {
  DrafterModelConfig config = ::flashdraft::testing::TinyDrafterConfig(32);
  config.num_hidden_layers = 2;
  ExpectPackedEqualsUnpacked(config, 1.0);
  SCOPED_TRACE("distillation");
  ExpectPackedEqualsUnpacked(config, 0.4);
  SCOPED_TRACE("chunks of a block or two");
  ExpectPackedEqualsUnpacked(config, 1.0, 1);
  SCOPED_TRACE("a sliding layer");
  config.layer_types = {"sliding_attention", "full_attention"};
  config.sliding_window = 5;
  ExpectPackedEqualsUnpacked(config, 1.0);
  ExpectPackedEqualsUnpacked(config, 1.0, 1);
}

}  // namespace
}  // namespace flashdraft
