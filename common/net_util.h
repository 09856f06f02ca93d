// Small network helpers shared by the processes (no gRPC, no LibTorch).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace flashdraft {

// The local address this host uses to reach `coordinator` ("host:port" or "[v6]:port"): where
// the Gloo device binds when cluster.collective_interface is empty, so that workers on several
// hosts reach each other instead of each offering its loopback address. A UDP connect sends no
// packet; it only asks the kernel for the route.
absl::StatusOr<std::string> LocalAddressToward(const std::string& coordinator);

// "host:port", "[v6]:port" or ":port" split at the last colon, an IPv6 host without its brackets
// (no colon: all of it is the host and the port is empty).
struct HostPort {
  std::string host;
  std::string port;
};
HostPort SplitHostPort(const std::string& address);

// Where a peer (Prometheus) reaches a listener bound to `listen` (host:port) on `port`: that host,
// or `wildcard_host` when it listens on every interface (this machine's host name when empty).
std::string ScrapeAddress(const std::string& listen, int port,
                          const std::string& wildcard_host = "");

}  // namespace flashdraft
