// NcclCollective on a real GPU (skipped with the reason where there is none, as on the CI machine):
// host tensors through device buffers, CUDA tensors in place, the deterministic reduction equal to
// Gloo's to the bit, a communicator that cannot form, and the timeout on a fake clock.
#include "worker/collective/nccl_collective.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "worker/collective/gloo_collective.h"
#include "worker/gradient_reducer.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

#define SKIP_WITHOUT_GPU()                                                         \
  do {                                                                             \
    if (absl::Status usable = CudaDeviceUsable(); !usable.ok()) {                  \
      GTEST_SKIP() << "needs an NVIDIA GPU with its driver: " << usable.message(); \
    }                                                                              \
  } while (0)

std::unique_ptr<NcclCollective> MakeOne(int device = 0) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  NcclOptions o;
  o.timeout = std::chrono::milliseconds(60000);
  o.device = device;
  auto c = NcclCollective::Create(store, 0, 1, o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(NcclCollectiveTest, WithoutAGpuCreateSaysWhy) {
  if (CudaDeviceUsable().ok()) GTEST_SKIP() << "a GPU is usable here: checked on machines without";
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto c = NcclCollective::Create(store, 0, 1, NcclOptions{});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("CUDA"));
}

// Every operation on host tensors (a CPU LibTorch on a GPU machine), world 1: the data goes
// through pinned and device buffers and NCCL's kernels, and comes back unchanged.
TEST(NcclCollectiveTest, HostTensorsGoThroughDeviceBuffers) {
  SKIP_WITHOUT_GPU();
  auto c = MakeOne();
  ASSERT_NE(c, nullptr);
  for (torch::ScalarType type : {torch::kFloat32, torch::kBFloat16, torch::kInt64}) {
    torch::Tensor t = torch::arange(1000).to(type);
    const torch::Tensor want = t.clone();
    ASSERT_TRUE(c->StartAllReduceSum(t)->Wait().ok());
    EXPECT_TRUE(torch::equal(t, want)) << c10::toString(type);
  }
  torch::Tensor send = torch::randn({6, 5}), recv = torch::zeros({6, 5});
  ASSERT_TRUE(c->StartAllToAll(send, recv, {6}, {6})->Wait().ok());
  EXPECT_TRUE(torch::equal(send, recv));
  torch::Tensor in = torch::randn({7}), out = torch::zeros({7});
  ASSERT_TRUE(c->StartAllGather({out}, in)->Wait().ok());
  EXPECT_TRUE(torch::equal(in, out));
  torch::Tensor b = torch::randn({9});
  const torch::Tensor b0 = b.clone();
  ASSERT_TRUE(c->StartBroadcast(b, 0)->Wait().ok());
  EXPECT_TRUE(torch::equal(b, b0));
  EXPECT_TRUE(c->Barrier().ok());
  // Many in flight at once (a step's buckets), waited in order.
  std::vector<torch::Tensor> buckets;
  std::vector<std::unique_ptr<CollectiveWork>> works;
  for (int i = 0; i < 16; ++i) {
    buckets.push_back(torch::full({4096 + i}, static_cast<float>(i)));
    works.push_back(c->StartAllReduceSum(buckets.back()));
  }
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(works[i]->Wait().ok());
    EXPECT_EQ(buckets[i][4095].item<float>(), static_cast<float>(i));
  }
}

TEST(NcclCollectiveTest, CudaTensorsInPlace) {
  SKIP_WITHOUT_GPU();
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a LibTorch built with CUDA";
  auto c = MakeOne();
  ASSERT_NE(c, nullptr);
  torch::Tensor t = torch::arange(4096, torch::kFloat32).to(torch::kCUDA) * 2;
  ASSERT_TRUE(c->StartAllReduceSum(t)->Wait().ok());
  EXPECT_TRUE(torch::equal(t.cpu(), torch::arange(4096, torch::kFloat32) * 2));
  torch::Tensor out = torch::zeros({5}, torch::kCUDA), in = torch::ones({5}, torch::kCUDA);
  ASSERT_TRUE(c->StartAllGather({out}, in)->Wait().ok());
  EXPECT_EQ(out.sum().item<float>(), 5.0f);
}

// The deterministic reduction (K virtual shards summed by a fixed tree) through NCCL's all-to-all
// and all-gather gives Gloo's bits.
TEST(NcclCollectiveTest, DeterministicReductionEqualsGlooToTheBit) {
  SKIP_WITHOUT_GPU();
  auto gloo = GlooCollective::Create(c10::make_intrusive<c10d::HashStore>(), 0, 1, GlooOptions{});
  ASSERT_TRUE(gloo.ok()) << gloo.status();
  auto nccl = MakeOne();
  ASSERT_NE(nccl, nullptr);
  auto run = [](Collective& collective) {
    at::Generator gen = at::detail::createCPUGenerator(3);
    std::vector<torch::Tensor> params = {torch::randn({64, 64}, gen).requires_grad_(),
                                         torch::randn({64}, gen).requires_grad_()};
    GradientReducerOptions o;
    o.ordered = true;
    o.bucket_bytes = 4096;
    GradientReducer reducer(params, &collective, o);
    EXPECT_TRUE(reducer.BeginStep(4, {0, 4}).ok());
    for (int shard = 0; shard < 4; ++shard) {
      reducer.Prepare();
      torch::Tensor x = torch::randn({8, 64}, gen);
      torch::tanh(torch::matmul(x, params[0]) + params[1]).pow(2).sum().backward();
    }
    EXPECT_TRUE(reducer.Finish().ok());
    return torch::cat({params[0].grad().reshape(-1), params[1].grad()});
  };
  EXPECT_TRUE(torch::equal(run(**gloo), run(*nccl)));
}

// Two ranks: a real sum on two GPUs; on one GPU NCCL refuses two ranks of one communicator, and
// the error carries NCCL's own words instead of a hang.
TEST(NcclCollectiveTest, TwoRanks) {
  SKIP_WITHOUT_GPU();
  const bool two_gpus = CudaDeviceCount() >= 2;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<absl::Status> created(2);
  std::vector<torch::Tensor> sums(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      NcclOptions o;
      o.timeout = std::chrono::milliseconds(60000);
      o.device = two_gpus ? rank : 0;
      auto c = NcclCollective::Create(store, rank, 2, o);
      created[rank] = c.status();
      if (!c.ok()) return;
      sums[rank] = torch::full({1000}, static_cast<float>(rank + 1));
      created[rank] = (*c)->StartAllReduceSum(sums[rank])->Wait();
    });
  }
  for (auto& t : threads) t.join();
  if (two_gpus) {
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(created[rank].ok()) << created[rank];
      EXPECT_EQ(sums[rank][999].item<float>(), 3.0f);
    }
  } else {
    ASSERT_FALSE(created[0].ok() && created[1].ok());
    const absl::Status& s = created[0].ok() ? created[1] : created[0];
    EXPECT_THAT(std::string(s.message()), HasSubstr("NCCL"));
  }
}

// The unique id's way through the epoch's store, without a GPU: rank 0 publishes, the others
// read it; a rank 0 that never comes ends in DEADLINE_EXCEEDED on the (fake) clock, a newer epoch
// in ABORTED, and a wrong-sized id in DATA_LOSS.
TEST(NcclUniqueIdTest, ThroughTheStoreWithTimeoutAndAbort) {
  FakeClock clock;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::atomic<bool> done{false};
  std::thread advance([&] {
    while (!done) {
      clock.Advance(1.0);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  auto late = ExchangeUniqueId(*store, 1, 2, "", 8, clock, 30, nullptr);
  done = true;
  advance.join();
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("never published"));

  auto aborted = ExchangeUniqueId(*store, 1, 2, "", 8, clock, 30, [] { return true; });
  EXPECT_EQ(aborted.status().code(), absl::StatusCode::kAborted);

  std::thread reader([&] {
    auto got = ExchangeUniqueId(*store, 1, 2, "", 8, RealClock::Get(), 30, nullptr);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, "12345678");
  });
  auto published = ExchangeUniqueId(*store, 0, 2, "12345678", 8, RealClock::Get(), 30, nullptr);
  reader.join();
  ASSERT_TRUE(published.ok());

  auto other = c10::make_intrusive<c10d::HashStore>();
  ASSERT_TRUE(ExchangeUniqueId(*other, 0, 2, "123", 3, clock, 30, nullptr).ok());
  auto wrong = ExchangeUniqueId(*other, 1, 2, "", 128, clock, 30, nullptr);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kDataLoss);
}

// Forming a communicator whose rank 0 never comes gives up at the timeout (with a GPU: the path
// through CUDA and NCCL's setup).
TEST(NcclCollectiveTest, FormingGivesUpOnTimeout) {
  SKIP_WITHOUT_GPU();
  FakeClock clock;
  NcclOptions o;
  o.timeout = std::chrono::milliseconds(5000);
  o.clock = &clock;
  std::atomic<bool> done{false};
  std::thread advance([&] {
    while (!done) {
      clock.Advance(1.0);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  auto late = NcclCollective::Create(c10::make_intrusive<c10d::HashStore>(), 1, 2, o);
  done = true;
  advance.join();
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace flashdraft
