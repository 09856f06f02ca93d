#include "coordinator/numerics_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

NumericEnv Env(const std::string& core) {
  NumericEnv env;
  env.torch = "1.13.0";
  env.torch_build = "cpu, AVX2";
  env.blas = "OpenBLAS 0.3.21";
  env.blas_core = core;
  env.device = "cpu";
  return env;
}

NumericsDecision Join(NumericsGroup& group, const NumericEnv& env) {
  NumericsDecision d = group.Consider(env);
  group.Commit(env, d);
  return d;
}

TEST(NumericsGroupTest, TheFirstWorkerSetsTheGroupAndAnotherKernelIsRefusedByName) {
  NumericsGroup group("", /*admit_mixed=*/false);
  NumericsDecision first = Join(group, Env("Haswell"));
  EXPECT_TRUE(first.admit && first.first);
  ASSERT_TRUE(group.group().has_value());
  EXPECT_EQ(group.group()->blas_core, "Haswell");
  NumericEnv same = Env("Haswell");
  same.blas_threads = 8;  // not compared
  same.cpu = "another processor";
  NumericsDecision second = Join(group, same);
  EXPECT_TRUE(second.admit);
  EXPECT_FALSE(second.first);
  NumericsDecision other = Join(group, Env("SkylakeX"));
  EXPECT_FALSE(other.admit);
  EXPECT_THAT(other.refusal, HasSubstr("blas_core 'SkylakeX' != 'Haswell'"));
  EXPECT_THAT(other.refusal, HasSubstr("cluster.mixed_numerics: admit"));
  EXPECT_FALSE(group.mixed());
  NumericEnv gpu = Env("Haswell");
  gpu.device = "cuda NVIDIA H200";
  EXPECT_THAT(group.Consider(gpu).refusal, HasSubstr("device 'cuda NVIDIA H200' != 'cpu'"));
}

TEST(NumericsGroupTest, MixedAdmitsWithTheDifferenceAndStaysMixed) {
  NumericsGroup group("", /*admit_mixed=*/true);
  Join(group, Env("Haswell"));
  NumericsDecision other = Join(group, Env("Zen"));
  EXPECT_TRUE(other.admit);
  EXPECT_EQ(other.mixed, "blas_core 'Zen' != 'Haswell'");
  EXPECT_TRUE(group.mixed());
  EXPECT_EQ(group.group()->blas_core, "Haswell");  // the group's stays the first's
  EXPECT_TRUE(Join(group, Env("Haswell")).mixed.empty());
  EXPECT_TRUE(group.mixed());  // the steps it took part in stay mixed
  EXPECT_TRUE(NumericsGroup("", false, std::nullopt, /*checkpoint_mixed=*/true).mixed());
}

TEST(NumericsGroupTest, APinnedKernelRefusesOthersWithTheKernelToStartWith) {
  NumericsGroup group("haswell", /*admit_mixed=*/true);  // pinning is not negotiable
  NumericsDecision wrong = Join(group, Env("SkylakeX"));
  EXPECT_FALSE(wrong.admit);
  EXPECT_EQ(wrong.blas_kernel, "haswell");
  EXPECT_THAT(wrong.refusal, HasSubstr("OpenBLAS chose 'SkylakeX': start it with "
                                       "OPENBLAS_CORETYPE=haswell"));
  EXPECT_FALSE(group.group().has_value());  // a refused worker sets nothing
  NumericEnv other_blas = Env("");
  other_blas.blas = "";
  NumericsDecision not_openblas = Join(group, other_blas);
  EXPECT_FALSE(not_openblas.admit);
  EXPECT_EQ(not_openblas.blas_kernel, "");  // starting again would not help
  EXPECT_THAT(not_openblas.refusal, HasSubstr("this worker's BLAS is not OpenBLAS"));
  EXPECT_TRUE(Join(group, Env("Haswell")).admit);
}

TEST(NumericsGroupTest, AResumeUnderAnotherEnvironmentSaysSo) {
  NumericsGroup group("", false, Env("Haswell"));
  NumericsDecision first = Join(group, Env("SkylakeX"));
  EXPECT_TRUE(first.admit);  // a resume on other machines is allowed, and said
  EXPECT_EQ(first.differs_from_previous, "blas_core 'SkylakeX' != 'Haswell'");
  EXPECT_EQ(first.previous, "the checkpoint's workers");
  NumericsGroup same("", false, Env("Haswell"));
  EXPECT_EQ(Join(same, Env("Haswell")).differs_from_previous, "");
}

// Every member left: the next worker sets the group anew (and says how it differs), so a fleet
// replaced by other machines goes on; while the group has members, it holds.
TEST(NumericsGroupTest, AnEmptiedGroupIsSetAgainByTheNextWorker) {
  NumericsGroup group("", false);
  Join(group, Env("Haswell"));
  EXPECT_FALSE(Join(group, Env("Zen")).admit);
  group.GroupEmptied();
  NumericsDecision next = Join(group, Env("Zen"));
  EXPECT_TRUE(next.admit && next.first);
  EXPECT_EQ(next.differs_from_previous, "blas_core 'Zen' != 'Haswell'");
  EXPECT_EQ(next.previous, "the earlier workers");
  EXPECT_FALSE(Join(group, Env("Haswell")).admit);
  group.GroupEmptied();
  group.GroupEmptied();  // twice: nothing more
  EXPECT_EQ(Join(group, Env("Zen")).differs_from_previous, "");
}

TEST(NumericsGroupTest, TheCheckpointRecordRoundTripsAndBadOnesAreRefused) {
  const std::string json = RecordNumerics(Env("Haswell"), Env("Zen"), true, "bf16", 2);
  absl::StatusOr<RecordedNumerics> r = ParseRecordedNumerics(json, "step-1/checkpoint.json");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->workers.has_value() && r->coordinator.has_value());
  EXPECT_EQ(r->workers->blas_core, "Haswell");
  EXPECT_EQ(r->coordinator->blas_core, "Zen");
  EXPECT_TRUE(r->mixed);
  absl::StatusOr<RecordedNumerics> none =
      ParseRecordedNumerics(RecordNumerics(std::nullopt, Env("Zen"), false, "fp32", 1), "c");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->workers.has_value());
  EXPECT_FALSE(ParseRecordedNumerics("", "c")->coordinator.has_value());  // an older checkpoint
  EXPECT_THAT(std::string(ParseRecordedNumerics(R"({"mixed": 1})", "c").status().message()),
              HasSubstr("c: numerics.mixed is not true or false"));
  EXPECT_THAT(
      std::string(
          ParseRecordedNumerics(R"({"workers": {"blas_core": 5}})", "c").status().message()),
      HasSubstr("c: numerics.workers: 'blas_core' is not a string"));
}

}  // namespace
}  // namespace flashdraft
