#include "common/net_util.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace flashdraft {

HostPort SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  HostPort out;
  out.host = address.substr(0, colon);
  if (colon != std::string::npos) out.port = address.substr(colon + 1);
  if (out.host.size() >= 2 && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  return out;
}

absl::StatusOr<std::string> LocalAddressToward(const std::string& coordinator) {
  if (coordinator.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator '", coordinator, "' is not host:port"));
  }
  const auto [host, port] = SplitHostPort(coordinator);
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve the coordinator host '", host, "': ", gai_strerror(rc)));
  }
  std::string out;
  for (addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    char text[INET6_ADDRSTRLEN] = {0};
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      const void* addr =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) out = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (out.empty()) {
    return absl::UnavailableError(absl::StrCat("no route to the coordinator host '", host, "'"));
  }
  return out;
}

std::string ScrapeAddress(const std::string& listen, int port, const std::string& wildcard_host) {
  std::string host = SplitHostPort(listen).host;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    host = wildcard_host;
    if (host.empty()) {
      char name[256] = {};
      gethostname(name, sizeof(name) - 1);
      host = name;
    }
  }
  if (host.find(':') != std::string::npos) host = "[" + host + "]";  // IPv6
  return absl::StrCat(host, ":", port);
}

}  // namespace flashdraft
