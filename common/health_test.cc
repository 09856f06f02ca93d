#include "common/health.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "common/metrics_exporter.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

TEST(HealthStateTest, LiveUntilTheWatcherFallsSilentPastItsTime) {
  FakeClock clock;
  HealthState health(clock);
  EXPECT_EQ(health.Healthz().status, 200);  // nothing watches it yet
  health.Alive(5.0, "the heartbeat thread");
  clock.Advance(5.0);
  EXPECT_EQ(health.Healthz().status, 200);
  clock.Advance(0.5);
  const ProbeAnswer silent = health.Healthz();
  EXPECT_EQ(silent.status, 503);
  EXPECT_EQ(silent.body, "no progress report from the heartbeat thread for 5.5 s");
  health.Alive(5.0, "the heartbeat thread");  // it reports again
  EXPECT_EQ(health.Healthz().status, 200);
  health.Alive(HealthState::kForever, "nobody");
  clock.Advance(1e6);
  EXPECT_EQ(health.Healthz().status, 200);
}

TEST(HealthStateTest, StuckUntilTheNextReport) {
  FakeClock clock;
  HealthState health(clock);
  health.Stuck("the training thread is in forward of step 7 for 301 s");
  EXPECT_EQ(health.Healthz().status, 503);
  EXPECT_EQ(health.Healthz().body, "the training thread is in forward of step 7 for 301 s");
  health.Alive(5.0, "the heartbeat thread");
  EXPECT_EQ(health.Healthz().status, 200);
}

TEST(HealthStateTest, ReadyOnlyWhileLive) {
  FakeClock clock;
  HealthState health(clock);
  EXPECT_EQ(health.Readyz().status, 503);
  EXPECT_EQ(health.Readyz().body, "not ready: starting");
  health.Ready(true, "trained step 1");
  EXPECT_EQ(health.Readyz().status, 200);
  EXPECT_EQ(health.Readyz().body, "ok: trained step 1");
  health.Stuck("stuck");
  EXPECT_EQ(health.Readyz().status, 503);
  health.Alive(1.0, "w");
  EXPECT_EQ(health.Readyz().status, 200);
  health.Ready(false, "rejoining the coordinator");
  EXPECT_EQ(health.Readyz().body, "not ready: rejoining the coordinator");
}

// Over real HTTP, beside /metrics: each exporter of the process answers with its own state.
TEST(HealthStateTest, EachExporterAnswersItsProbesBesideMetrics) {
  MetricsExporter a(prometheus::Labels{{"role", "a"}}), b(prometheus::Labels{{"role", "b"}});
  auto port_a = a.Serve("127.0.0.1:0", "a");
  auto port_b = b.Serve("127.0.0.1:0", "b");
  ASSERT_TRUE(port_a.ok() && port_b.ok());
  a.health().Ready(true, "serving");
  b.health().Stuck("the step driver is stuck");

  auto ready = testing::HttpGet(*port_a, "/readyz");
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_EQ(ready->status, 200);
  EXPECT_EQ(ready->body, "ok: serving\n");
  auto healthy = testing::HttpGet(*port_a, "/healthz");
  ASSERT_TRUE(healthy.ok());
  EXPECT_EQ(healthy->status, 200);
  EXPECT_EQ(healthy->body, "ok\n");

  auto stuck = testing::HttpGet(*port_b, "/healthz");
  ASSERT_TRUE(stuck.ok());
  EXPECT_EQ(stuck->status, 503);
  EXPECT_EQ(stuck->body, "the step driver is stuck\n");
  auto not_ready = testing::HttpGet(*port_b, "/readyz");
  ASSERT_TRUE(not_ready.ok());
  EXPECT_EQ(not_ready->status, 503);

  auto metrics = testing::HttpGet(*port_b, "/metrics");
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("flashdraft_build_info{"));
  auto other = testing::HttpGet(*port_b, "/healthzz");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->status, 404);
}

// A client that connects and sends nothing does not hold the probes: another thread answers them
// (a probe's own deadline is short; the idle connection would hold a lone thread for civetweb's
// request timeout).
TEST(HealthStateTest, AnIdleClientDoesNotHoldTheProbes) {
  MetricsExporter exporter(prometheus::Labels{{"role", "a"}});
  auto port = exporter.Serve("127.0.0.1:0", "a");
  ASSERT_TRUE(port.ok()) << port.status();
  exporter.health().Ready(true, "serving");
  const int idle = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(*port));
  ASSERT_EQ(connect(idle, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // accepted, waiting for a request
  // The probe with a receive deadline well under civetweb's request timeouts (10 s now, 30 s by
  // default): with one thread it would get nothing before the idle client is given up.
  const int probe = socket(AF_INET, SOCK_STREAM, 0);
  timeval limit{8, 0};
  ASSERT_EQ(setsockopt(probe, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit)), 0);
  ASSERT_EQ(connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string request = "GET /readyz HTTP/1.0\r\n\r\n";
  ASSERT_EQ(send(probe, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  char buffer[256] = {};
  const ssize_t n = recv(probe, buffer, sizeof(buffer) - 1, 0);
  EXPECT_GT(n, 0) << "no answer while another client idles: " << std::strerror(errno);
  EXPECT_THAT(std::string(buffer), HasSubstr("200"));
  close(probe);
  close(idle);
}

}  // namespace
}  // namespace flashdraft
