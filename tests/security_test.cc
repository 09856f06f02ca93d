// Transport security as users deploy it (docs/SECURITY.md): certificates made by
// deploy/make-certs.sh, a real coordinator process with mutual TLS and a job secret, real clients.
#include "common/security.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/file_util.h"
#include "common/raw_client_stream.h"
#include "flashdraft/v1/coordinator.grpc.pb.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::CoordinatorProcess;
using ::flashdraft::testing::FirstDifferentStep;
using ::flashdraft::testing::HttpGet;
using ::flashdraft::testing::ReadSteps;
using ::flashdraft::testing::ResidentBytes;
using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::StartProcess;
using ::flashdraft::testing::TempDir;
using ::testing::HasSubstr;

const std::string kBin = FLASHDRAFT_BIN_DIR;
const std::string kSource = FLASHDRAFT_SOURCE_DIR;

// Runs a shell command that must succeed.
void Must(const std::string& command) {
  auto r = RunCommand(command);
  ASSERT_EQ(r.exit_code, 0) << command << "\n" << r.output;
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    Must(absl::StrCat(kBin, "/flashdraft make-shards --out ", dir_->Join("shards"),
                      " --samples 24 --seq 64 --vocab 48 --hidden 32 --seed 2"));
    // This cluster's PKI, and another cluster's (whose certificates must not get in).
    Must(absl::StrCat(kSource, "/deploy/make-certs.sh ", Pki("")));
    Must(absl::StrCat(kSource, "/deploy/make-certs.sh ", dir_->Join("other")));
    // Certificates signed by this cluster's CA that expired yesterday.
    for (const char* name : {"expired-worker", "expired-coordinator"}) {
      Must(absl::StrCat("cd ", Pki(""), " && openssl req -newkey ec -pkeyopt ",
                        "ec_paramgen_curve:P-256 -nodes -keyout ", name, ".key -out ", name,
                        ".csr -subj /CN=", name, " 2>/dev/null && openssl x509 -req -in ", name,
                        ".csr -CA ca.pem -CAkey ca.key -CAcreateserial -days -1 -out ", name,
                        ".pem 2>/dev/null"));
    }
    // A wrong secret, correctly protected.
    Must(absl::StrCat("openssl rand -hex 32 > ", Pki("wrong-token"), " && chmod 600 ",
                      Pki("wrong-token")));
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string Pki(const std::string& name) {
    return name.empty() ? dir_->Join("pki") : dir_->Join("pki/" + name);
  }

  // A job on all interfaces (allowed: TLS and a token), with `security` lines added.
  static std::string WriteJob(const std::string& name, const std::string& security,
                              const std::string& cluster = "") {
    const std::string path = dir_->Join(name + ".yaml");
    ::flashdraft::testing::SmallJob job;
    job.name = name;
    job.output_dir = dir_->Join(name);
    job.shards_dir = dir_->Join("shards");
    job.max_steps = 4;
    job.extra = absl::StrCat("cluster: {listen: '0.0.0.0:0', join_timeout_seconds: 60", cluster,
                             "}\nsecurity:\n", security);
    const std::string yaml = ::flashdraft::testing::SmallJobYaml(job);
    EXPECT_TRUE(WriteFileAtomically(path, yaml).ok());
    return path;
  }
  static std::string SecureSection() {
    return absl::StrCat(
        "  tls_cert: ", Pki("coordinator.pem"), "\n  tls_key: ", Pki("coordinator.key"),
        "\n  tls_ca: ", Pki("ca.pem"), "\n  client_cert: ", Pki("worker.pem"),
        "\n  client_key: ", Pki("worker.key"), "\n  token_file: ", Pki("token"), "\n");
  }
  // The client of this cluster with everything right.
  static ClientSecurity Trusted() {
    ClientSecurity c;
    c.tls_ca = Pki("ca.pem");
    c.tls_cert = Pki("worker.pem");
    c.tls_key = Pki("worker.key");
    c.token_file = Pki("token");
    return c;
  }

  static TempDir* dir_;
};
TempDir* SecurityTest::dir_ = nullptr;

// Calls Status with `security`; the call's status.
grpc::Status CallStatus(int port, const ClientSecurity& security, v1::StatusReply* reply) {
  auto channel = CreateSecureChannel(absl::StrCat("127.0.0.1:", port), security);
  EXPECT_TRUE(channel.ok()) << channel.status();
  if (!channel.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "no channel");
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return v1::Coordinator::NewStub(*channel)->Status(&ctx, v1::StatusRequest(), reply);
}

TEST_F(SecurityTest, OnlyClientsWithTheClustersCertificatesAndTheJobSecretGetIn) {
  const std::string job = WriteJob("mtls", SecureSection());
  const std::string log = dir_->Join("mtls.log");
  CoordinatorProcess coordinator(kBin, job, log);
  ASSERT_GT(coordinator.port(), 0) << *ReadFile(log);
  const int port = coordinator.port();
  v1::StatusReply reply;

  // Everything right: in.
  grpc::Status s = CallStatus(port, Trusted(), &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reply.state(), "waiting");

  // A plaintext client, one without a client certificate, one with another cluster's, and one
  // that trusts another CA: no connection.
  ClientSecurity plaintext;
  plaintext.token_file = Pki("token");
  ClientSecurity no_cert = Trusted();
  no_cert.tls_cert = no_cert.tls_key = "";
  ClientSecurity other_cert = Trusted();
  other_cert.tls_cert = dir_->Join("other/worker.pem");
  other_cert.tls_key = dir_->Join("other/worker.key");
  ClientSecurity other_ca = Trusted();
  other_ca.tls_ca = dir_->Join("other/ca.pem");
  for (const ClientSecurity& c : {plaintext, no_cert, other_cert, other_ca}) {
    s = CallStatus(port, c, &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE)
        << c.tls_ca << " " << c.tls_cert << ": " << s.error_message();
  }

  // The right certificates without the job secret, or with a wrong one: UNAUTHENTICATED.
  ClientSecurity no_token = Trusted();
  no_token.token_file = "";
  ClientSecurity wrong_token = Trusted();
  wrong_token.token_file = Pki("wrong-token");
  for (const ClientSecurity& c : {no_token, wrong_token}) {
    s = CallStatus(port, c, &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  }

  // Every method checks the secret, streaming ones included.
  auto channel = CreateSecureChannel(absl::StrCat("127.0.0.1:", port), wrong_token);
  ASSERT_TRUE(channel.ok());
  auto stub = v1::Coordinator::NewStub(*channel);
  const std::vector<std::pair<std::string, std::function<grpc::Status(grpc::ClientContext*)>>>
      methods = {
          {"Join",
           [&](grpc::ClientContext* ctx) {
             v1::JoinRequest r;
             r.set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
             v1::JoinReply reply;
             return stub->Join(ctx, r, &reply);
           }},
          {"Store",
           [&](grpc::ClientContext* ctx) {
             v1::StoreRequest r;
             r.mutable_get()->set_key("x");
             v1::StoreReply reply;
             return stub->Store(ctx, r, &reply);
           }},
          {"Drain",
           [&](grpc::ClientContext* ctx) {
             v1::DrainRequest r;
             v1::DrainReply reply;
             return stub->Drain(ctx, r, &reply);
           }},
          {"FetchTensors",
           [&](grpc::ClientContext* ctx) {
             auto reader = stub->FetchTensors(ctx, v1::FetchTensorsRequest());
             v1::TensorChunk chunk;
             while (reader->Read(&chunk)) {
             }
             return reader->Finish();
           }},
          {"Train",
           [&](grpc::ClientContext* ctx) {
             auto stream = stub->Train(ctx);
             stream->Write(v1::WorkerMessage());
             stream->WritesDone();
             v1::CoordinatorMessage m;
             while (stream->Read(&m)) {
             }
             return stream->Finish();
           }},
      };
  for (const auto& [name, call] : methods) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    EXPECT_EQ(call(&ctx).error_code(), grpc::StatusCode::UNAUTHENTICATED) << name;
  }
  // The refusals are logged with the peer's address; the secret never is.
  const std::string text = *ReadFile(log);
  EXPECT_THAT(text, HasSubstr("refused a call from ipv4:127.0.0.1:"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr(*ReadFile(Pki("token")))));

  // `flashdraft status --job` takes the client side from the job's security section.
  auto status =
      RunCommand(absl::StrCat(kBin, "/flashdraft status 127.0.0.1:", port, " --job ", job));
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("state waiting"));
  status = RunCommand(absl::StrCat(kBin, "/flashdraft status 127.0.0.1:", port, " --tls-ca ",
                                   Pki("ca.pem"), " --tls-cert ", Pki("worker.pem"), " --tls-key ",
                                   Pki("worker.key")));
  EXPECT_EQ(status.exit_code, 1);
  EXPECT_THAT(status.output, HasSubstr("refused: no job token"));

  // /metrics says how the job is protected.
  int metrics_port = 0;
  std::ifstream(dir_->Join("mtls/metrics.port")) >> metrics_port;
  auto scrape = HttpGet(metrics_port, "/metrics");
  ASSERT_TRUE(scrape.ok()) << scrape.status();
  EXPECT_THAT(scrape->body, HasSubstr("security=\"mutual TLS, job token\""));
}

TEST_F(SecurityTest, BadFilesAreRefusedAtStartNamingTheFileAndTheFault) {
  struct Case {
    std::string name, security, want;
  };
  std::string token644 = Pki("token-644");
  Must(absl::StrCat("cp ", Pki("token"), " ", token644, " && chmod 644 ", token644));
  const std::string server = absl::StrCat("  tls_ca: ", Pki("ca.pem"), "\n");
  const std::vector<Case> cases = {
      {"expired",
       absl::StrCat(server, "  tls_cert: ", Pki("expired-coordinator.pem"), "\n  tls_key: ",
                    Pki("expired-coordinator.key"), "\n  token_file: ", Pki("token"), "\n"),
       "expired on"},
      {"mismatch",
       absl::StrCat(server, "  tls_cert: ", Pki("coordinator.pem"),
                    "\n  tls_key: ", Pki("worker.key"), "\n  token_file: ", Pki("token"), "\n"),
       "does not belong to the certificate"},
      {"not-pem",
       absl::StrCat(server, "  tls_cert: ", Pki("token"), "\n  tls_key: ", Pki("coordinator.key"),
                    "\n  token_file: ", Pki("token"), "\n"),
       "holds no PEM certificate"},
      {"missing",
       absl::StrCat(server, "  tls_cert: ", Pki("nope.pem"), "\n  tls_key: ",
                    Pki("coordinator.key"), "\n  token_file: ", Pki("token"), "\n"),
       "cannot read"},
      {"open-token",
       absl::StrCat(server, "  tls_cert: ", Pki("coordinator.pem"),
                    "\n  tls_key: ", Pki("coordinator.key"), "\n  token_file: ", token644, "\n"),
       "accessible by every user of this host (mode 644)"},
      {"plaintext", "  token_file: " + Pki("token") + "\n",
       "accepts connections from other hosts, which needs TLS and a job secret"},
  };
  for (const Case& c : cases) {
    const std::string job = WriteJob("bad-" + c.name, c.security);
    auto r = RunCommand(absl::StrCat(kBin, "/flashdraft-coordinator --job ", job));
    EXPECT_NE(r.exit_code, 0) << c.name;
    EXPECT_THAT(r.output, HasSubstr(c.want)) << c.name;
  }
  // A worker checks its own files before it connects.
  auto r = RunCommand(absl::StrCat(kBin, "/flashdraft-worker --coordinator 127.0.0.1:1 --tls-ca ",
                                   Pki("ca.pem"), " --tls-cert ", Pki("expired-worker.pem"),
                                   " --tls-key ", Pki("expired-worker.key")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("expired-worker.pem expired on"));
  // --job instead of the flags: the job file's faults are named, and the two do not mix.
  r = RunCommand(absl::StrCat(kBin, "/flashdraft-worker --coordinator 127.0.0.1:1 --job ",
                              dir_->Join("no-such-job.yaml")));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("no-such-job.yaml"));
  r = RunCommand(absl::StrCat(kBin, "/flashdraft-worker --coordinator 127.0.0.1:1 --job ",
                              WriteJob("worker-job", "  token_file: " + Pki("token") + "\n"),
                              " --token-file ", Pki("token")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("excludes"));
  // security.insecure: true lets a plaintext job listen on every interface, with a warning.
  const std::string insecure = WriteJob("insecure", "  insecure: true\n");
  auto check = RunCommand(absl::StrCat(kBin, "/flashdraft config check ", insecure));
  EXPECT_EQ(check.exit_code, 0) << check.output;
}

// Hostile input from a peer that holds the cluster's certificates and the job secret (an
// authenticated client gone wrong): each gets the right status and a useful message, the
// coordinator allocates nothing for claims it cannot check, and the job then trains to the same
// numbers as a job that never saw it.
TEST_F(SecurityTest, BadInputOverTheRealServerIsRefusedAndTheJobGoesOn) {
  const std::string job =
      WriteJob("hostile", SecureSection(),
               // The raw client reports a made-up numeric environment: the real worker after it
               // is let in all the same (and the job says so).
               ", heartbeat_interval_seconds: 0.5, heartbeat_timeout_seconds: 3, "
               "mixed_numerics: admit");
  auto reference = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", job, " --workers 1 --out ",
                                           dir_->Join("hostile-reference")));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const std::string log = dir_->Join("hostile.log");
  CoordinatorProcess coordinator(kBin, job, log);
  ASSERT_GT(coordinator.port(), 0) << *ReadFile(log);
  const std::string address = absl::StrCat("127.0.0.1:", coordinator.port());
  auto channel = CreateSecureChannel(address, Trusted());
  ASSERT_TRUE(channel.ok());
  auto stub = v1::Coordinator::NewStub(*channel);
  auto deadline = [](grpc::ClientContext& ctx, int seconds = 10) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  };

  // A Train stream that never says who it is is ended after the heartbeat timeout.
  grpc::Status silent_status;
  std::thread silent([&] {
    grpc::ClientContext ctx;
    deadline(ctx, 30);
    auto stream = stub->Train(&ctx);
    v1::CoordinatorMessage m;
    while (stream->Read(&m)) {
    }
    silent_status = stream->Finish();
  });

  // Joins: another protocol, ids that are not short printable text.
  auto join = [&](const std::string& id, uint32_t version = v1::PROTOCOL_VERSION_CURRENT) {
    grpc::ClientContext ctx;
    deadline(ctx);
    v1::JoinRequest r;
    r.set_protocol_version(version);
    r.set_worker_id(id);
    r.mutable_capability()->mutable_numerics()->set_torch("a test client");
    v1::JoinReply reply;
    EXPECT_TRUE(stub->Join(&ctx, r, &reply).ok());
    return reply;
  };
  EXPECT_THAT(join("old", 99).reason(), HasSubstr("protocol version 99"));
  EXPECT_THAT(join(std::string(1000, 'x')).reason(), HasSubstr("worker_id 'xxxx"));
  EXPECT_THAT(join("evil\nINFO forged log line").reason(),
              HasSubstr("must be at most 128 printable ASCII characters"));

  // A member that misbehaves.
  const v1::JoinReply member = join("intruder");
  ASSERT_TRUE(member.accepted()) << member.reason();
  const std::string token = member.session_token();

  // The store: values over its limit, messages over the server's, an unknown token.
  auto store_set = [&](const std::string& session, size_t value_bytes) {
    grpc::ClientContext ctx;
    deadline(ctx);
    v1::StoreRequest r;
    r.set_session_token(session);
    r.mutable_set()->set_key("epoch/1/x");
    r.mutable_set()->set_value(std::string(value_bytes, 'v'));
    v1::StoreReply reply;
    return stub->Store(&ctx, r, &reply);
  };
  EXPECT_TRUE(store_set(token, 100).ok());
  grpc::Status s = store_set(token, 2 << 20);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("store value of 2097152 bytes"));
  EXPECT_EQ(store_set(token, 5 << 20).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(store_set("forged", 10).error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // FetchTensors: names that do not exist or look like paths; the answer names no server path.
  {
    grpc::ClientContext ctx;
    deadline(ctx);
    v1::FetchTensorsRequest r;
    r.set_session_token(token);
    r.add_names("../../../../etc/passwd");
    auto reader = stub->FetchTensors(&ctx, r);
    v1::TensorChunk chunk;
    while (reader->Read(&chunk)) {
    }
    s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("no tensor '../../../../etc/passwd'"));
    EXPECT_THAT(s.error_message(), ::testing::Not(HasSubstr(dir_->path())));
  }

  // Train streams: an unknown session token; the member's token on a second stream.
  auto open_train = [&](const std::string& session, const v1::WorkerMessage* then = nullptr) {
    grpc::ClientContext ctx;
    deadline(ctx);
    auto stream = stub->Train(&ctx);
    v1::WorkerMessage hello;
    hello.set_session_token(session);
    hello.mutable_heartbeat();
    stream->Write(hello);
    if (then != nullptr) stream->Write(*then);
    stream->WritesDone();
    v1::CoordinatorMessage m;
    while (stream->Read(&m)) {
    }
    return stream->Finish();
  };
  EXPECT_EQ(open_train("forged").error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext member_ctx;
  RawClientStream stream(*channel, "/flashdraft.v1.Coordinator/Train", &member_ctx);
  auto send = [&](v1::WorkerMessage m) {
    m.set_worker_id("intruder");
    m.set_session_token(token);
    return stream.Write(MessageToBuffer(m));
  };
  ASSERT_TRUE(send([] {
    v1::WorkerMessage hello;
    hello.mutable_heartbeat();
    return hello;
  }()));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // bound before the second stream
  s = open_train(token);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();

  // Acks of a future step, of a stale epoch, twice: ignored (never counted for a step).
  for (const auto& [step, epoch] : {std::pair<uint64_t, uint64_t>{999, 1}, {0, 0}, {0, 0}}) {
    v1::WorkerMessage m;
    m.mutable_ack()->set_step(step);
    m.mutable_ack()->set_membership_epoch(epoch);
    EXPECT_TRUE(send(m));
  }
  // A checkpoint chunk nobody asked for, claiming a 1 TB tensor: nothing is allocated.
  const int64_t rss_before = ResidentBytes(coordinator.pid());
  {
    v1::WorkerMessage m;
    v1::TensorChunk* c = m.mutable_tensor_chunk();
    c->set_name("drafter.fc.weight");
    c->set_dtype(v1::U8);
    c->add_shape(int64_t{1} << 40);
    c->set_total_bytes(uint64_t{1} << 40);
    c->set_data("x");
    EXPECT_TRUE(send(m));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int64_t rss_after = ResidentBytes(coordinator.pid());
  EXPECT_GT(rss_before, 0);
  EXPECT_LT(rss_after - rss_before, int64_t{32} << 20) << rss_before << " -> " << rss_after;
  // Bytes that are not a WorkerMessage end the member's stream.
  const char garbage[] = "\xff\xff\xff\xff\x0f";
  grpc::Slice slice(garbage, sizeof(garbage) - 1);
  stream.Write(grpc::ByteBuffer(&slice, 1));
  grpc::ByteBuffer ignored;
  while (stream.Read(&ignored)) {
  }
  stream.WritesDone();
  s = stream.Finish();
  // (dropped from the job as failed, which ends its stream as ABORTED)
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("failed: sent a malformed WorkerMessage"));

  silent.join();
  EXPECT_EQ(silent_status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << silent_status.error_message();
  EXPECT_THAT(silent_status.error_message(), HasSubstr("no first message on the Train stream"));

  // A healthy worker now trains the job to the reference's numbers.
  const int worker =
      StartProcess({kBin + "/flashdraft-worker", "--coordinator", address, "--id", "healthy",
                    "--tls-ca", Pki("ca.pem"), "--tls-cert", Pki("worker.pem"), "--tls-key",
                    Pki("worker.key"), "--token-file", Pki("token")},
                   dir_->Join("hostile-worker.log"));
  EXPECT_EQ(coordinator.Wait(120), 0) << *ReadFile(log);
  int status = 0;
  waitpid(worker, &status, 0);
  EXPECT_EQ(FirstDifferentStep(ReadSteps(dir_->Join("hostile-reference/steps.jsonl")),
                               ReadSteps(dir_->Join("hostile/steps.jsonl"))),
            "");
}

}  // namespace
}  // namespace flashdraft
