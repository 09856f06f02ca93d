#include "tests/support/test_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/net_util.h"

namespace flashdraft::testing {

TempDir::TempDir() {
  const char* base = getenv("TMPDIR");
  std::string pattern = absl::StrCat(base != nullptr ? base : "/tmp", "/flashdraft_test_XXXXXX");
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) abort();
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

namespace {

// Runs `command` through /bin/sh and collects its stdout.
CommandResult Popen(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) result.output.append(buf.data(), n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

}  // namespace

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  int fds[2];
  if (pipe(fds) != 0) return result;
  const pid_t pid = fork();
  if (pid < 0) return result;
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  std::array<char, 4096> buf;
  ssize_t n;
  while ((n = read(fds[0], buf.data(), buf.size())) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) result.output.append(buf.data(), n);
  }
  close(fds[0]);
  int status = 0;
  struct rusage usage = {};
  while (wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.peak_rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;
  return result;
}

std::string ReferencePythonUnavailableReason() {
  static const std::string reason = [] {
    if (access(kReferencePython, X_OK) != 0) return std::string("/usr/bin/python3 not found");
    CommandResult r = RunCommand(absl::StrCat(kReferencePython, " -c 'import torch'"));
    if (r.exit_code != 0) return absl::StrCat("import torch failed: ", r.output);
    return std::string();
  }();
  return reason;
}

absl::StatusOr<std::string> RunReferencePython(const std::string& script,
                                               const std::vector<std::string>& args) {
  TempDir dir;
  const std::string err_path = dir.Join("stderr");
  std::vector<std::string> quoted;
  for (const std::string& a : args) quoted.push_back(ShellQuote(a));
  const std::string command = absl::StrCat(kReferencePython, " -c ", ShellQuote(script), " ",
                                           absl::StrJoin(quoted, " "), " 2>", ShellQuote(err_path));
  CommandResult r = Popen(command);
  if (r.exit_code != 0) {
    CommandResult err = Popen(absl::StrCat("cat ", ShellQuote(err_path)));
    return absl::InternalError(
        absl::StrCat("reference python failed (exit ", r.exit_code, "): ", err.output));
  }
  return r.output;
}

absl::StatusOr<HttpResponse> HttpGet(int port, const std::string& path) {
  absl::StatusOr<HttpAnswer> answer =
      flashdraft::HttpGet("127.0.0.1", port, path, /*timeout_seconds=*/60, size_t{64} << 20);
  if (!answer.ok()) return answer.status();
  return HttpResponse{answer->status, std::move(answer->body)};
}

int StartProcess(const std::vector<std::string>& argv, const std::string& log,
                 const std::vector<std::string>& env) {
  const pid_t pid = fork();
  if (pid == 0) {
    for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

int FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

int WaitForPortFile(const std::string& path, double seconds) {
  for (int i = 0; i < seconds * 20; ++i) {
    int port = 0;
    std::ifstream in(path);
    if (in >> port && port > 0) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;
}

CoordinatorProcess::CoordinatorProcess(const std::string& bin, const std::string& job,
                                       const std::string& log) {
  const std::string port_file = job + ".port";
  // An earlier coordinator's port file would point at a port nobody listens on any more.
  std::filesystem::remove(port_file);
  pid_ = StartProcess({bin + "/flashdraft-coordinator", "--job", job, "--port-file", port_file},
                      log.empty() ? "/dev/null" : log);
  port_ = WaitForPortFile(port_file);
}

CoordinatorProcess::~CoordinatorProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

int CoordinatorProcess::Terminate() {
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int CoordinatorProcess::Wait(double seconds) {
  for (int i = 0; i < seconds * 20; ++i) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

int64_t ResidentBytes(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "... kB"
  }
  return -1;
}

int FindProcess(const std::vector<std::string>& parts) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    bool all = !cmdline.empty();
    for (const std::string& p : parts) all = all && cmdline.find(p) != std::string::npos;
    if (all) return std::stoi(name);
  }
  return -1;
}

namespace {
// The JSON objects of a JSONL file that have `key` (a line still being written is left out).
std::vector<nlohmann::json> ReadRecordsWith(const std::string& path, const char* key) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_discarded() && record.contains(key)) out.push_back(std::move(record));
  }
  return out;
}
}  // namespace

std::vector<nlohmann::json> ReadSteps(const std::string& path) {
  std::vector<nlohmann::json> out;
  for (nlohmann::json& r : ReadRecordsWith(path, "step")) {
    if (!r.contains("event")) out.push_back(std::move(r));
  }
  return out;
}

std::vector<nlohmann::json> ReadEvents(const std::string& path, const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (nlohmann::json& e : ReadRecordsWith(path, "event")) {
    if (e["event"] == kind) out.push_back(std::move(e));
  }
  return out;
}

std::string FirstDifferentStep(const std::vector<nlohmann::json>& a,
                               const std::vector<nlohmann::json>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    for (const char* key :
         {"step", "loss", "slot_accuracy", "tau_estimate", "weight_sum", "tokens"}) {
      const std::string x = a[i].value(key, nlohmann::json()).dump();
      const std::string y = b[i].value(key, nlohmann::json()).dump();
      if (x != y) return absl::StrCat("step ", i, ": ", key, " ", x, " vs ", y);
    }
  }
  if (a.size() != b.size()) return absl::StrCat(a.size(), " steps vs ", b.size());
  return "";
}

std::string SmallJobYaml(const SmallJob& job) {
  std::string yaml = absl::StrCat("name: ", job.name, "\n");
  if (!job.output_dir.empty()) absl::StrAppend(&yaml, "output_dir: ", job.output_dir, "\n");
  absl::StrAppend(&yaml,
                  "drafter: {num_hidden_layers: 1, block_size: 8, num_target_features: 2, "
                  "max_anchors: 8}\n",
                  "data: {source: shards, shards_dir: ", job.shards_dir, ", max_seq_len: 64}\n",
                  "train: {seed: ", job.seed);
  if (job.learning_rate > 0) absl::StrAppend(&yaml, ", learning_rate: ", job.learning_rate);
  if (!job.blas_kernel.empty()) absl::StrAppend(&yaml, ", blas_kernel: ", job.blas_kernel);
  absl::StrAppend(&yaml, ", max_steps: ", job.max_steps, ", global_batch_size: 6}\n", job.extra);
  return yaml;
}

absl::StatusOr<std::string> ProbeBlasKernel(const std::string& bin, const std::string& env) {
  const std::string command =
      absl::StrCat(env, env.empty() ? "" : " ", ShellQuote(bin + "/flashdraft-worker"), " --probe");
  // stdout only: a log line on stderr must not split the probe's lines.
  CommandResult r = Popen(command + " 2>/dev/null");
  if (r.exit_code != 0) {
    return absl::InternalError(
        absl::StrCat(command, " exited with ", r.exit_code, ":\n", r.output));
  }
  for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
    if (absl::ConsumePrefix(&line, "blas_core:")) {
      return std::string(absl::StripAsciiWhitespace(line));
    }
  }
  return absl::NotFoundError(absl::StrCat(command, " printed no blas_core line:\n", r.output));
}

absl::StatusOr<std::string> HostBlasKernel(const std::string& bin) {
  return ProbeBlasKernel(bin, "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE");
}

std::string PkiSecurityYaml(const std::string& pki) {
  return absl::StrCat("security: {tls_cert: ", pki, "/coordinator.pem, tls_key: ", pki,
                      "/coordinator.key, tls_ca: ", pki, "/ca.pem, client_cert: ", pki,
                      "/worker.pem, client_key: ", pki, "/worker.key, token_file: ", pki,
                      "/token}\n");
}

}  // namespace flashdraft::testing
