#include "feeder/feeder_fault.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flashdraft {
namespace {

TEST(FeederFaultTest, SlowFeederGivesItsMillisecondsOthersNothing) {
  EXPECT_EQ(*ParseFeederFault(nullptr), 0);
  EXPECT_EQ(*ParseFeederFault(""), 0);
  EXPECT_EQ(*ParseFeederFault("forward:step=3:rank=1"), 0) << "a worker's";
  EXPECT_EQ(*ParseFeederFault("slow-feeder:ms=250"), 250);
  for (const char* bad : {"slow-feeder", "slow-feeder:ms=", "slow-feeder:ms=-1",
                          "slow-feeder:ms=fast", "slow-feeder:s=3", "slow-feeder:ms=9999999"}) {
    absl::StatusOr<int> parsed = ParseFeederFault(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(parsed.status().message(), ::testing::HasSubstr(bad));
  }
}

}  // namespace
}  // namespace flashdraft
