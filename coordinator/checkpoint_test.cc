#include "coordinator/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "common/grpc_options.h"
#include "common/safetensors.h"
#include "common/tensor_codec.h"
#include "coordinator/checkpoint_pipeline.h"
#include "model/drafter_export.h"
#include "tests/support/test_util.h"
#include "tests/support/tiny_drafter.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::RandomBytes;
using ::flashdraft::testing::TempDir;
using ::testing::HasSubstr;

std::vector<OwnedTensor> Upload(uint64_t seed) {
  return {{{"drafter.fc.weight", DType::kF32, {4, 8}}, RandomBytes(128, seed)},
          {{"adamw.fc.weight.exp_avg", DType::kF32, {4, 8}}, RandomBytes(128, seed + 1)},
          {{"adamw.step", DType::kI64, {1}}, RandomBytes(8, seed + 2)}};
}

TEST(CheckpointStoreTest, WritesWholeCheckpointsAndKeepsTheNewest) {
  TempDir dir;
  CheckpointStore store(dir.Join("ckpt"), 2, "0badc0de");
  auto none = store.Latest();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_TRUE(store.Existing().empty());
  for (uint64_t step : {10, 20, 30}) ASSERT_TRUE(store.Write(step, Upload(step)).ok());
  EXPECT_EQ(store.Existing().size(), 2u);
  // A leftover of an interrupted write is not a checkpoint.
  std::filesystem::create_directories(dir.Join("ckpt/step-00000040.tmp"));
  EXPECT_FALSE(std::filesystem::exists(dir.Join("ckpt/step-00000010")));  // keep_last 2
  EXPECT_TRUE(std::filesystem::exists(dir.Join("ckpt/step-00000020")));
  auto latest = store.Latest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ((*latest)->completed_steps, 30u);
  EXPECT_EQ((*latest)->job, "0badc0de");  // the writing job's fingerprint
  auto model = SafetensorsModel::Open((*latest)->model_path);
  auto optimizer = SafetensorsModel::Open((*latest)->optimizer_path);
  ASSERT_TRUE(model.ok() && optimizer.ok());
  EXPECT_EQ((*model)->names(), std::vector<std::string>{"fc.weight"});
  EXPECT_EQ((*optimizer)->names(), (std::vector<std::string>{"fc.weight.exp_avg", "step"}));
  auto view = (*model)->GetChecked("fc.weight", DType::kF32, {4, 8});
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(std::vector<uint8_t>(view->data, view->data + view->nbytes), RandomBytes(128, 30));
}

TEST(CheckpointStoreTest, KeepsACheckpointUnderEvaluationUntilItIsNoLongerListed) {
  TempDir dir;
  CheckpointStore store(dir.Join("ckpt"), 1, "0badc0de");
  auto first = store.Write(10, Upload(10));
  ASSERT_TRUE(first.ok()) << first.status();
  // An evaluation still reads step 10's files: keep_last 1 does not drop them yet.
  ASSERT_TRUE(store.Write(20, Upload(20), "", {first->dir}).ok());
  EXPECT_TRUE(std::filesystem::exists(first->dir));
  EXPECT_TRUE(std::filesystem::exists(dir.Join("ckpt/step-00000020")));
  ASSERT_TRUE(store.Write(30, Upload(30)).ok());  // the evaluation is over
  EXPECT_FALSE(std::filesystem::exists(first->dir));
  EXPECT_FALSE(std::filesystem::exists(dir.Join("ckpt/step-00000020")));
  EXPECT_EQ(store.Existing().size(), 1u);
}

TEST(CheckpointStoreTest, DamagedCheckpointIsAnErrorNamingTheFile) {
  TempDir dir;
  CheckpointStore store(dir.Join("ckpt"), 3);
  auto info = store.Write(5, Upload(1));
  ASSERT_TRUE(info.ok());
  {
    std::fstream f(info->optimizer_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  auto latest = store.Latest();
  EXPECT_THAT(std::string(latest.status().message()),
              HasSubstr("step-00000005/optimizer.safetensors: CRC-32C"));
  EXPECT_THAT(std::string(latest.status().message()), HasSubstr("the checkpoint is damaged"));
  ASSERT_TRUE(WriteFileAtomically(info->dir + "/checkpoint.json", "{\"files\": 3}").ok());
  EXPECT_THAT(std::string(store.Latest().status().message()),
              HasSubstr("checkpoint.json: not a checkpoint manifest"));
}

// A checkpoint carries the drafter's config.json (CRC-checked like its other files), and the export
// folder is written from it alone: BF16 tensors under the parameter names, the config beside them.
TEST(CheckpointStoreTest, CarriesTheDrafterConfigAndExportsFromItAlone) {
  TempDir dir;
  const DrafterModelConfig config = ::flashdraft::testing::TinyDrafterConfig(8);
  CheckpointStore store(dir.Join("ckpt"), 3, "", DrafterConfigToJson(config));
  std::vector<OwnedTensor> upload = Upload(1);
  const std::vector<float> weights = {1.0f,     -2.5f,       3.14159265f, 1e-40f,
                                      65504.0f, 1.00390625f, 1.01171875f, -0.0f};
  std::vector<uint8_t> bytes(weights.size() * sizeof(float));
  std::memcpy(bytes.data(), weights.data(), bytes.size());
  upload[0] = {{"drafter.fc.weight", DType::kF32, {2, 4}}, bytes};
  auto info = store.Write(7, upload);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(*ReadFile(info->dir + "/config.json"), DrafterConfigToJson(config));

  ASSERT_TRUE(ExportCheckpoint(info->dir, dir.Join("export")).ok());
  auto exported = SafetensorsModel::Open(dir.Join("export/model.safetensors"));
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto view = (*exported)->GetChecked("fc.weight", DType::kBF16, {2, 4});
  ASSERT_TRUE(view.ok()) << view.status();
  // Round to nearest, ties to even: 1.00390625 (halfway) -> 1.0, 1.01171875 (halfway) -> 1.015625;
  // the subnormal 1e-40 to the nearest BF16 subnormal.
  const std::vector<uint16_t> want = {0x3F80, 0xC020, 0x4049, 0x0001,
                                      0x4780, 0x3F80, 0x3F82, 0x8000};
  std::vector<uint16_t> got(want.size());
  std::memcpy(got.data(), view->data, view->nbytes);
  EXPECT_EQ(got, want);
  auto exported_config = LoadDrafterConfig(dir.Join("export/config.json"));
  ASSERT_TRUE(exported_config.ok());
  EXPECT_EQ(exported_config->target_layer_ids, config.target_layer_ids);

  // A damaged config.json is found like any other file of the checkpoint.
  ASSERT_TRUE(WriteFileAtomically(info->dir + "/config.json", "{}").ok());
  EXPECT_THAT(std::string(store.Latest().status().message()), HasSubstr("config.json: CRC-32C"));
  // Not a checkpoint: the error says what is missing.
  EXPECT_THAT(std::string(ExportCheckpoint(dir.path(), dir.Join("x")).message()),
              HasSubstr("config.json not found"));
}

// The F32 tensor under `name` in `file` holds `bytes`, or its BF16 conversion (the export).
void ExpectTensor(const SafetensorsModel& file, const std::string& name, DType dtype,
                  const std::vector<int64_t>& shape, const std::vector<uint8_t>& f32) {
  auto view = file.GetChecked(name, dtype, shape);
  ASSERT_TRUE(view.ok()) << view.status();
  if (dtype == DType::kF32) {
    ASSERT_EQ(view->nbytes, f32.size()) << name;
    EXPECT_EQ(std::memcmp(view->data, f32.data(), f32.size()), 0) << name;
    return;
  }
  ASSERT_EQ(view->nbytes, f32.size() / 2) << name;
  size_t differ = 0;
  for (size_t i = 0; i < f32.size() / 4; ++i) {
    float value;
    uint16_t got;
    std::memcpy(&value, f32.data() + 4 * i, 4);
    std::memcpy(&got, view->data + 2 * i, 2);
    differ += got != Bf16FromF32(value);
  }
  EXPECT_EQ(differ, 0u) << name;
}

// A tensor larger than gRPC's message limit (one that travels in many chunks) is written whole into
// the checkpoint and into the export, and reads back equal, beside a small one.
TEST(CheckpointStoreTest, TensorsOverTheMessageLimitAreWrittenAndExportedWhole) {
  TempDir dir;
  CheckpointStore store(dir.Join("ckpt"), 1, "",
                        DrafterConfigToJson(::flashdraft::testing::TinyDrafterConfig(8)));
  const std::vector<int64_t> big = {4100, 4096}, small = {7};
  const size_t big_bytes = 4100 * 4096 * sizeof(float);
  ASSERT_GT(big_bytes, static_cast<size_t>(kMaxMessageBytes));
  const std::vector<OwnedTensor> upload = {
      {{"drafter.fc.weight", DType::kF32, big}, RandomBytes(big_bytes, 1)},
      {{"drafter.norm.weight", DType::kF32, small}, RandomBytes(7 * sizeof(float), 2)},
      {{"adamw.step", DType::kI64, {1}}, RandomBytes(8, 3)}};
  auto info = store.Write(3, upload);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(OpenCheckpoint(info->dir).ok());  // every file's CRC-32C checked
  {
    auto model = SafetensorsModel::Open(info->model_path);
    ASSERT_TRUE(model.ok()) << model.status();
    ExpectTensor(**model, "fc.weight", DType::kF32, big, upload[0].bytes);
    ExpectTensor(**model, "norm.weight", DType::kF32, small, upload[1].bytes);
  }
  ASSERT_TRUE(ExportCheckpoint(info->dir, dir.Join("export")).ok());
  auto exported = SafetensorsModel::Open(dir.Join("export/model.safetensors"));
  ASSERT_TRUE(exported.ok()) << exported.status();
  ExpectTensor(**exported, "fc.weight", DType::kBF16, big, upload[0].bytes);
  ExpectTensor(**exported, "norm.weight", DType::kBF16, small, upload[1].bytes);
}

// checkpoint.json records what computed the checkpoint; one without the record (an older
// version's) still opens.
TEST(CheckpointStoreTest, RecordsTheNumericEnvironment) {
  TempDir dir;
  CheckpointStore store(dir.Join("ckpt"), 3, "job1");
  const std::string numerics = R"({"mixed":false,"workers":{"blas_core":"Haswell"}})";
  auto info = store.Write(4, Upload(4), numerics);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->numerics, numerics);
  auto opened = OpenCheckpoint(info->dir);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(nlohmann::json::parse(opened->numerics), nlohmann::json::parse(numerics));
  auto plain = store.Write(5, Upload(5));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(OpenCheckpoint(plain->dir)->numerics, "");
  EXPECT_FALSE(
      nlohmann::json::parse(*ReadFile(plain->dir + "/checkpoint.json")).contains("numerics"));
  // A damaged record is an error naming the file, not "nothing recorded".
  nlohmann::json manifest = nlohmann::json::parse(*ReadFile(info->dir + "/checkpoint.json"));
  manifest["numerics"] = 5;
  ASSERT_TRUE(WriteFileAtomically(info->dir + "/checkpoint.json", manifest.dump()).ok());
  EXPECT_THAT(std::string(OpenCheckpoint(info->dir).status().message()),
              HasSubstr("checkpoint.json: \"numerics\" is not an object"));
  EXPECT_FALSE(store.Write(6, Upload(6), "[1]").ok());
}

TEST(CheckpointStoreTest, RefusesTensorsOfNoKnownKind) {
  TempDir dir;
  CheckpointStore store(dir.Join("ckpt"), 3);
  std::vector<OwnedTensor> upload = Upload(1);
  upload.push_back({{"embed_tokens.weight", DType::kF32, {1}}, RandomBytes(4, 9)});
  EXPECT_THAT(std::string(store.Write(1, upload).status().message()),
              HasSubstr("tensor 'embed_tokens.weight' is neither 'drafter.' nor 'adamw.'"));
  EXPECT_FALSE(std::filesystem::exists(dir.Join("ckpt/step-00000001")));
}

TEST(CheckpointCadenceTest, StepsSecondsAndTheLastStep) {
  FakeClock clock;
  CheckpointCadence steps(10, 0, 25, clock);
  EXPECT_FALSE(steps.Due(0));
  EXPECT_TRUE(steps.Due(9));
  EXPECT_FALSE(steps.Due(10));
  EXPECT_TRUE(steps.Due(24));  // the last step
  clock.Advance(1e6);
  EXPECT_FALSE(steps.Due(11));  // no time cadence

  CheckpointCadence seconds(0, 60, 1000, clock);
  EXPECT_FALSE(seconds.Due(3));
  clock.Advance(59);
  EXPECT_FALSE(seconds.Due(4));
  clock.Advance(1);
  EXPECT_TRUE(seconds.Due(5));
  seconds.Taken();
  EXPECT_FALSE(seconds.Due(6));
  EXPECT_TRUE(seconds.Due(999));

  // Neither cadence: only the last step (the export is written from it).
  CheckpointCadence last_only(0, 0, 5, clock);
  clock.Advance(1e6);
  EXPECT_FALSE(last_only.Due(3));
  EXPECT_TRUE(last_only.Due(4));
}

// checkpoint.keep_best on resume: the record is read back, its checkpoint resolved beside it; a
// record past the resume point is dropped (those steps run again), one naming a checkpoint that is
// gone or not a record at all is an error naming the file.
TEST(CheckpointPipelineTest, AResumedJobReadsTheBestCheckpointBack) {
  TempDir dir;
  CoordinatorMetrics metrics("gloo", 10, 4);
  auto log = StepLog::Open(dir.Join("steps.jsonl"));
  ASSERT_TRUE(log.ok());
  FakeClock clock;
  CheckpointPipeline::Options options;
  options.keep_best = true;
  options.best_record = dir.Join("checkpoints/best.json");
  auto pipeline = [&] {
    return std::make_unique<CheckpointPipeline>(
        options, std::vector<TensorSpec>{},
        [](uint64_t, const std::vector<OwnedTensor>&, const std::string&,
           const std::vector<std::string>&) -> absl::StatusOr<CheckpointInfo> {
          return absl::InternalError("not written here");
        },
        [] { return std::string(); }, [](absl::Status) {}, metrics, *log, clock);
  };
  std::filesystem::create_directories(dir.Join("checkpoints/step-00000004"));
  auto none = pipeline();
  ASSERT_TRUE(none->Resumed(8, dir.Join("checkpoints/step-00000008")).ok());
  EXPECT_FALSE(none->best().has_value());

  const auto record = [&](const std::string& text) {
    ASSERT_TRUE(WriteFileAtomically(options.best_record, text).ok());
  };
  record(R"({"completed_steps": 4, "checkpoint": "step-00000004", "tau": 2.5})");
  auto kept = pipeline();
  ASSERT_TRUE(kept->Resumed(8, dir.Join("checkpoints/step-00000008")).ok());
  ASSERT_TRUE(kept->best().has_value());
  EXPECT_EQ(kept->best()->completed_steps, 4u);
  EXPECT_EQ(kept->best()->dir, dir.Join("checkpoints/step-00000004"));
  EXPECT_DOUBLE_EQ(kept->best()->tau, 2.5);

  auto earlier = pipeline();  // resumed from step 2: step 4 is trained again
  ASSERT_TRUE(earlier->Resumed(2, dir.Join("checkpoints/step-00000002")).ok());
  EXPECT_FALSE(earlier->best().has_value());
  EXPECT_FALSE(std::filesystem::exists(options.best_record)) << "the dropped record stays";

  record(R"({"completed_steps": 6, "checkpoint": "step-00000006", "tau": 2.5})");
  absl::Status gone = pipeline()->Resumed(8, dir.Join("checkpoints/step-00000008"));
  EXPECT_EQ(gone.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(gone.message(), HasSubstr("best.json names " + dir.Join("checkpoints/step-00000006") +
                                        ", which is gone"));
  record(R"({"completed_steps": "four"})");
  absl::Status bad = pipeline()->Resumed(8, dir.Join("checkpoints/step-00000008"));
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.message(), HasSubstr("best.json: not a best-checkpoint record"));
}

// Sends `tensors` as the upload of the checkpoint after `steps` and writes it (Expect, Begin, Add,
// Start and Wait, as the driver and rank 0's stream do).
void Checkpoint(CheckpointPipeline& p, uint64_t steps, const std::vector<OwnedTensor>& tensors) {
  const std::string token = absl::StrCat("rank0-", steps);
  p.Expect(token, steps);
  v1::CheckpointUpload announce;
  announce.set_completed_steps(steps);
  announce.set_num_tensors(static_cast<uint32_t>(tensors.size()));
  ASSERT_TRUE(p.Begin(token, announce).ok());
  for (const OwnedTensor& t : tensors) {
    v1::TensorChunk chunk;
    ASSERT_TRUE(
        EncodeTensor(t.spec, t.bytes.data(), t.bytes.size(), 64, chunk, [&](v1::TensorChunk& c) {
          return p.Add(token, c);
        }).ok());
  }
  p.Start(steps);
  p.Wait();
}

// keep_best with keep_last 1 (and a checkpoint.dir ending in "/"): evaluated at τ 2.0, 3.0, 3.0 and
// 2.4, the checkpoint of step 2 is the best (a tie keeps the earlier), survives the pruning beside
// the newest, and is what the record names.
TEST(CheckpointPipelineTest, TheBestEvaluatedCheckpointIsNeverPruned) {
  TempDir dir;
  const std::string root = dir.Join("ckpt") + "/";
  CheckpointStore store(root, /*keep_last=*/1, "job");
  CoordinatorMetrics metrics("gloo", 4, 4);
  auto log = StepLog::Open(dir.Join("steps.jsonl"));
  ASSERT_TRUE(log.ok());
  FakeClock clock;
  CheckpointPipeline::Options options;
  options.eval_every_steps = 1;
  options.keep_best = true;
  options.best_record = root + "best.json";
  std::vector<TensorSpec> specs;
  for (const OwnedTensor& t : Upload(0)) specs.push_back(t.spec);
  CheckpointPipeline p(
      options, specs,
      [&](uint64_t steps, const std::vector<OwnedTensor>& tensors, const std::string& numerics,
          const std::vector<std::string>& in_use) {
        return store.Write(steps, tensors, numerics, in_use);
      },
      [] { return std::string(); }, [](absl::Status s) { FAIL() << s; }, metrics, *log, clock);
  const std::map<std::string, double> tau = {{"step-00000001", 2.0},
                                             {"step-00000002", 3.0},
                                             {"step-00000003", 3.0},
                                             {"step-00000004", 2.4}};
  p.SetEvaluator([&](const std::string& checkpoint) -> absl::StatusOr<EvalSummary> {
    EvalSummary e;
    e.prompts = 1;
    e.tau = tau.at(std::filesystem::path(checkpoint).filename().string());
    return e;
  });
  for (uint64_t steps = 1; steps <= 4; ++steps) {
    Checkpoint(p, steps, Upload(steps));
    p.DrainEvaluations();  // so that no evaluation in flight keeps a checkpoint
  }
  ASSERT_TRUE(p.best().has_value());
  EXPECT_EQ(p.best()->completed_steps, 2u);
  EXPECT_EQ(store.Existing(), (std::vector<std::string>{dir.Join("ckpt/step-00000002"),
                                                        dir.Join("ckpt/step-00000004")}));
  const nlohmann::json record = nlohmann::json::parse(*ReadFile(options.best_record));
  EXPECT_EQ(record["completed_steps"], 2);
  EXPECT_EQ(record["checkpoint"], "step-00000002");
  EXPECT_DOUBLE_EQ(record["tau"].get<double>(), 3.0);
}

}  // namespace
}  // namespace flashdraft
