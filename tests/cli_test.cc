// The flashdraft binary as a user runs it: exit codes and error messages for bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/file_util.h"
#include "common/safetensors.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::ShellQuote;
using ::testing::HasSubstr;

const std::string kBinary = FLASHDRAFT_CLI;
const std::string kExample = FLASHDRAFT_SOURCE_DIR "/deploy/examples/job.yaml";

TEST(CliTest, ConfigCheckPrintsTheValidatedJob) {
  auto r = RunCommand(kBinary + " config check " + kExample + " --set train.seed=42");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("valid"));
  EXPECT_THAT(r.output, HasSubstr("seed: 42"));
}

TEST(CliTest, BadJobFileExitsNonZeroNamingTheField) {
  flashdraft::testing::TempDir dir;
  const std::string path = dir.Join("job.yaml");
  ASSERT_TRUE(
      WriteFileAtomically(path, "data: {shards_dir: /d}\ntrain: {learning_rate: fast}\n").ok());
  auto r = RunCommand(kBinary + " config check " + ShellQuote(path));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output,
              HasSubstr(path + ": field 'train.learning_rate' must be a number, got 'fast'"));
  auto o = RunCommand(kBinary + " config check " + kExample + " --set cluster.backend=mpi");
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_THAT(o.output, HasSubstr("field 'cluster.backend' = mpi must be one of: gloo, nccl"));
}

TEST(CliTest, InspectListsAndRefusesMalformedFiles) {
  flashdraft::testing::TempDir dir;
  std::vector<float> w = {1, 2, 3, 4};
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("fc.weight", DType::kF32, {2, 2}, w.data(), 16).ok());
  ASSERT_TRUE(writer.Write(dir.Join("model.safetensors")).ok());
  auto r = RunCommand(kBinary + " inspect " + ShellQuote(dir.path()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("fc.weight"));
  EXPECT_THAT(r.output, HasSubstr("[2, 2]"));
  EXPECT_THAT(r.output, HasSubstr("1 tensors, 16 bytes"));

  std::string image = writer.Serialize();
  image.resize(image.size() - 4);  // truncated
  ASSERT_TRUE(WriteFileAtomically(dir.Join("model.safetensors"), image).ok());
  auto bad = RunCommand(kBinary + " inspect " + ShellQuote(dir.Join("model.safetensors")));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output,
              HasSubstr("tensor 'fc.weight': data_offsets end 16 is past the 12 bytes"));
}

TEST(CliTest, UsageErrorsExitNonZero) {
  EXPECT_NE(RunCommand(kBinary).exit_code, 0);
  EXPECT_NE(RunCommand(kBinary + " frobnicate").exit_code, 0);
  EXPECT_NE(RunCommand(kBinary + " config check").exit_code, 0);
}

}  // namespace
}  // namespace flashdraft
