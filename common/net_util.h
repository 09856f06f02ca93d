// Small network helpers shared by the processes and the tests (no gRPC, no LibTorch).
#pragma once

#include <cstddef>
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

struct HttpAnswer {
  int status = 0;
  std::string body;
};

// One GET of `path` from host:port over HTTP/1.0 (each address the host resolves to in turn), all
// of it, the connection included, within `timeout_seconds`; an answer longer than `max_bytes` is
// refused. Errors say which address and why (refused, timed out, not HTTP).
absl::StatusOr<HttpAnswer> HttpGet(const std::string& host, int port, const std::string& path,
                                   double timeout_seconds, size_t max_bytes);

}  // namespace flashdraft
