#include "worker/gradient_reducer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "worker/collective/gloo_collective.h"

namespace flashdraft {
namespace {

// A real two-rank Gloo process group in this process: one thread per rank over a shared store.
void RunRanks(int world, const std::function<void(Collective&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(world);
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      GlooOptions options;
      options.timeout = std::chrono::milliseconds(30000);
      auto collective = GlooCollective::Create(store, rank, world, options);
      if (!collective.ok()) {
        errors[rank] = std::string(collective.status().message());
        return;
      }
      body(**collective);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// Random values from a generator of its own (ranks run on threads: no global seed).
torch::Tensor Randn(at::IntArrayRef shape, at::Generator& gen,
                    torch::Dtype dtype = torch::kFloat32) {
  return torch::randn(shape, gen, torch::TensorOptions().dtype(dtype));
}

// A stack of layers with parameters of two dtypes, the same on every rank.
struct Model {
  std::vector<torch::Tensor> params;
  explicit Model(int layers) {
    at::Generator gen = at::detail::createCPUGenerator(7);
    for (int i = 0; i < layers; ++i) {
      params.push_back(Randn({16, 16}, gen).requires_grad_());
      params.push_back(Randn({16}, gen).requires_grad_());
    }
    params.push_back(Randn({16}, gen, torch::kFloat64).requires_grad_());
  }
  torch::Tensor Loss(const torch::Tensor& x) const {
    torch::Tensor h = x;
    for (size_t i = 0; i + 1 < params.size(); i += 2) {
      h = torch::tanh(torch::matmul(h, params[i]) + params[i + 1]);
    }
    return (h.sum() + params.back().to(torch::kFloat32).sum() * h.mean()).pow(2);
  }
};

torch::Tensor Input(int rank, int step) {
  at::Generator gen = at::detail::createCPUGenerator(100 + 10 * rank + step);
  return Randn({4, 16}, gen);
}

// The gradients of each rank's loss, computed alone.
std::vector<torch::Tensor> GradsAlone(int layers, int rank, int step) {
  Model m(layers);
  m.Loss(Input(rank, step)).backward();
  std::vector<torch::Tensor> g;
  for (auto& p : m.params) g.push_back(p.grad().clone());
  return g;
}

TEST(GradientReducerTest, SumsEveryGradientAcrossRanksAndOverlapsBackward) {
  constexpr int kLayers = 6;
  std::vector<std::vector<torch::Tensor>> want;  // per step: sum over ranks
  for (int step = 0; step < 2; ++step) {
    std::vector<torch::Tensor> a = GradsAlone(kLayers, 0, step), b = GradsAlone(kLayers, 1, step);
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    want.push_back(a);
  }
  std::vector<int> started(2), buckets(2);
  RunRanks(2, [&](Collective& c) {
    Model m(kLayers);
    // One 16×16 float matrix is 1 KiB: about two layers per bucket, plus one float64 bucket.
    GradientReducer reducer(m.params, &c, {2200, false});
    buckets[c.rank()] = static_cast<int>(reducer.num_buckets());
    for (int step = 0; step < 2; ++step) {
      reducer.Prepare();
      m.Loss(Input(c.rank(), step)).backward();
      ASSERT_TRUE(reducer.Finish().ok());
      started[c.rank()] = reducer.started_during_backward();
      for (size_t i = 0; i < m.params.size(); ++i) {
        EXPECT_TRUE(torch::allclose(m.params[i].grad(), want[step][i], 1e-5, 1e-6))
            << "rank " << c.rank() << " step " << step << " param " << i;
      }
      // As the optimizer does after a step: zero in place, keep the aliases.
      torch::NoGradGuard no_grad;
      for (auto& p : m.params) p.mutable_grad().detach_().zero_();
    }
  });
  EXPECT_EQ(buckets[0], 4);  // 3 float buckets of 2 layers (2176 bytes each), one float64
  // Every bucket whose gradients were complete before backward ended started during backward.
  EXPECT_EQ(started[0], buckets[0]);
  EXPECT_EQ(started[1], buckets[1]);
}

// A rank with an empty microbatch runs no backward; its zeros still take part, in the same order.
TEST(GradientReducerTest, RankWithoutBackwardContributesZeros) {
  std::vector<torch::Tensor> want = GradsAlone(3, 0, 0);
  RunRanks(2, [&](Collective& c) {
    Model m(3);
    GradientReducer reducer(m.params, &c, {1500, false});
    reducer.Prepare();
    if (c.rank() == 0) m.Loss(Input(0, 0)).backward();
    ASSERT_TRUE(reducer.Finish().ok());
    for (size_t i = 0; i < m.params.size(); ++i) {
      EXPECT_TRUE(torch::allclose(m.params[i].grad(), want[i], 1e-5, 1e-6))
          << "rank " << c.rank() << " param " << i;
    }
  });
}

// Two backwards in one step would race the all-reduce already running: refused, not summed wrong.
TEST(GradientReducerTest, SecondBackwardInOneStepIsAnError) {
  RunRanks(2, [&](Collective& c) {
    Model m(2);
    GradientReducer reducer(m.params, &c, {1 << 20, false});
    reducer.Prepare();
    m.Loss(Input(c.rank(), 0)).backward();
    m.Loss(Input(c.rank(), 1)).backward();
    EXPECT_THAT(std::string(reducer.Finish().message()),
                ::testing::HasSubstr("second gradient in one shard"));
  });
}

// With one rank nothing is hooked or reduced; gradients are the local ones.
TEST(GradientReducerTest, SingleRankLeavesGradientsAlone) {
  std::vector<torch::Tensor> want = GradsAlone(2, 0, 0);
  RunRanks(1, [&](Collective& c) {
    Model m(2);
    GradientReducer reducer(m.params, &c, {1 << 20, false});
    EXPECT_EQ(reducer.num_buckets(), 0u);
    reducer.Prepare();
    m.Loss(Input(0, 0)).backward();
    ASSERT_TRUE(reducer.Finish().ok());
    for (size_t i = 0; i < m.params.size(); ++i) {
      EXPECT_TRUE(torch::equal(m.params[i].grad(), want[i]));
    }
  });
}

// The ordered reduction's reference: each shard's gradients computed alone, summed by the fixed
// shard tree (common/shard_tree.h), recursively.
torch::Tensor TreeSum(const std::vector<std::vector<torch::Tensor>>& shards, size_t param,
                      int64_t lo, int64_t hi) {
  if (hi - lo == 1) return shards[lo][param].clone();
  const int64_t mid = ShardTreeSplit(lo, hi);
  return TreeSum(shards, param, lo, mid) + TreeSum(shards, param, mid, hi);
}

// Shard k's gradients, alone (a shard is the same input whichever rank computes it); shard
// `empty` has no samples and contributes zeros.
std::vector<torch::Tensor> ShardGrads(int layers, int64_t k, int64_t empty) {
  if (k == empty) {
    Model m(layers);
    std::vector<torch::Tensor> g;
    for (auto& p : m.params) g.push_back(torch::zeros_like(p));
    return g;
  }
  return GradsAlone(layers, static_cast<int>(k), 0);
}

// Bitwise world-size invariance: K = 7 shards on 1, 2, 3 and 4 ranks give gradients equal to the
// last bit, to each other and to the tree over shards computed alone; buckets still start during
// the last shard's backward.
TEST(GradientReducerTest, OrderedSumIsTheSameBitsOnAnyWorldSize) {
  constexpr int kLayers = 6;
  constexpr int64_t kShards = 7, kEmpty = 4;
  std::vector<std::vector<torch::Tensor>> shards;
  for (int64_t k = 0; k < kShards; ++k) shards.push_back(ShardGrads(kLayers, k, kEmpty));
  std::vector<torch::Tensor> want;
  for (size_t i = 0; i < shards[0].size(); ++i) want.push_back(TreeSum(shards, i, 0, kShards));
  // The test can fail: summing left to right gives other bits for some parameter.
  bool order_matters = false;
  for (size_t i = 0; i < want.size(); ++i) {
    torch::Tensor seq = shards[0][i].clone();
    for (int64_t k = 1; k < kShards; ++k) seq += shards[k][i];
    order_matters |= !torch::equal(seq, want[i]);
  }
  EXPECT_TRUE(order_matters);
  for (int world = 1; world <= 4; ++world) {
    const std::vector<int64_t> offsets = ShardOffsets(kShards, world);
    std::vector<int> started(world), buckets(world);
    std::vector<uint64_t> bytes(world);
    RunRanks(world, [&](Collective& c) {
      Model m(kLayers);
      GradientReducer reducer(m.params, &c, {2200, true});
      buckets[c.rank()] = static_cast<int>(reducer.num_buckets());
      for (int step = 0; step < 2; ++step) {  // twice: slots are reused cleanly
        ASSERT_TRUE(reducer.BeginStep(kShards, offsets).ok());
        for (int64_t k = offsets[c.rank()]; k < offsets[c.rank() + 1]; ++k) {
          reducer.Prepare();
          if (k != kEmpty) m.Loss(Input(static_cast<int>(k), 0)).backward();
        }
        ASSERT_TRUE(reducer.Finish().ok());
        for (size_t i = 0; i < m.params.size(); ++i) {
          EXPECT_TRUE(torch::equal(m.params[i].grad(), want[i]))
              << "W " << world << " rank " << c.rank() << " step " << step << " param " << i
              << ": max diff " << (m.params[i].grad() - want[i]).abs().max().item<double>();
        }
        torch::NoGradGuard no_grad;
        for (auto& p : m.params) p.mutable_grad().detach_().zero_();
      }
      started[c.rank()] = reducer.started_during_backward();
      bytes[c.rank()] = reducer.bytes_sent();
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(buckets[r], 4);
      // The last shard ran a backward on every rank but the one whose last shard is the empty one.
      if (offsets[r + 1] - 1 != kEmpty) {
        EXPECT_EQ(started[r], buckets[r]) << "W " << world;
      }
      EXPECT_EQ(bytes[r] == 0, world == 1);
    }
  }
}

TEST(GradientReducerTest, OrderedRefusesAShardLayoutThatLeavesARankEmpty) {
  RunRanks(2, [&](Collective& c) {
    Model m(1);
    GradientReducer reducer(m.params, &c, {1 << 20, true});
    EXPECT_THAT(std::string(reducer.BeginStep(3, {0, 0, 3}).message()),
                ::testing::HasSubstr("does not give each of 2 ranks at least one of 3 shards"));
    EXPECT_FALSE(reducer.BeginStep(3, {0, 2}).ok());
    EXPECT_FALSE(reducer.BeginStep(3, {0, 1, 4}).ok());
    // A rank that finishes before computing all its shards is told so.
    ASSERT_TRUE(reducer.BeginStep(4, {0, 2, 4}).ok());
    reducer.Prepare();
    EXPECT_THAT(std::string(reducer.Finish().message()),
                ::testing::HasSubstr("computed 1 of its 2 shards"));
  });
}

}  // namespace
}  // namespace flashdraft
