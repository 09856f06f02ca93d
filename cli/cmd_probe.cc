// `flashdraft probe [PATH] (--port N | --port-file FILE) [--host H] [--timeout S]`: one HTTP GET
// of a flashdraft process's /healthz (or /readyz, PATH) on its metrics port, for what cannot speak
// HTTP itself: a container HEALTHCHECK in an image without curl, a service manager's check. Prints
// the answer's line; exits 0 on 200, 1 otherwise (the reason on stderr), all within --timeout.
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cli/command.h"
#include "common/file_util.h"

namespace flashdraft {
namespace {

// More than a probe's answer ever is: a longer one is not a flashdraft process's.
constexpr size_t kMaxAnswerBytes = 64 << 10;

struct HttpAnswer {
  int status = 0;
  std::string body;
};

using Deadline = std::chrono::steady_clock::time_point;

// Milliseconds left until `deadline` (0 once passed), for poll().
int MillisecondsLeft(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// Waits until `fd` is ready for `events`; false at the deadline.
bool AwaitReady(int fd, short events, Deadline deadline) {
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
                                     const std::string& where) {
  std::string answer;
  absl::Status status;
  size_t sent = 0;
  while (status.ok() && sent < request.size()) {
    const ssize_t n = AwaitReady(fd, POLLOUT, deadline)
                          ? send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL)
                          : (errno = ETIMEDOUT, -1);
    if (n < 0 && errno != EINTR && errno != EAGAIN) {
      status =
          absl::UnavailableError(absl::StrCat("cannot ask ", where, ": ", std::strerror(errno)));
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
      if (answer.size() > kMaxAnswerBytes) {
        status = absl::DataLossError(absl::StrCat(where, " answered more than ", kMaxAnswerBytes,
                                                  " bytes: not a flashdraft process"));
      }
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return answer;
}

// GET `path` from host:port over HTTP/1.0, all of it within `timeout` seconds.
absl::StatusOr<HttpAnswer> Get(const std::string& host, int port, const std::string& path,
                               double timeout) {
  const Deadline deadline = std::chrono::steady_clock::now() +
                            std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000));
  absl::StatusOr<int> fd = Connect(host, port, deadline);
  if (!fd.ok()) return fd.status();
  const std::string where = absl::StrCat(host, ":", port, path);
  absl::StatusOr<std::string> answer = Exchange(
      *fd, absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host, "\r\n\r\n"), deadline, where);
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
  out.body = std::string(absl::StripTrailingAsciiWhitespace(answer->substr(body + 4)));
  return out;
}

// The port a --metrics-port-file holds (a number and a newline).
absl::StatusOr<int> PortFromFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::UnavailableError(absl::StrCat("--port-file ", path, ": ", text.status().message(),
                                               " (the process does not serve yet?)"));
  }
  int port = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port-file ", path, ": '",
                                                   absl::StripAsciiWhitespace(*text).substr(0, 20),
                                                   "' is not a port (1-65535)"));
  }
  return port;
}

class ProbeCommand : public Command {
 public:
  explicit ProbeCommand(CLI::App& parent)
      : Command(parent.add_subcommand(
            "probe",
            "GET /healthz (or PATH) on a flashdraft process's metrics port: exit 0 on 200")) {
    app().add_option("path", path_, "/healthz or /readyz")->capture_default_str();
    app().add_option("--port", port_, "the metrics port")->check(CLI::Range(1, 65535));
    app().add_option("--port-file", port_file_,
                     "read the port from this file (--metrics-port-file of the worker or feeder)");
    app().add_option("--host", host_, "where the process listens")->capture_default_str();
    app()
        .add_option("--timeout", timeout_, "seconds to wait for the answer")
        ->capture_default_str()
        ->check(CLI::Range(0.1, 3600.0));
  }

  int Run() override {
    if ((port_ > 0) == !port_file_.empty()) {
      return Fail(absl::InvalidArgumentError("give one of --port and --port-file"));
    }
    if (path_.empty() || path_[0] != '/') {
      return Fail(absl::InvalidArgumentError(absl::StrCat("path '", path_, "' must start with /")));
    }
    if (std::any_of(path_.begin(), path_.end(),
                    [](char c) { return !absl::ascii_isgraph(static_cast<unsigned char>(c)); })) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("path '", absl::CHexEscape(path_), "' has a space or a control character")));
    }
    int port = port_;
    if (!port_file_.empty()) {
      absl::StatusOr<int> from_file = PortFromFile(port_file_);
      if (!from_file.ok()) return Fail(from_file.status());
      port = *from_file;
    }
    absl::StatusOr<HttpAnswer> answer = Get(host_, port, path_, timeout_);
    if (!answer.ok()) return Fail(answer.status());
    if (answer->status != 200) {
      return Fail(absl::UnavailableError(
          absl::StrCat(path_, " answered ", answer->status, ": ", answer->body)));
    }
    std::printf("%s\n", answer->body.c_str());
    return 0;
  }

 private:
  std::string path_ = "/healthz";
  int port_ = 0;
  std::string port_file_;
  std::string host_ = "127.0.0.1";
  double timeout_ = 5;
};

}  // namespace

void AddProbeCommand(CLI::App& app, Commands& out) {
  out.push_back(std::make_unique<ProbeCommand>(app));
}

}  // namespace flashdraft
