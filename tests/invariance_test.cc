// Bitwise world-size invariance on the README demo job (deploy/examples/demo.yaml: a target run
// online by the coordinator, regenerated answers, 200 steps): 1, 2 and 3 worker processes write
// the same steps.jsonl numbers and export byte-identical drafters. The target is a smaller
// make-tiny-target model than the demo's (hidden 64, 150 training steps) to keep CI short; the
// job file is the demo's own.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::FirstDifferentStep;
using ::flashdraft::testing::ReadSteps;
using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::TempDir;

const std::string kCli = FLASHDRAFT_CLI;
const std::string kSource = FLASHDRAFT_SOURCE_DIR;
constexpr int kSteps = 200;

TEST(WorldSizeInvarianceTest, DemoJobIsTheSameBitsOnOneTwoAndThreeWorkers) {
  TempDir dir;
  const std::string target = dir.Join("tiny-target");
  auto made = RunCommand(absl::StrCat(kCli, " make-tiny-target --out ", target,
                                      " --steps 150 --merges 256 --hidden 64 --layers 4"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  std::map<int, std::vector<nlohmann::json>> steps;
  for (int workers : {1, 2, 3}) {
    const std::string out = dir.Join(absl::StrCat("run", workers));
    auto run = RunCommand(absl::StrCat(
        kCli, " launch ", kSource, "/deploy/examples/demo.yaml --workers ", workers, " --out ", out,
        " --set target.path=", target, " --set data.jsonl=", target, "/chats.jsonl",
        " --set train.max_steps=", kSteps, " --set checkpoint.every_steps=0"));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    steps[workers] = ReadSteps(out + "/steps.jsonl");
    ASSERT_EQ(steps[workers].size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(steps[workers][0]["world_size"], workers);
  }
  // The run trains: there are loss tokens and the loss falls.
  EXPECT_GT(steps[1].front()["tokens"].get<int64_t>(), 0);
  EXPECT_LT(steps[1].back()["loss"].get<double>(), 0.7 * steps[1].front()["loss"].get<double>());
  const auto one_drafter = ReadFile(dir.Join("run1/drafter/model.safetensors"));
  ASSERT_TRUE(one_drafter.ok()) << one_drafter.status();
  for (int workers : {2, 3}) {
    EXPECT_EQ(FirstDifferentStep(steps[1], steps[workers]), "") << "1 vs " << workers << " workers";
    const auto drafter =
        ReadFile(dir.Join(absl::StrCat("run", workers, "/drafter/model.safetensors")));
    ASSERT_TRUE(drafter.ok()) << drafter.status();
    EXPECT_TRUE(*drafter == *one_drafter)
        << "the exported drafters of 1 and " << workers << " workers differ";
    EXPECT_EQ(*ReadFile(dir.Join("run1/drafter/config.json")),
              *ReadFile(dir.Join(absl::StrCat("run", workers, "/drafter/config.json"))));
  }
}

}  // namespace
}  // namespace flashdraft
