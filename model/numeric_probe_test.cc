#include "model/numeric_probe.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <thread>

namespace flashdraft {
namespace {

// The job's thread count reaches both LibTorch (also in a thread started afterwards, as the
// feeder's and the coordinator's computing threads are) and the OpenBLAS this binary loaded.
TEST(NumericProbeTest, PinComputeThreadsSetsLibTorchsAndOpenBlasThreads) {
  const NumericEnv before = ProbeNumericEnv();
  if (before.blas.empty()) GTEST_SKIP() << "needs OpenBLAS (libopenblas0-pthread) behind LibTorch";
  PinComputeThreads(3);
  EXPECT_EQ(ProbeNumericEnv().blas_threads, 3);
  EXPECT_EQ(at::get_num_threads(), 3);
  int in_thread = 0;
  std::thread later([&in_thread] {
    at::parallel_for(0, 1, 1, [](int64_t, int64_t) {});  // ATen's per-thread setup
    in_thread = at::get_num_threads();
  });
  later.join();
  EXPECT_EQ(in_thread, 3);
  PinComputeThreads(1);
  EXPECT_EQ(ProbeNumericEnv().blas_threads, 1);
  EXPECT_EQ(at::get_num_threads(), 1);
}

}  // namespace
}  // namespace flashdraft
