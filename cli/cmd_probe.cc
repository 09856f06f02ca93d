// `flashdraft probe [PATH] (--port N | --port-file FILE) [--host H] [--timeout S]`: one HTTP GET
// of a flashdraft process's /healthz (or /readyz, PATH) on its metrics port, for what cannot speak
// HTTP itself: a container HEALTHCHECK in an image without curl, a service manager's check. Prints
// the answer's line; exits 0 on 200, 1 otherwise (the reason on stderr), all within --timeout.
#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cli/command.h"
#include "common/file_util.h"
#include "common/net_util.h"

namespace flashdraft {
namespace {

// More than a probe's answer ever is: a longer one is not a flashdraft process's.
constexpr size_t kMaxAnswerBytes = 64 << 10;

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
    absl::StatusOr<HttpAnswer> answer = HttpGet(host_, port, path_, timeout_, kMaxAnswerBytes);
    if (!answer.ok()) return Fail(answer.status());
    if (answer->status != 200) {
      return Fail(
          absl::UnavailableError(absl::StrCat(path_, " answered ", answer->status, ": ",
                                              absl::StripTrailingAsciiWhitespace(answer->body))));
    }
    std::printf("%s\n", std::string(absl::StripTrailingAsciiWhitespace(answer->body)).c_str());
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
