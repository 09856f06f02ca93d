#include "coordinator/membership.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flashdraft {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Tokens(const std::vector<Expiry>& expired) {
  std::vector<std::string> out;
  for (const Expiry& e : expired) out.push_back(e.token);
  return out;
}

MembershipOptions Options(int min, int max) {
  MembershipOptions o;
  o.min_workers = min;
  o.max_workers = max;
  o.heartbeat_timeout_seconds = 10;
  o.bind_timeout_seconds = 30;
  o.stall_timeout_seconds = 60;
  return o;
}

// Admits and binds a worker; returns its token.
std::string Ready(Membership& m, const std::string& id) {
  auto token = m.Admit(id);
  EXPECT_TRUE(token.ok()) << token.status();
  EXPECT_TRUE(m.Bind(*token).ok());
  return *token;
}

TEST(MembershipTest, FirstEpochTakesReadyWorkersInJoinOrder) {
  FakeClock clock;
  Membership m(Options(2, 3), clock);
  EXPECT_TRUE(m.Changed());  // no epoch yet
  const std::string a = Ready(m, "a");
  EXPECT_EQ(m.Available(), 1);
  auto joined_only = m.Admit("b");  // joined, no stream yet: not available
  ASSERT_TRUE(joined_only.ok());
  EXPECT_EQ(m.Available(), 1);
  ASSERT_TRUE(m.Bind(*joined_only).ok());
  EXPECT_EQ(m.Available(), 2);
  const EpochPlan plan = m.NextEpoch();
  EXPECT_EQ(plan.epoch, 1u);
  EXPECT_THAT(plan.tokens, ElementsAre(a, *joined_only));
  EXPECT_FALSE(plan.needs_state_sync);  // everybody starts from the fetched weights
  EXPECT_EQ(m.RankOf(a), 0);
  EXPECT_EQ(m.RankOf(*joined_only), 1);
  EXPECT_FALSE(m.Changed());
}

TEST(MembershipTest, TokensAreLeasedNotUsedUp) {
  FakeClock clock;
  Membership m(Options(1, 2), clock);
  const std::string a = Ready(m, "a");
  auto b = m.Admit("b");
  ASSERT_TRUE(b.ok());
  // Full: two tokens are out.
  EXPECT_EQ(m.Admit("c").status().code(), absl::StatusCode::kResourceExhausted);
  // A second stream with the same token is refused, not silently swapped in.
  EXPECT_EQ(m.Bind(a).code(), absl::StatusCode::kAlreadyExists);
  // b never binds: its token expires and its place is free again.
  clock.Advance(31);
  m.Heard(a);
  EXPECT_THAT(Tokens(m.Expired()), ElementsAre(*b));
  EXPECT_THAT(m.Expired()[0].why, HasSubstr("no Train stream within 30 s"));
  EXPECT_FALSE(m.Remove(*b));  // never bound, so never active
  EXPECT_FALSE(m.Valid(*b));
  EXPECT_EQ(m.Bind(*b).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(m.Admit("c").ok());
  // A worker whose stream ended frees its place too (it may join again).
  EXPECT_FALSE(m.Remove(a));  // ready, not active: no epoch change needed for it
  EXPECT_TRUE(m.Admit("a-again").ok());
}

TEST(MembershipTest, LossStartsANewEpochWithSurvivorsFirst) {
  FakeClock clock;
  Membership m(Options(1, 3), clock);
  const std::string a = Ready(m, "a"), b = Ready(m, "b"), c = Ready(m, "c");
  m.NextEpoch();
  m.Committed();
  EXPECT_TRUE(m.Remove(a));  // rank 0 lost
  EXPECT_TRUE(m.Changed());
  EXPECT_EQ(m.Available(), 2);
  EpochPlan plan = m.NextEpoch();
  EXPECT_EQ(plan.epoch, 2u);
  EXPECT_THAT(plan.tokens, ElementsAre(b, c));
  EXPECT_FALSE(plan.needs_state_sync);  // survivors only: they hold the same state
  // A replacement joins: it takes the next rank and must receive the group's state.
  const std::string d = Ready(m, "d");
  EXPECT_TRUE(m.Changed());
  plan = m.NextEpoch();
  EXPECT_EQ(plan.epoch, 3u);
  EXPECT_THAT(plan.tokens, ElementsAre(b, c, d));
  EXPECT_TRUE(plan.needs_state_sync);
}

TEST(MembershipTest, SilentMembersAreLostAfterTheHeartbeatTimeout) {
  FakeClock clock;
  Membership m(Options(1, 2), clock);
  const std::string a = Ready(m, "a"), b = Ready(m, "b");
  m.NextEpoch();
  clock.Advance(6);
  m.Heard(a);
  clock.Advance(5);  // b silent for 11 s, a for 5 s
  EXPECT_THAT(Tokens(m.Expired()), ElementsAre(b));
  EXPECT_THAT(m.Expired()[0].why, HasSubstr("heartbeat timeout"));
  EXPECT_FALSE(m.Changed());  // nothing removed yet
  EXPECT_TRUE(m.Remove(b));
  EXPECT_TRUE(m.Changed());
  EXPECT_EQ(m.RankOf(b), -1);
  EXPECT_EQ(m.Count(MemberState::kActive), 1);
  EXPECT_THAT(m.NextEpoch().tokens, ElementsAre(a));
}

TEST(MembershipTest, BelowTheMinimumNothingIsAvailableToStart) {
  FakeClock clock;
  Membership m(Options(2, 2), clock);
  const std::string a = Ready(m, "a"), b = Ready(m, "b");
  m.NextEpoch();
  EXPECT_TRUE(m.Remove(b));
  EXPECT_TRUE(m.Changed());
  EXPECT_LT(m.Available(), m.options().min_workers);  // the coordinator pauses
  const std::string c = Ready(m, "c");
  EXPECT_EQ(m.Available(), 2);
  EXPECT_THAT(m.NextEpoch().tokens, ElementsAre(a, c));
}

TEST(MembershipTest, AStuckTrainingThreadIsLostDespiteHeartbeats) {
  FakeClock clock;
  Membership m(Options(1, 2), clock);
  const std::string a = Ready(m, "a"), b = Ready(m, "b");
  m.NextEpoch();
  // a keeps making progress; b's heartbeats come but its forward of step 7 never ends.
  m.Progress(b, 40, "forward", 7, /*busy=*/true);
  for (int i = 0; i < 70; ++i) {
    clock.Advance(1);
    m.Progress(a, 100 + i, "forward", 7 + i, true);
    m.Progress(b, 40, "forward", 7, true);
    if (i < 59) {
      EXPECT_TRUE(m.Expired().empty()) << i;
    }
  }
  ASSERT_THAT(Tokens(m.Expired()), ElementsAre(b));
  EXPECT_THAT(m.Expired()[0].why, HasSubstr("stuck in forward of step 7"));
  EXPECT_EQ(m.Find(b)->phase, "forward");
}

TEST(MembershipTest, WaitingIsNotStuck) {
  FakeClock clock;
  Membership m(Options(1, 2), clock);
  const std::string a = Ready(m, "a"), b = Ready(m, "b");
  m.NextEpoch();
  // Waiting for data, a commit or a peer in a collective can last: only computing phases count.
  for (int i = 0; i < 200; ++i) {
    clock.Advance(1);
    m.Progress(a, 5, "idle", 3, /*busy=*/false);
    m.Progress(b, 9, "reduce", 3, /*busy=*/false);
  }
  EXPECT_TRUE(m.Expired().empty());
}

TEST(MembershipTest, LeavingWorkersAreListedUntilRemoved) {
  FakeClock clock;
  Membership m(Options(1, 3), clock);
  const std::string a = Ready(m, "a"), b = Ready(m, "b"), c = Ready(m, "c");
  m.NextEpoch();
  EXPECT_EQ(m.TokenOfRank(2), c);
  EXPECT_EQ(m.TokenOfRank(3), "");
  EXPECT_EQ(m.TokenOfWorker("b"), b);
  EXPECT_EQ(m.RequestLeave("nobody", "drained").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(m.RequestLeave(c, "SIGTERM").ok());
  ASSERT_TRUE(m.RequestLeave(b, "drained").ok());
  ASSERT_TRUE(m.RequestLeave(b, "again").ok());  // the first reason stands
  EXPECT_THAT(m.Leaving(), ElementsAre(b, c));   // join order
  EXPECT_EQ(m.Find(b)->leave_reason, "drained");
  EXPECT_FALSE(m.Changed());  // nothing changes before the step boundary
  EXPECT_TRUE(m.Remove(b));
  EXPECT_TRUE(m.Changed());
  EXPECT_THAT(m.Leaving(), ElementsAre(c));
  EXPECT_THAT(m.NextEpoch().tokens, ElementsAre(a, c));
}

}  // namespace
}  // namespace flashdraft
