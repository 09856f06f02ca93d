// A LeaveRequest set by a real signal handler, as the worker's SIGTERM sets main's.
#include "worker/leave_request.h"

#include <gtest/gtest.h>

#include <csignal>

namespace flashdraft {
namespace {

LeaveRequest from_signal;  // what the handler below reaches

TEST(LeaveRequestTest, ASignalHandlerSetsIt) {
  EXPECT_FALSE(from_signal.requested());
  struct sigaction sa {
  }, old{};
  sa.sa_handler = [](int) { from_signal.Request(); };
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR2, &sa, &old), 0);
  ASSERT_EQ(raise(SIGUSR2), 0);  // the handler has run when raise returns
  sigaction(SIGUSR2, &old, nullptr);
  EXPECT_TRUE(from_signal.requested());
  LeaveRequest other;  // each is its own
  EXPECT_FALSE(other.requested());
}

}  // namespace
}  // namespace flashdraft
