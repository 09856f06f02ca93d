// `flashdraft probe [PATH] (--port N | --port-file FILE) [--host H] [--timeout S]`: one HTTP GET
// of a flashdraft process's /healthz (or /readyz, PATH) on its metrics port, for what cannot speak
// HTTP itself: a container HEALTHCHECK in an image without curl, a service manager's check. Prints
// the answer's line; exits 0 on 200, 1 otherwise (the reason on stderr).
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

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

// A connected TCP socket to host:port whose sends and receives (and the connect) give up after
// `timeout` seconds, or an error naming the address.
absl::StatusOr<int> Connect(const std::string& host, int port, double timeout) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string where = absl::StrCat(host, ":", port);
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 ||
      found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve ", where));
  }
  const int fd = socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  timeval limit{};
  limit.tv_sec = static_cast<time_t>(timeout);
  limit.tv_usec = static_cast<suseconds_t>((timeout - std::floor(timeout)) * 1e6);
  const bool connected = fd >= 0 &&
                         setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit)) == 0 &&
                         setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit)) == 0 &&
                         connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  freeaddrinfo(found);
  if (!connected) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("nothing answers at ", where));
  }
  return fd;
}

absl::StatusOr<HttpAnswer> Get(const std::string& host, int port, const std::string& path,
                               double timeout) {
  absl::StatusOr<int> fd = Connect(host, port, timeout);
  if (!fd.ok()) return fd.status();
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host, "\r\n\r\n");
  std::string answer;
  bool sent = send(*fd, request.data(), request.size(), MSG_NOSIGNAL) ==
              static_cast<ssize_t>(request.size());
  char buffer[4096];
  ssize_t n = 0;
  while (sent && answer.size() <= kMaxAnswerBytes &&
         (n = recv(*fd, buffer, sizeof(buffer), 0)) > 0) {
    answer.append(buffer, static_cast<size_t>(n));
  }
  close(*fd);
  const std::string where = absl::StrCat(host, ":", port, path);
  if (!sent || n < 0) return absl::UnavailableError(absl::StrCat("no answer from ", where));
  HttpAnswer out;
  const size_t body = answer.find("\r\n\r\n");
  const size_t space = answer.find(' ');
  if (answer.rfind("HTTP/1.", 0) != 0 || body == std::string::npos || space > body ||
      !absl::SimpleAtoi(answer.substr(space + 1, 3), &out.status)) {
    return absl::DataLossError(absl::StrCat(where, " did not answer in HTTP"));
  }
  out.body = std::string(absl::StripTrailingAsciiWhitespace(answer.substr(body + 4)));
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
