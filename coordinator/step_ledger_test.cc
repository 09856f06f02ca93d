#include "coordinator/step_ledger.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/shard_tree.h"

namespace flashdraft {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// `rank`'s ack of `step` with a result for each of its shards: shard k has weighted loss k + 1,
// weight 1, k tokens and slot counts (k, 2k).
v1::StepAck Ack(uint64_t epoch, uint64_t step, int64_t first, int64_t end, int slots = 2) {
  v1::StepAck ack;
  ack.set_step(step);
  ack.set_membership_epoch(epoch);
  ack.mutable_timings()->set_wait_seconds(0.5 * static_cast<double>(first + 1));
  ack.mutable_timings()->set_forward_seconds(1.0);
  ack.mutable_timings()->set_backward_seconds(0.25 * static_cast<double>(first));
  ack.set_collective_bytes(100);
  for (int64_t k = first; k < end; ++k) {
    v1::ShardResult* r = ack.add_shards();
    r->set_shard(static_cast<uint32_t>(k));
    r->set_weighted_loss_sum(static_cast<double>(k + 1));
    r->set_weight_sum(1.0);
    r->set_tokens(static_cast<uint64_t>(k));
    for (int i = 0; i < slots; ++i) {
      r->add_slot_correct(static_cast<uint64_t>(k));
      r->add_slot_total(static_cast<uint64_t>(2 * k));
    }
  }
  return ack;
}

TEST(StepLedgerTest, SumsEveryShardOnceInShardOrder) {
  StepLedger ledger(2);
  ledger.Reset(3, 2, ShardOffsets(4, 2));  // rank 0: shards 0-1, rank 1: shards 2-3
  EXPECT_TRUE(ledger.Add(1, 0, Ack(3, 5, 2, 4)));
  EXPECT_FALSE(ledger.Complete(5));
  EXPECT_TRUE(ledger.Add(0, 0, Ack(3, 5, 0, 2)));
  ASSERT_TRUE(ledger.Complete(5));
  absl::StatusOr<StepRecord> r = ledger.Take(5);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 5u);
  EXPECT_EQ(r->world_size, 2);
  EXPECT_DOUBLE_EQ(r->weighted_loss_sum, 1 + 2 + 3 + 4);
  EXPECT_DOUBLE_EQ(r->weight_sum, 4);
  EXPECT_DOUBLE_EQ(r->loss, 10.0 / 4);
  EXPECT_EQ(r->tokens, 0 + 1 + 2 + 3);
  EXPECT_THAT(r->slot_correct, ElementsAre(6, 6));
  EXPECT_THAT(r->slot_total, ElementsAre(12, 12));
  EXPECT_DOUBLE_EQ(r->wait_seconds, (0.5 + 1.5) / 2);  // mean over ranks
  EXPECT_DOUBLE_EQ(r->max_wait_seconds, 1.5);
  // Each rank's own compute time (no waiting), for `flashdraft status`: rank 1 had shards 2..3.
  EXPECT_THAT(r->rank_compute_seconds, ElementsAre(1.0, 1.5));
  EXPECT_EQ(r->collective_bytes, 200u);
  EXPECT_FALSE(ledger.Complete(5));  // taken
}

TEST(StepLedgerTest, StaleAcksAreIgnored) {
  StepLedger ledger(2);
  ledger.Reset(3, 2, ShardOffsets(4, 2));
  EXPECT_FALSE(ledger.Add(0, 0, Ack(2, 5, 0, 2)));   // an older epoch
  EXPECT_FALSE(ledger.Add(0, 6, Ack(3, 5, 0, 2)));   // step 5 is committed already
  EXPECT_FALSE(ledger.Add(2, 0, Ack(3, 5, 0, 2)));   // no rank 2 in this epoch
  EXPECT_FALSE(ledger.Add(-1, 0, Ack(3, 5, 0, 2)));  // not a member
  EXPECT_FALSE(ledger.Complete(5));
  ledger.Add(0, 0, Ack(3, 5, 0, 2));
  ledger.Reset(4, 2, ShardOffsets(4, 2));  // a new epoch forgets the old one's acks
  ledger.Add(1, 0, Ack(4, 5, 2, 4));
  EXPECT_FALSE(ledger.Complete(5));
}

TEST(StepLedgerTest, RefusesMissingForeignDoubledOrMisshapedShards) {
  StepLedger ledger(2);
  ledger.Reset(1, 2, ShardOffsets(4, 2));
  ledger.Add(0, 0, Ack(1, 0, 0, 1));  // shard 1 missing
  ledger.Add(1, 0, Ack(1, 0, 2, 4));
  EXPECT_THAT(std::string(ledger.Take(0).status().message()),
              HasSubstr("no worker acked shard 1 of step 0"));
  ledger.Add(0, 0, Ack(1, 1, 0, 3));  // shard 2 is rank 1's
  ledger.Add(1, 0, Ack(1, 1, 2, 4));
  EXPECT_THAT(std::string(ledger.Take(1).status().message()),
              HasSubstr("worker rank 0 acked shard 2 of step 1, which is not its own (0..1)"));
  v1::StepAck twice = Ack(1, 2, 0, 2);
  *twice.add_shards() = twice.shards(0);
  ledger.Add(0, 0, twice);
  ledger.Add(1, 0, Ack(1, 2, 2, 4));
  EXPECT_THAT(std::string(ledger.Take(2).status().message()), HasSubstr("acked twice"));
  ledger.Add(0, 0, Ack(1, 3, 0, 2, /*slots=*/3));
  ledger.Add(1, 0, Ack(1, 3, 2, 4));
  EXPECT_THAT(std::string(ledger.Take(3).status().message()), HasSubstr("with 3 slots, not 2"));
}

}  // namespace
}  // namespace flashdraft
