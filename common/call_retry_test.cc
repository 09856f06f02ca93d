#include "common/call_retry.h"

#include <gtest/gtest.h>

#include <vector>

namespace flashdraft {
namespace {

grpc::Status Unavailable() { return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connect failed"); }

TEST(CallUntilReachableTest, TriesAgainUntilTheServerAnswers) {
  FakeClock clock;
  int attempts = 0;
  auto s = CallUntilReachable(
      clock, 10,
      [&](grpc::ClientContext& ctx) {
        EXPECT_GT(ctx.deadline(), std::chrono::system_clock::now());
        clock.Advance(1);
        return ++attempts < 4 ? Unavailable() : grpc::Status::OK;
      },
      [] { return false; });
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->ok());
  EXPECT_EQ(attempts, 4);
}

TEST(CallUntilReachableTest, GivesUpAfterTheTimeoutWithTheLastError) {
  FakeClock clock;
  int attempts = 0;
  auto s = CallUntilReachable(
      clock, 5,
      [&](grpc::ClientContext&) {
        clock.Advance(1);
        ++attempts;
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline");
      },
      [] { return false; });
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(attempts, 6);  // 1..5 s are within the timeout, the 6th passes it
}

TEST(CallUntilReachableTest, OtherErrorsAreNotTriedAgain) {
  FakeClock clock;
  int attempts = 0;
  auto s = CallUntilReachable(
      clock, 100,
      [&](grpc::ClientContext&) {
        ++attempts;
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "bad token");
      },
      [] { return false; });
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(attempts, 1);
}

TEST(CallUntilReachableTest, GiveUpStopsBeforeTheNextAttempt) {
  FakeClock clock;
  int attempts = 0;
  auto s = CallUntilReachable(
      clock, 100,
      [&](grpc::ClientContext&) {
        ++attempts;
        return Unavailable();
      },
      [&] { return attempts == 2; });
  EXPECT_FALSE(s.has_value());
  EXPECT_EQ(attempts, 2);
}

}  // namespace
}  // namespace flashdraft
