#include "common/numeric_env.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "flashdraft/v1/coordinator.pb.h"

namespace flashdraft {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

NumericEnv Haswell() {
  NumericEnv env;
  env.torch = "1.13.1";
  env.torch_build = "cpu";
  env.blas = "OpenBLAS 0.3.21";
  env.blas_core = "Haswell";
  env.device = "cpu";
  env.blas_threads = 2;
  env.blas_env = {"OPENBLAS_CORETYPE=Haswell"};
  env.cpu = "AMD EPYC";
  return env;
}

TEST(NumericEnvTest, DifferencesNameTheFieldsThatChangeTheBits) {
  const NumericEnv a = Haswell();
  NumericEnv b = a;
  b.blas_threads = 16;  // OpenBLAS's thread count does not change its results
  b.blas_env.clear();
  b.cpu = "Intel Xeon";
  EXPECT_TRUE(NumericDifferences(a, b).empty());
  b.blas_core = "SkylakeX";
  b.torch = "2.11.0";
  EXPECT_THAT(NumericDifferences(b, a),
              ElementsAre("torch '2.11.0' != '1.13.1'", "blas_core 'SkylakeX' != 'Haswell'"));
}

TEST(NumericEnvTest, JsonRoundTripAndBadInput) {
  const NumericEnv a = Haswell();
  absl::StatusOr<NumericEnv> b = NumericEnvFromJson(NumericEnvToJson(a), "checkpoint.json");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(NumericDifferences(a, *b).empty());
  EXPECT_EQ(b->blas_threads, 2);
  EXPECT_EQ(b->blas_env, a.blas_env);
  EXPECT_EQ(b->cpu, "AMD EPYC");
  const std::pair<nlohmann::json, const char*> bad[] = {
      {nlohmann::json::array(), "x: not an object"},
      {{{"blas_core", 3}}, "x: 'blas_core' is not a string"},
      {{{"blas_threads", "two"}}, "x: 'blas_threads' is not an integer"},
      {{{"blas_env", "OPENBLAS_CORETYPE=Haswell"}}, "x: 'blas_env' is not a list"},
      {{{"blas_env", {1}}}, "x: 'blas_env' holds a non-string"},
      {{{"device", std::string(300, 'a')}}, "x: device must be at most 256 printable"},
      {{{"blas_core", "Has\nwell"}}, "x: blas_core must be at most 256 printable"},
  };
  for (const auto& [json, error] : bad) {
    absl::StatusOr<NumericEnv> env = NumericEnvFromJson(json, "x");
    ASSERT_FALSE(env.ok()) << json.dump();
    EXPECT_THAT(std::string(env.status().message()), HasSubstr(error)) << json.dump();
  }
  NumericEnv many = a;
  many.blas_env.assign(17, "OPENBLAS_X=1");
  EXPECT_THAT(std::string(ValidateNumericEnv(many, "worker 'w'").message()),
              HasSubstr("worker 'w': more than 16 blas_env entries"));
}

TEST(NumericEnvTest, KernelNamesCompareWithoutCase) {
  EXPECT_TRUE(SameBlasKernel("Haswell", "haswell"));
  EXPECT_TRUE(SameBlasKernel("SkylakeX", "SKYLAKEX"));
  EXPECT_FALSE(SameBlasKernel("Haswell", "SkylakeX"));
  EXPECT_FALSE(SameBlasKernel("", ""));  // not OpenBLAS: no kernel to match
}

TEST(NumericEnvTest, TheJoinsCopyRoundTripsAndTheJobSaysWhereItComputes) {
  NumericEnv a = Haswell();
  a.gpu = "NVIDIA H200";
  v1::NumericEnv wire;
  NumericEnvToProto(a, &wire);
  const NumericEnv cpu = NumericEnvFromProto(wire, /*on_gpu=*/false);
  EXPECT_TRUE(NumericDifferences(a, cpu).empty());
  EXPECT_EQ(cpu.gpu, "NVIDIA H200");
  EXPECT_EQ(cpu.blas_env, a.blas_env);
  EXPECT_EQ(cpu.blas_threads, 2);
  EXPECT_EQ(NumericEnvFromProto(wire, /*on_gpu=*/true).device, "cuda NVIDIA H200");
}

TEST(NumericEnvTest, AProbedEnvironmentIsMadeToFitWhatTheWireAccepts) {
  NumericEnv env = Haswell();
  env.blas_env.assign(20, "OPENBLAS_X=" + std::string(300, 'y'));
  env.cpu = "caf\xc3\xa9";  // not ASCII
  env.gpu = std::string(400, 'g');
  SanitizeNumericEnv(env);
  EXPECT_TRUE(ValidateNumericEnv(env, "x").ok()) << ValidateNumericEnv(env, "x");
  EXPECT_EQ(env.blas_env.size(), 16u);
  EXPECT_EQ(env.cpu, "caf??");
  EXPECT_LE(env.gpu.size() + 5, 256u);  // "cuda " + gpu fits too
}

TEST(NumericEnvTest, KernelNamesAreShortWords) {
  EXPECT_TRUE(ValidBlasKernelName("SkylakeX"));
  EXPECT_TRUE(ValidBlasKernelName("ARMV8SVE_2"));
  EXPECT_FALSE(ValidBlasKernelName(""));
  EXPECT_FALSE(ValidBlasKernelName("Haswell; rm -rf /"));
  EXPECT_FALSE(ValidBlasKernelName(std::string(33, 'a')));
}

// This test binary links no BLAS: the probe says so instead of guessing, reports the OPENBLAS_*
// variables it sees, and a pinned kernel is refused with the reason.
TEST(NumericEnvTest, WithoutOpenBlasTheProbeSaysSoAndPinningIsRefused) {
  if (dlsym(RTLD_DEFAULT, "openblas_get_config") != nullptr) {
    GTEST_SKIP() << "an OpenBLAS is loaded into this test (LD_PRELOAD?): pinning would exec";
  }
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  setenv("OPENBLAS_L2_SIZE", "512", 1);
  NumericEnv env;
  ProbeBlas(env);
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv("OPENBLAS_L2_SIZE");
  EXPECT_EQ(env.blas, "");
  EXPECT_EQ(env.blas_core, "");
  EXPECT_THAT(env.blas_env, ElementsAre("OPENBLAS_CORETYPE=Haswell", "OPENBLAS_L2_SIZE=512"));
  EXPECT_THAT(DescribeNumericEnv(env), HasSubstr("BLAS not OpenBLAS"));
  EXPECT_THAT(NumericEnvProbeLines(env), HasSubstr("\nblas_core: \n"));
  EXPECT_FALSE(PinBlasThreads(2));
  EXPECT_TRUE(PinBlasKernel("", nullptr).ok());
  EXPECT_THAT(std::string(PinBlasKernel("Haswell", nullptr).message()),
              HasSubstr("train.blas_kernel is 'Haswell' but this process's BLAS is not OpenBLAS"));
  EXPECT_THAT(std::string(PinBlasKernel("Has well", nullptr).message()),
              HasSubstr("'Has well' is not an OpenBLAS kernel name"));
}

}  // namespace
}  // namespace flashdraft
