// The job's collective by cluster.backend: Gloo groups that sum across ranks (threads over one
// store), NCCL's refusal where no GPU is usable, and a backend that does not exist.
#include "worker/collective/collective_factory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "common/cuda_util.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

TEST(CollectiveFactoryTest, GlooGroupsSumAcrossRanks) {
  CollectiveFactoryOptions options;
  options.timeout = std::chrono::milliseconds(30000);
  absl::StatusOr<CollectiveFactory> factory = MakeCollectiveFactory(options);
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto store = c10::make_intrusive<c10d::HashStore>();
  constexpr int kWorld = 2;
  std::vector<torch::Tensor> sums(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kWorld; ++rank) {
    ranks.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<Collective>> c = (*factory)(store, rank, kWorld, nullptr);
      if (!c.ok()) {
        errors[rank] = std::string(c.status().message());
        return;
      }
      sums[rank] = torch::full({4}, static_cast<float>(rank + 1));
      absl::Status s = (*c)->StartAllReduceSum(sums[rank])->Wait();
      if (!s.ok()) errors[rank] = std::string(s.message());
    });
  }
  for (auto& t : ranks) t.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_EQ(errors[rank], "");
    EXPECT_TRUE(torch::equal(sums[rank], torch::full({4}, 3.0f))) << "rank " << rank;
  }
}

TEST(CollectiveFactoryTest, NcclWithoutAUsableGpuFailsToFormSayingWhy) {
  if (CudaDeviceUsable().ok()) GTEST_SKIP() << "a GPU is usable here: checked on machines without";
  CollectiveFactoryOptions options;
  options.backend = "nccl";
  absl::StatusOr<CollectiveFactory> factory = MakeCollectiveFactory(options);
  ASSERT_TRUE(factory.ok()) << factory.status();
  absl::StatusOr<std::unique_ptr<Collective>> c =
      (*factory)(c10::make_intrusive<c10d::HashStore>(), 0, 1, nullptr);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
}

TEST(CollectiveFactoryTest, AnotherBackendIsRefusedByName) {
  CollectiveFactoryOptions options;
  options.backend = "mpi";
  absl::StatusOr<CollectiveFactory> factory = MakeCollectiveFactory(options);
  ASSERT_FALSE(factory.ok());
  EXPECT_EQ(factory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(factory.status().message()), HasSubstr("cluster.backend 'mpi'"));
}

}  // namespace
}  // namespace flashdraft
