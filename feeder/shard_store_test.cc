#include "feeder/shard_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/chunk_wire.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

v1::ShardWork Work(std::string ticket, uint64_t step, uint32_t shard, uint64_t epoch = 1) {
  v1::ShardWork work;
  work.set_ticket(std::move(ticket));
  work.mutable_header()->set_step(step);
  work.mutable_header()->set_shard(shard);
  work.mutable_header()->set_membership_epoch(epoch);
  work.add_samples()->set_index(step * 10 + shard);
  return work;
}

// `n` bytes of chunks.
std::vector<grpc::ByteBuffer> Chunks(size_t n, char fill = 'x') {
  const std::string data(n, fill);
  grpc::Slice slice(data);
  return {grpc::ByteBuffer(&slice, 1)};
}

// What a fetch got.
struct Fetched {
  bool called = false;
  absl::StatusOr<std::vector<grpc::ByteBuffer>> result = absl::UnknownError("not called");
};

ShardStore::Ready Into(Fetched* f) {
  return [f](absl::StatusOr<std::vector<grpc::ByteBuffer>> r) {
    f->called = true;
    f->result = std::move(r);
  };
}

uint64_t HeaderEpoch(const grpc::ByteBuffer& b) {
  v1::CoordinatorMessage m;
  EXPECT_TRUE(BufferToMessage(b, &m));
  return m.microbatch().membership_epoch();
}

TEST(ShardStoreTest, AFetchWaitsForTheComputationAndGetsTheHeaderThenTheChunks) {
  ShardStore store(1000);
  ASSERT_TRUE(store.Assign(Work("a", 0, 0), 100).ok());
  Fetched f;
  store.WhenReady("a", 0, Into(&f));
  EXPECT_FALSE(f.called);
  std::optional<ShardStore::Pending> p = store.TryNextToCompute();
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->key, (ShardKey{0, 0}));
  EXPECT_EQ(p->work.samples(0).index(), 0u);
  EXPECT_EQ(store.stats().held_bytes, 100u);  // reserved while computing
  store.Complete(p->key, Chunks(80));
  ASSERT_TRUE(f.called);
  ASSERT_TRUE(f.result.ok()) << f.result.status();
  ASSERT_EQ(f.result->size(), 2u);
  EXPECT_EQ(HeaderEpoch((*f.result)[0]), 1u);
  EXPECT_EQ((*f.result)[1].Length(), 80u);
  EXPECT_EQ(store.stats().held_bytes, 80u);  // then what was computed
  EXPECT_EQ(store.stats().computed, 1u);
  // Fetched again (a worker that lost it): the same at once.
  Fetched again;
  store.WhenReady("a", 0, Into(&again));
  ASSERT_TRUE(again.called && again.result.ok());
}

TEST(ShardStoreTest, ShardsAreComputedOldestStepFirstWithinTheBudget) {
  ShardStore store(100);
  ASSERT_TRUE(store.Assign(Work("a", 0, 0), 60).ok());
  ASSERT_TRUE(store.Assign(Work("b", 1, 0), 60).ok());
  ASSERT_TRUE(store.Assign(Work("c", 2, 0), 30).ok());
  std::optional<ShardStore::Pending> a = store.TryNextToCompute();
  ASSERT_TRUE(a && a->key == (ShardKey{0, 0}));
  // b does not fit beside a, and c (which would) does not overtake it.
  EXPECT_FALSE(store.TryNextToCompute().has_value());
  store.Complete(a->key, Chunks(60));
  EXPECT_FALSE(store.TryNextToCompute().has_value());  // a is held until its step commits
  EXPECT_EQ(store.stats().pending, 2u);
  store.Release(1);
  std::optional<ShardStore::Pending> b = store.TryNextToCompute();
  ASSERT_TRUE(b && b->key == (ShardKey{1, 0}));
  std::optional<ShardStore::Pending> c = store.TryNextToCompute();  // 60 + 30 fit
  ASSERT_TRUE(c && c->key == (ShardKey{2, 0}));
  EXPECT_EQ(store.stats().held_bytes, 90u);
  EXPECT_EQ(store.stats().pending, 0u);
}

// A lost feeder's shard of an older step comes after this feeder computed newer ones and filled
// its budget: the older step still goes first (nothing held is freed before it commits).
TEST(ShardStoreTest, TheOldestStepIsComputedEvenWhenTheBudgetIsFull) {
  ShardStore store(100);
  ASSERT_TRUE(store.Assign(Work("5b", 5, 1), 50).ok());
  ASSERT_TRUE(store.Assign(Work("6b", 6, 1), 50).ok());
  for (int i = 0; i < 2; ++i) {
    std::optional<ShardStore::Pending> p = store.TryNextToCompute();
    ASSERT_TRUE(p.has_value());
    store.Complete(p->key, Chunks(50));
  }
  ASSERT_TRUE(store.Assign(Work("6a", 6, 0), 50).ok());
  EXPECT_FALSE(store.TryNextToCompute().has_value()) << "step 6 waits for room";
  ASSERT_TRUE(store.Assign(Work("5a", 5, 0), 50).ok());  // re-assigned from a lost feeder
  std::optional<ShardStore::Pending> p = store.TryNextToCompute();
  ASSERT_TRUE(p.has_value()) << "step 5 cannot commit without it";
  EXPECT_EQ(p->key, (ShardKey{5, 0}));
  EXPECT_FALSE(store.TryNextToCompute().has_value());
}

TEST(ShardStoreTest, AShardLargerThanTheBudgetGoesThroughAlone) {
  ShardStore store(10);
  ASSERT_TRUE(store.Assign(Work("big", 0, 0), 500).ok());
  ASSERT_TRUE(store.Assign(Work("next", 1, 0), 5).ok());
  std::optional<ShardStore::Pending> big = store.TryNextToCompute();
  ASSERT_TRUE(big.has_value());
  EXPECT_FALSE(store.TryNextToCompute().has_value());
  store.Complete(big->key, Chunks(500));
  store.Release(1);
  EXPECT_EQ(store.stats().held_bytes, 0u);
  EXPECT_TRUE(store.TryNextToCompute().has_value());
}

TEST(ShardStoreTest, NextToComputeWakesWhenAReleaseMakesRoom) {
  ShardStore store(100);
  ASSERT_TRUE(store.Assign(Work("a", 0, 0), 80).ok());
  ASSERT_TRUE(store.Assign(Work("b", 1, 0), 80).ok());
  std::optional<ShardStore::Pending> a = store.NextToCompute();
  ASSERT_TRUE(a.has_value());
  store.Complete(a->key, Chunks(80));
  std::optional<ShardStore::Pending> b;
  absl::Notification started;
  std::thread compute([&] {
    started.Notify();
    b = store.NextToCompute();  // blocks: b does not fit beside a
  });
  started.WaitForNotification();
  store.Release(1);  // a's step committed: its bytes go
  compute.join();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->key, (ShardKey{1, 0}));
}

TEST(ShardStoreTest, AReleaseFailsTheFetchesOfItsStepsAndFreesTheirBytes) {
  ShardStore store(1000);
  ASSERT_TRUE(store.Assign(Work("a", 0, 0), 100).ok());
  ASSERT_TRUE(store.Assign(Work("b", 1, 0), 100).ok());
  ASSERT_TRUE(store.Assign(Work("c", 2, 0), 100).ok());
  std::optional<ShardStore::Pending> a = store.TryNextToCompute();
  std::optional<ShardStore::Pending> b = store.TryNextToCompute();
  ASSERT_TRUE(a && b);
  store.Complete(a->key, Chunks(100));
  Fetched fb, fc;
  store.WhenReady("b", 1, Into(&fb));
  store.WhenReady("c", 2, Into(&fc));
  store.Release(2);  // a (computed) and b (computing) go; c (queued) stays
  ASSERT_TRUE(fb.called);
  EXPECT_EQ(fb.result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(fc.called);
  EXPECT_EQ(store.stats().held_bytes, 100u);  // b's reservation until it completes
  store.Complete(b->key, Chunks(100));        // dropped at once
  EXPECT_EQ(store.stats().held_bytes, 0u);
  Fetched fa;
  store.WhenReady("a", 0, Into(&fa));
  EXPECT_EQ(fa.result.status().code(), absl::StatusCode::kNotFound);
  // A released step is not assigned again.
  absl::Status late = store.Assign(Work("a2", 1, 0), 100);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.message(),
              HasSubstr("step 1 shard 0 of 0 assigned after its step was released"));
}

TEST(ShardStoreTest, AReassignedShardKeepsItsFeaturesUnderANewHeader) {
  ShardStore store(1000);
  ASSERT_TRUE(store.Assign(Work("epoch1", 3, 1, /*epoch=*/1), 100).ok());
  std::optional<ShardStore::Pending> p = store.TryNextToCompute();
  ASSERT_TRUE(p.has_value());
  store.Complete(p->key, Chunks(100, 'f'));
  // The group re-formed: the coordinator sends the shard again, to another rank.
  ASSERT_TRUE(store.Assign(Work("epoch2", 3, 1, /*epoch=*/2), 100).ok());
  EXPECT_FALSE(store.TryNextToCompute().has_value()) << "computed once";
  Fetched f1, f2;
  store.WhenReady("epoch1", 3, Into(&f1));
  store.WhenReady("epoch2", 3, Into(&f2));
  ASSERT_TRUE(f1.result.ok() && f2.result.ok());
  EXPECT_EQ(HeaderEpoch((*f1.result)[0]), 1u);
  EXPECT_EQ(HeaderEpoch((*f2.result)[0]), 2u);
  EXPECT_EQ((*f2.result)[1].Length(), 100u);
  EXPECT_EQ(store.stats().computed, 1u);
  // Re-formed with another worker count the plan cuts the step into other shards: a new shard.
  v1::ShardWork recut = Work("recut", 3, 1, /*epoch=*/3);
  recut.mutable_header()->set_num_shards(2);
  ASSERT_TRUE(store.Assign(recut, 100).ok());
  EXPECT_TRUE(store.TryNextToCompute().has_value());
  // The same shard with other samples is a coordinator's bug, refused.
  v1::ShardWork other = Work("other", 3, 1, /*epoch=*/4);
  other.mutable_samples(0)->set_index(99);
  EXPECT_THAT(store.Assign(other, 100).message(), HasSubstr("assigned again with other samples"));
}

TEST(ShardStoreTest, BadAssignmentsAndUnknownTicketsAreRefused) {
  ShardStore store(1000);
  EXPECT_EQ(store.Assign(Work("", 0, 0), 1).code(), absl::StatusCode::kInvalidArgument);
  v1::ShardWork headless = Work("h", 0, 0);
  headless.clear_header();
  EXPECT_THAT(store.Assign(headless, 1).message(), HasSubstr("ShardWork h has no header"));
  ASSERT_TRUE(store.Assign(Work("a", 0, 0), 1).ok());
  EXPECT_EQ(store.Assign(Work("a", 0, 1), 1).code(), absl::StatusCode::kAlreadyExists);
  // A fetch may come before its ShardWork (they travel on different streams): it waits.
  Fetched early;
  store.WhenReady("early", 5, Into(&early));
  EXPECT_FALSE(early.called);
  EXPECT_EQ(store.stats().waiting, 1u);
  ASSERT_TRUE(store.Assign(Work("early", 5, 0), 1).ok());
  EXPECT_FALSE(early.called);  // assigned, not computed
  for (std::optional<ShardStore::Pending> p; (p = store.TryNextToCompute());) {
    store.Complete(p->key, Chunks(1));
  }
  ASSERT_TRUE(early.called);
  EXPECT_TRUE(early.result.ok()) << early.result.status();
  // An unknown ticket of a released step fails at once, and so does a wait for one when its step
  // is released.
  Fetched never;
  store.WhenReady("never", 6, Into(&never));
  store.Release(7);
  Fetched gone;
  store.WhenReady("gone", 2, Into(&gone));
  ASSERT_TRUE(never.called && gone.called);
  EXPECT_EQ(never.result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(gone.result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.result.status().message(), HasSubstr("'gone': step 2 was released"));
}

TEST(ShardStoreTest, AFailedComputationFailsItsFetches) {
  ShardStore store(1000);
  ASSERT_TRUE(store.Assign(Work("a", 0, 0), 10).ok());
  Fetched f;
  store.WhenReady("a", 0, Into(&f));
  std::optional<ShardStore::Pending> p = store.TryNextToCompute();
  store.Complete(p->key, absl::ResourceExhaustedError("out of device memory"));
  ASSERT_TRUE(f.called);
  EXPECT_EQ(f.result.status().message(), "out of device memory");
  EXPECT_EQ(store.stats().held_bytes, 0u);
}

TEST(ShardStoreTest, ShutdownEndsTheWaitsAndTheComputeThreads) {
  ShardStore store(1000);
  ASSERT_TRUE(store.Assign(Work("a", 0, 0), 10).ok());
  Fetched f;
  store.WhenReady("a", 0, Into(&f));
  std::optional<ShardStore::Pending> first = store.NextToCompute();
  std::optional<ShardStore::Pending> after = ShardStore::Pending{};
  std::thread compute([&] { after = store.NextToCompute(); });
  store.Shutdown(absl::UnavailableError("coordinator gone"));
  compute.join();
  EXPECT_FALSE(after.has_value());
  ASSERT_TRUE(f.called);
  EXPECT_EQ(f.result.status().message(), "coordinator gone");
  EXPECT_EQ(store.Assign(Work("b", 1, 0), 1).message(), "coordinator gone");
}

TEST(ShardStoreTest, ACancelledWaitIsNeverCalled) {
  ShardStore store(1000);
  ASSERT_TRUE(store.Assign(Work("a", 0, 0), 10).ok());
  Fetched f;
  const uint64_t id = store.WhenReady("a", 0, Into(&f));
  EXPECT_TRUE(store.CancelWait(id));
  EXPECT_FALSE(store.CancelWait(id));
  std::optional<ShardStore::Pending> p = store.TryNextToCompute();
  store.Complete(p->key, Chunks(5));
  EXPECT_FALSE(f.called);
}

}  // namespace
}  // namespace flashdraft
