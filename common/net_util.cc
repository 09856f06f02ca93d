#include "common/net_util.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/ascii.h"
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

namespace {

using Deadline = std::chrono::steady_clock::time_point;

// Milliseconds left until `deadline` (0 once passed), for poll().
int MillisecondsLeft(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

// Waits until `fd` is ready for `events`; false at the deadline (also when it is ready only
// after it: a peer that keeps sending does not hold the caller past its deadline).
bool AwaitReady(int fd, short events, Deadline deadline) {
  if (std::chrono::steady_clock::now() >= deadline) return false;
  pollfd p{fd, events, 0};
  int n;
  while ((n = poll(&p, 1, MillisecondsLeft(deadline))) < 0 && errno == EINTR) {
  }
  return n > 0;
}

// A non-blocking TCP connection to one address, by the deadline; -1 with errno set otherwise.
int ConnectTo(const addrinfo& a, Deadline deadline) {
  const int fd = socket(a.ai_family, a.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a.ai_protocol);
  if (fd < 0) return -1;
  if (connect(fd, a.ai_addr, a.ai_addrlen) == 0) return fd;
  int error = errno;
  if (error == EINPROGRESS) {
    socklen_t length = sizeof(error);
    error = !AwaitReady(fd, POLLOUT, deadline)                           ? ETIMEDOUT
            : getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 ? errno
                                                                         : error;
    if (error == 0) return fd;
  }
  close(fd);
  errno = error;
  return -1;
}

// A TCP connection to host:port (each address it resolves to in turn), or why none.
absl::StatusOr<int> Connect(const std::string& host, int port, Deadline deadline) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string where = absl::StrCat(host, ":", port);
  if (const int e = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
      e != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", where, ": ", gai_strerror(e)));
  }
  std::string why = "no address";
  int fd = -1;
  for (const addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ConnectTo(*a, deadline);
    if (fd < 0) why = std::strerror(errno);
  }
  freeaddrinfo(found);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("nothing answers at ", where, ": ", why));
  return fd;
}

// The whole answer to `request` on `fd`, by the deadline; closes `fd`.
absl::StatusOr<std::string> Exchange(int fd, const std::string& request, Deadline deadline,
                                     size_t max_bytes, const std::string& where) {
  std::string answer;
  absl::Status status;
  size_t sent = 0;
  while (status.ok() && sent < request.size()) {
    const ssize_t n = AwaitReady(fd, POLLOUT, deadline)
                          ? send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL)
                          : (errno = ETIMEDOUT, -1);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
      status = absl::UnavailableError(
          absl::StrCat("cannot ask ", where, ": ", n == 0 ? "sent nothing" : std::strerror(errno)));
    }
    sent += n > 0 ? static_cast<size_t>(n) : 0;
  }
  char buffer[4096];
  while (status.ok()) {
    const ssize_t n = AwaitReady(fd, POLLIN, deadline) ? recv(fd, buffer, sizeof(buffer), 0)
                                                       : (errno = ETIMEDOUT, -1);
    if (n == 0) break;
    if (n < 0 && errno != EINTR && errno != EAGAIN) {
      status = absl::UnavailableError(
          absl::StrCat("no answer from ", where, ": ", std::strerror(errno)));
    } else if (n > 0) {
      answer.append(buffer, static_cast<size_t>(n));
      if (answer.size() > max_bytes) {
        status =
            absl::DataLossError(absl::StrCat(where, " answered more than ", max_bytes, " bytes"));
      }
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return answer;
}

}  // namespace

absl::StatusOr<HttpAnswer> HttpGet(const std::string& host, int port, const std::string& path,
                                   double timeout_seconds, size_t max_bytes) {
  const Deadline deadline = std::chrono::steady_clock::now() +
                            std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  absl::StatusOr<int> fd = Connect(host, port, deadline);
  if (!fd.ok()) return fd.status();
  const std::string where = absl::StrCat(host, ":", port, path);
  absl::StatusOr<std::string> answer =
      Exchange(*fd, absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host, "\r\n\r\n"), deadline,
               max_bytes, where);
  if (!answer.ok()) return answer.status();
  // "HTTP/1.x NNN reason\r\n...\r\n\r\nbody"
  HttpAnswer out;
  const size_t body = answer->find("\r\n\r\n");
  const bool status_line = answer->size() >= 13 && answer->rfind("HTTP/1.", 0) == 0 &&
                           (*answer)[8] == ' ' && absl::ascii_isdigit((*answer)[9]) &&
                           absl::ascii_isdigit((*answer)[10]) && absl::ascii_isdigit((*answer)[11]);
  if (!status_line || body == std::string::npos) {
    return absl::DataLossError(absl::StrCat(where, " did not answer in HTTP"));
  }
  out.status = ((*answer)[9] - '0') * 100 + ((*answer)[10] - '0') * 10 + ((*answer)[11] - '0');
  out.body = answer->substr(body + 4);
  return out;
}

}  // namespace flashdraft
