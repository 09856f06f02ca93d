#include "coordinator/scrape_targets.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/net_util.h"

namespace flashdraft {
namespace {

TEST(ScrapeTargetsTest, OneLabelledGroupPerProcess) {
  const nlohmann::json groups =
      nlohmann::json::parse(ScrapeTargetsJson("demo", {{"10.0.0.5:9400", "coordinator", ""},
                                                       {"10.0.0.6:9401", "worker", "gpu0"},
                                                       {"10.0.0.7:9402", "feeder", "f0"}}));
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0]["targets"], nlohmann::json::array({"10.0.0.5:9400"}));
  EXPECT_EQ(groups[0]["labels"],
            (nlohmann::json{{"flashdraft_job", "demo"}, {"role", "coordinator"}}));
  EXPECT_EQ(groups[1]["labels"]["worker"], "gpu0");
  EXPECT_EQ(groups[2]["labels"],
            (nlohmann::json{{"flashdraft_job", "demo"}, {"role", "feeder"}, {"feeder", "f0"}}));
  EXPECT_EQ(ScrapeTargetsJson("demo", {}), "[]\n");
}

TEST(ScrapeTargetsTest, EveryInterfaceMeansThisHostsName) {
  EXPECT_EQ(ScrapeAddress("127.0.0.1:0", 9400), "127.0.0.1:9400");
  EXPECT_EQ(ScrapeAddress("10.1.2.3:9400", 9400), "10.1.2.3:9400");
  EXPECT_EQ(ScrapeAddress("[::1]:0", 9401), "[::1]:9401");
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(ScrapeAddress("0.0.0.0:9400", 9400), std::string(host) + ":9400");
  EXPECT_EQ(ScrapeAddress("[::]:0", 7), std::string(host) + ":7");
  // A worker names the address it reaches the coordinator from.
  EXPECT_EQ(ScrapeAddress("0.0.0.0:0", 9401, "10.0.0.7"), "10.0.0.7:9401");
  EXPECT_EQ(ScrapeAddress(":0", 9401, "fd00::7"), "[fd00::7]:9401");
}

TEST(ScrapeTargetsTest, HostAndPortSplitAtTheLastColon) {
  auto split = [](const std::string& a) {
    const HostPort hp = SplitHostPort(a);
    return hp.host + "|" + hp.port;
  };
  EXPECT_EQ(split("10.1.2.3:9400"), "10.1.2.3|9400");
  EXPECT_EQ(split("[fd00::7]:80"), "fd00::7|80");
  EXPECT_EQ(split(":0"), "|0");
  EXPECT_EQ(split("host"), "host|");
}

}  // namespace
}  // namespace flashdraft
