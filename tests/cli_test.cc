// The flashdraft binary as a user runs it: exit codes and error messages for bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::ShellQuote;
using ::testing::HasSubstr;

const std::string kBinary = FLASHDRAFT_CLI;
const std::string kExample = FLASHDRAFT_SOURCE_DIR "/deploy/examples/job.yaml";

TEST(CliTest, ConfigCheckPrintsTheValidatedJob) {
  auto r = RunCommand(kBinary + " config check " + kExample + " --set train.seed=42");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("valid"));
  EXPECT_THAT(r.output, HasSubstr("seed: 42"));
}

TEST(CliTest, BadJobFileExitsNonZeroNamingTheField) {
  flashdraft::testing::TempDir dir;
  const std::string path = dir.Join("job.yaml");
  ASSERT_TRUE(
      WriteFileAtomically(path, "data: {shards_dir: /d}\ntrain: {learning_rate: fast}\n").ok());
  auto r = RunCommand(kBinary + " config check " + ShellQuote(path));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output,
              HasSubstr(path + ": field 'train.learning_rate' must be a number, got 'fast'"));
  auto o = RunCommand(kBinary + " config check " + kExample + " --set cluster.backend=mpi");
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_THAT(o.output, HasSubstr("field 'cluster.backend' = mpi must be one of: gloo, nccl"));
}

TEST(CliTest, InspectListsAndRefusesMalformedFiles) {
  flashdraft::testing::TempDir dir;
  std::vector<float> w = {1, 2, 3, 4};
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("fc.weight", DType::kF32, {2, 2}, w.data(), 16).ok());
  ASSERT_TRUE(writer.Write(dir.Join("model.safetensors")).ok());
  auto r = RunCommand(kBinary + " inspect " + ShellQuote(dir.path()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("fc.weight"));
  EXPECT_THAT(r.output, HasSubstr("[2, 2]"));
  EXPECT_THAT(r.output, HasSubstr("1 tensors, 16 bytes"));

  std::string image = writer.Serialize();
  image.resize(image.size() - 4);  // truncated
  ASSERT_TRUE(WriteFileAtomically(dir.Join("model.safetensors"), image).ok());
  auto bad = RunCommand(kBinary + " inspect " + ShellQuote(dir.Join("model.safetensors")));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output,
              HasSubstr("tensor 'fc.weight': data_offsets end 16 is past the 12 bytes"));
}

TEST(CliTest, UsageErrorsExitNonZero) {
  EXPECT_NE(RunCommand(kBinary).exit_code, 0);
  EXPECT_NE(RunCommand(kBinary + " frobnicate").exit_code, 0);
  EXPECT_NE(RunCommand(kBinary + " config check").exit_code, 0);
}

// `flashdraft probe` refuses what it cannot probe, naming it, and fails where nothing answers
// (its answers from a live process: HealthTest in observability_test.cc).
TEST(CliTest, ProbeNamesWhatItCannotProbe) {
  flashdraft::testing::TempDir dir;
  ASSERT_TRUE(flashdraft::WriteFileAtomically(dir.Join("garbage.port"), "http\n").ok());
  // A port nothing answers on: bound here (no one else takes it), never listening.
  const int bound = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  ASSERT_EQ(bind(bound, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(bound, reinterpret_cast<sockaddr*>(&addr), &length), 0);
  const int closed = ntohs(addr.sin_port);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "give one of --port and --port-file"},
      {"--port 9 --port-file x", "give one of --port and --port-file"},
      {"healthz --port 9", "path 'healthz' must start with /"},
      {"--port-file " + dir.Join("missing.port"), "missing.port"},
      {"--port-file " + dir.Join("garbage.port"), "'http' is not a port (1-65535)"},
      {absl::StrCat("--port ", closed), absl::StrCat("nothing answers at 127.0.0.1:", closed)},
  };
  for (const auto& [args, error] : cases) {
    const auto r = RunCommand(absl::StrCat(kBinary, " probe ", args, " 2>&1"));
    EXPECT_EQ(r.exit_code, 1) << args << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr(error)) << args;
  }
  EXPECT_NE(RunCommand(kBinary + " probe --port 0 2>&1").exit_code, 0);
  close(bound);
  const auto spaced = RunCommand(kBinary + " probe '/healthz x' --port 9 2>&1");
  EXPECT_EQ(spaced.exit_code, 1);
  EXPECT_THAT(spaced.output, HasSubstr("has a space or a control character"));
}

// A server on loopback that reads each connection's request and answers it with `answer`, `chunk`
// bytes at a time, `pause` apart, until the test ends.
class TrickleServer {
 public:
  TrickleServer(std::string answer, size_t chunk, std::chrono::milliseconds pause)
      : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(addr);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &length), 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, answer, chunk, pause] {
      for (int client; (client = accept(fd_, nullptr, nullptr)) >= 0; close(client)) {
        // The request first: closing a socket with unread input resets the connection.
        std::string request;
        char buffer[1024];
        for (ssize_t n; request.find("\r\n\r\n") == std::string::npos &&
                        (n = recv(client, buffer, sizeof(buffer), 0)) > 0;) {
          request.append(buffer, static_cast<size_t>(n));
        }
        for (size_t at = 0; at < answer.size() && !stop_; at += chunk) {
          if (send(client, answer.data() + at, std::min(chunk, answer.size() - at), MSG_NOSIGNAL) <
              0) {
            break;
          }
          std::this_thread::sleep_for(pause);
        }
      }
    });
  }
  ~TrickleServer() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// --timeout bounds the whole probe (a peer that answers a byte at a time does not hold it), and an
// answer too long for a flashdraft process is refused, not cut.
TEST(CliTest, ProbeKeepsItsDeadlineAndRefusesOversizedAnswers) {
  const std::string ok = "HTTP/1.0 200 OK\r\n\r\nok\n";
  TrickleServer slow(ok + std::string(64, ' '), 1, std::chrono::milliseconds(200));
  // The whole answer takes 16 s, each byte 0.2 s: only a deadline on the whole probe times out.
  const auto timed_out =
      RunCommand(absl::StrCat(kBinary, " probe --timeout 1 --port ", slow.port(), " 2>&1"));
  EXPECT_EQ(timed_out.exit_code, 1) << timed_out.output;
  EXPECT_THAT(timed_out.output, HasSubstr("Connection timed out"));
  TrickleServer large(ok + std::string(100 << 10, 'x'), 16 << 10, std::chrono::milliseconds(0));
  const auto oversized = RunCommand(absl::StrCat(kBinary, " probe --port ", large.port(), " 2>&1"));
  EXPECT_EQ(oversized.exit_code, 1) << oversized.output.substr(0, 200);
  EXPECT_THAT(oversized.output, HasSubstr("answered more than 65536 bytes"));
  TrickleServer plain(ok, 4, std::chrono::milliseconds(0));
  const auto answered = RunCommand(absl::StrCat(kBinary, " probe --port ", plain.port(), " 2>&1"));
  EXPECT_EQ(answered.exit_code, 0) << answered.output;
  EXPECT_EQ(answered.output, "ok\n");
}

// Fine-tuning: a checkpoint exported in the HF layout (BF16) seeds a new job
// (drafter.init_from), which starts where the first one was instead of from scratch; a drafter of
// another shape is refused naming the field.
TEST(FineTuneTest, AnExportedCheckpointSeedsANewJobThatContinuesFromIt) {
  flashdraft::testing::TempDir dir;
  auto made = RunCommand(absl::StrCat(kBinary, " make-shards --out ", dir.Join("shards"),
                                      " --samples 48 --seq 64 --vocab 48 --hidden 32 --seed 4"));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto job = [&](const std::string& name, const std::string& extra) {
    const std::string path = dir.Join(name + ".yaml");
    EXPECT_TRUE(WriteFileAtomically(
                    path, absl::StrCat("output_dir: ", dir.Join(name),
                                       "\ndrafter: {block_size: 8, num_target_features: 2, "
                                       "max_anchors: 8",
                                       extra.find("num_hidden_layers") == std::string::npos
                                           ? ", num_hidden_layers: 1"
                                           : "",
                                       extra, "}\ndata: {source: shards, shards_dir: ",
                                       dir.Join("shards"), ", max_seq_len: 64}\n",
                                       "train: {seed: 1, max_steps: 40, global_batch_size: 6, "
                                       "learning_rate: 0.003}\ncheckpoint: {every_steps: 30}\n"))
                    .ok());
    return path;
  };
  auto first = RunCommand(absl::StrCat(kBinary, " launch ", job("first", ""), " --workers 1"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto exported = RunCommand(absl::StrCat(kBinary, " export --checkpoint ",
                                          dir.Join("first/checkpoints/step-00000030"), " --out ",
                                          dir.Join("after30")));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;

  auto tuned = RunCommand(absl::StrCat(
      kBinary, " launch ", job("tuned", ", init_from: " + dir.Join("after30")), " --workers 1"));
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  EXPECT_THAT(tuned.output, HasSubstr("starts from " + dir.Join("after30")));
  const auto a = ::flashdraft::testing::ReadSteps(dir.Join("first/steps.jsonl"));
  const auto b = ::flashdraft::testing::ReadSteps(dir.Join("tuned/steps.jsonl"));
  ASSERT_EQ(a.size(), 40u);
  ASSERT_EQ(b.size(), 40u);
  const double fresh = a[0]["loss"].get<double>(), trained = a[29]["loss"].get<double>();
  ASSERT_LT(trained, fresh - 0.5) << "the first job must learn for the test to mean anything";
  // The seeded job starts at least halfway down the first job's curve (other batches, BF16
  // weights).
  EXPECT_LT(b[0]["loss"].get<double>(), (fresh + trained) / 2)
      << "fresh " << fresh << ", after 30 steps " << trained;

  auto wrong = RunCommand(absl::StrCat(
      kBinary, " launch ",
      job("wrong", ", num_hidden_layers: 2, init_from: " + dir.Join("after30")), " --workers 1"));
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_THAT(wrong.output, HasSubstr("after30/config.json: num_hidden_layers is 1 but the job's "
                                      "drafter has 2"));
}

}  // namespace
}  // namespace flashdraft
