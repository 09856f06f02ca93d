// The distributed system as users run it: real coordinator and worker processes, real gRPC on
// loopback (port 0), real Gloo.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "common/tensor_codec.h"
#include "flashdraft/v1/coordinator.grpc.pb.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::HttpGet;
using ::flashdraft::testing::RunCommand;
using ::flashdraft::testing::ShellQuote;
using ::flashdraft::testing::StartProcess;
using ::flashdraft::testing::TempDir;
using ::testing::HasSubstr;

const std::string kBin = FLASHDRAFT_BIN_DIR;

std::string JobYaml(const std::string& shards, const std::string& out, int steps) {
  ::flashdraft::testing::SmallJob job;
  job.output_dir = out;
  job.shards_dir = shards;
  job.max_steps = steps;
  job.learning_rate = 0.01;
  job.extra =
      "cluster: {heartbeat_interval_seconds: 1, heartbeat_timeout_seconds: 60, "
      "join_timeout_seconds: 60, collective_timeout_seconds: 60}\n"
      "checkpoint: {every_steps: 10, keep_last: 5}\n";
  return ::flashdraft::testing::SmallJobYaml(job);
}

using ::flashdraft::testing::FindProcess;
using ::flashdraft::testing::FirstDifferentStep;
using ::flashdraft::testing::ReadEvents;
using ::flashdraft::testing::ReadSteps;

class DistributedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto r = RunCommand(absl::StrCat(kBin, "/flashdraft make-shards --out ", dir_->Join("shards"),
                                     " --samples 96 --seq 64 --vocab 48 --hidden 32 --seed 2"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_TRUE(WriteFileAtomically(dir_->Join("job.yaml"),
                                    JobYaml(dir_->Join("shards"), dir_->Join("run"), 30))
                    .ok());
    // The 2-worker run is secured as docs/SECURITY.md says: mutual TLS and the job secret, with
    // certificates from deploy/make-certs.sh (its numbers must still be the other runs').
    const std::string pki = dir_->Join("pki");
    r = RunCommand(absl::StrCat(FLASHDRAFT_SOURCE_DIR, "/deploy/make-certs.sh ", pki));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_TRUE(WriteFileAtomically(
                    dir_->Join("job-secure.yaml"),
                    absl::StrCat(JobYaml(dir_->Join("shards"), dir_->Join("run"), 30),
                                 "security: {tls_cert: ", pki, "/coordinator.pem, tls_key: ", pki,
                                 "/coordinator.key, tls_ca: ", pki, "/ca.pem, client_cert: ", pki,
                                 "/worker.pem, client_key: ", pki, "/worker.key, token_file: ", pki,
                                 "/token}\n"))
                    .ok());
    for (int workers : {1, 2, 3}) {
      const char* job = workers == 2 ? "job-secure.yaml" : "job.yaml";
      auto run =
          RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir_->Join(job), " --workers ",
                                  workers, " --out ", dir_->Join(absl::StrCat("run", workers))));
      outputs_[workers] = run.output;
      exit_codes_[workers] = run.exit_code;
    }
  }
  static void TearDownTestSuite() { delete dir_; }

  static TempDir* dir_;
  static std::map<int, std::string> outputs_;
  static std::map<int, int> exit_codes_;
};
TempDir* DistributedTest::dir_ = nullptr;
std::map<int, std::string> DistributedTest::outputs_;
std::map<int, int> DistributedTest::exit_codes_;

TEST_F(DistributedTest, TwoWorkerProcessesTrainAndTheLossFalls) {
  ASSERT_EQ(exit_codes_[2], 0) << outputs_[2];
  EXPECT_THAT(outputs_[2], HasSubstr("[coordinator]"));
  EXPECT_THAT(outputs_[2], HasSubstr("[worker-1   ] "));
  EXPECT_THAT(outputs_[2], HasSubstr("job finished: 30 steps"));
  EXPECT_THAT(outputs_[2], HasSubstr("security: mutual TLS, job token"));
  auto steps = ReadSteps(dir_->Join("run2/steps.jsonl"));
  ASSERT_EQ(steps.size(), 30u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += steps[i]["loss"].get<double>() / 5;
    last += steps[25 + i]["loss"].get<double>() / 5;
  }
  EXPECT_LT(last, 0.8 * first) << "first " << first << " last " << last;
  for (const auto& s : steps) {
    EXPECT_EQ(s["world_size"], 2);
    EXPECT_GT(s["tokens"].get<int64_t>(), 0);
    EXPECT_EQ(s["slot_accuracy"].size(), 7u);
    EXPECT_TRUE(s.contains("tau_estimate"));
    EXPECT_TRUE(s["timings"].contains("allreduce"));
  }
  // Logs kept per process.
  EXPECT_TRUE(ReadFile(dir_->Join("run2/logs/worker-0.log")).ok());
  // The trained drafter, exported in the HF layout SGLang/vLLM load: trained tensors only, BF16.
  auto config = ReadFile(dir_->Join("run2/drafter/config.json"));
  ASSERT_TRUE(config.ok());
  auto json = nlohmann::json::parse(*config);
  EXPECT_EQ(json["architectures"][0], "DFlashDraftModel");
  EXPECT_EQ(json["dflash_config"]["block_size"], 8);
  auto weights = SafetensorsFile::Open(dir_->Join("run2/drafter/model.safetensors"));
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_TRUE((*weights)->GetChecked("layers.0.self_attn.q_proj.weight", DType::kBF16).ok());
  EXPECT_TRUE((*weights)->GetChecked("fc.weight", DType::kBF16, {32, 64}).ok());
  EXPECT_FALSE((*weights)->Contains("embed_tokens.weight"));
  EXPECT_FALSE((*weights)->Contains("lm_head.weight"));
}

// Bitwise world-size invariance (train.deterministic_reduction, on by default): 1, 2 and 3 workers
// write the same steps.jsonl numbers and export the same drafter, to the last bit.
TEST_F(DistributedTest, EveryStepIsTheSameBitsOnAnyNumberOfWorkers) {
  for (int w : {1, 2, 3}) ASSERT_EQ(exit_codes_[w], 0) << outputs_[w];
  auto one = ReadSteps(dir_->Join("run1/steps.jsonl"));
  ASSERT_EQ(one.size(), 30u);
  for (int w : {2, 3}) {
    auto other = ReadSteps(dir_->Join(absl::StrCat("run", w, "/steps.jsonl")));
    EXPECT_EQ(FirstDifferentStep(one, other), "") << "1 vs " << w << " workers";
    EXPECT_EQ(other[0]["world_size"], w);
    auto a = ReadFile(dir_->Join("run1/drafter/model.safetensors"));
    auto b = ReadFile(dir_->Join(absl::StrCat("run", w, "/drafter/model.safetensors")));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(*a == *b) << "the exported drafters of 1 and " << w << " workers differ";
  }
}

// train.precision: bf16 through the whole system (the job file, the workers' drafters): the run
// finishes, every step's loss is within 3% of the fp32 run's, and the deterministic reduction
// still makes 1 and 2 workers the same bits.
TEST_F(DistributedTest, Bf16TrainingFollowsFp32AndKeepsTheBits) {
  ASSERT_EQ(exit_codes_[1], 0) << outputs_[1];
  for (int workers : {1, 2}) {
    auto run = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir_->Join("job.yaml"),
                                       " --workers ", workers, " --set train.precision=bf16 --out ",
                                       dir_->Join(absl::StrCat("bf16-", workers))));
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  auto fp32 = ReadSteps(dir_->Join("run1/steps.jsonl"));
  auto bf16 = ReadSteps(dir_->Join("bf16-1/steps.jsonl"));
  ASSERT_EQ(bf16.size(), fp32.size());
  bool differs = false;
  for (size_t i = 0; i < fp32.size(); ++i) {
    const double a = fp32[i]["loss"].get<double>(), b = bf16[i]["loss"].get<double>();
    EXPECT_NEAR(b, a, 0.03 * a) << "step " << i;
    differs = differs || a != b;
  }
  EXPECT_TRUE(differs) << "bf16 gave fp32's exact losses: it did not compute in bf16";
  EXPECT_EQ(FirstDifferentStep(bf16, ReadSteps(dir_->Join("bf16-2/steps.jsonl"))), "");
}

// Checkpoints every 10 steps; a job resumed from the one after step 10 — with another number of
// workers — trains steps 10..29 to the same bits as the run that never stopped, and steps.jsonl
// reads as one run. A damaged checkpoint stops the resume with the file named.
TEST_F(DistributedTest, ResumesExactlyFromACheckpoint) {
  ASSERT_EQ(exit_codes_[2], 0) << outputs_[2];
  for (const char* step : {"step-00000010", "step-00000020", "step-00000030"}) {
    EXPECT_TRUE(std::filesystem::exists(dir_->Join(absl::StrCat("run2/checkpoints/", step))))
        << step;
  }
  const std::string resumed = dir_->Join("resumed");
  std::filesystem::create_directories(resumed + "/checkpoints");
  std::filesystem::copy(dir_->Join("run2/checkpoints/step-00000010"),
                        resumed + "/checkpoints/step-00000010");
  std::filesystem::copy_file(dir_->Join("run2/steps.jsonl"), resumed + "/steps.jsonl");
  auto run = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir_->Join("job.yaml"),
                                     " --workers 1 --resume --out ", resumed));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("resuming from"));
  auto straight = ReadSteps(dir_->Join("run2/steps.jsonl"));
  auto again = ReadSteps(resumed + "/steps.jsonl");
  ASSERT_EQ(straight.size(), 30u);
  ASSERT_EQ(again.size(), 30u);
  for (size_t i = 0; i < 30; ++i) EXPECT_EQ(again[i]["step"], i);
  // To the bit, although the resumed run has another number of workers.
  EXPECT_EQ(FirstDifferentStep(straight, again), "");
  EXPECT_TRUE(*ReadFile(dir_->Join("run2/drafter/model.safetensors")) ==
              *ReadFile(resumed + "/drafter/model.safetensors"));
  EXPECT_EQ(again[9]["world_size"], 2);   // kept from the first run
  EXPECT_EQ(again[10]["world_size"], 1);  // trained again after the resume

  // A fresh run into that directory would prune its checkpoints: refused. So is resuming it as
  // another job (another seed).
  run = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir_->Join("job.yaml"),
                                " --workers 1 --out ", resumed));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.output, HasSubstr("holds checkpoints of an earlier run"));
  run = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir_->Join("job.yaml"),
                                " --workers 1 --resume --set train.seed=9 --out ", resumed));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.output, HasSubstr("was written by another job"));

  const std::string damaged = dir_->Join("damaged");
  std::filesystem::create_directories(damaged + "/checkpoints");
  std::filesystem::copy(dir_->Join("run2/checkpoints/step-00000020"),
                        damaged + "/checkpoints/step-00000020");
  ASSERT_TRUE(
      WriteFileAtomically(damaged + "/checkpoints/step-00000020/model.safetensors", "x").ok());
  run = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir_->Join("job.yaml"),
                                " --workers 1 --resume --out ", damaged));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.output, HasSubstr("step-00000020/model.safetensors: CRC-32C"));

  // `flashdraft export` of the last checkpoint is the job's own export, byte for byte; a damaged
  // checkpoint and a directory that is none are refused, naming them.
  run = RunCommand(absl::StrCat(kBin, "/flashdraft export --checkpoint ",
                                dir_->Join("run2/checkpoints/step-00000030/"), " --out ",
                                dir_->Join("exported")));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("after step 30"));
  EXPECT_TRUE(*ReadFile(dir_->Join("run2/drafter/model.safetensors")) ==
              *ReadFile(dir_->Join("exported/model.safetensors")));
  EXPECT_EQ(*ReadFile(dir_->Join("run2/drafter/config.json")),
            *ReadFile(dir_->Join("exported/config.json")));
  run = RunCommand(absl::StrCat(kBin, "/flashdraft export --checkpoint ", damaged,
                                "/checkpoints/step-00000020 --out ", dir_->Join("x")));
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.output, HasSubstr("step-00000020/model.safetensors: CRC-32C"));
  run = RunCommand(absl::StrCat(kBin, "/flashdraft export --checkpoint ", dir_->Join("run2"),
                                " --out ", dir_->Join("x")));
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.output, HasSubstr("run2: not a checkpoint directory"));
  EXPECT_FALSE(std::filesystem::exists(dir_->Join("x")));
}

using ::flashdraft::testing::CoordinatorProcess;

TEST_F(DistributedTest, JoinRefusesOtherProtocolVersionsAndModelShapes) {
  CoordinatorProcess coordinator(kBin, dir_->Join("job.yaml"));
  ASSERT_GT(coordinator.port(), 0);
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", coordinator.port()), grpc::InsecureChannelCredentials()));
  auto join = [&](const v1::JoinRequest& request) {
    grpc::ClientContext ctx;
    v1::JoinReply reply;
    EXPECT_TRUE(stub->Join(&ctx, request, &reply).ok());
    return reply;
  };
  v1::JoinRequest old;
  old.set_protocol_version(99);
  old.set_worker_id("old");
  v1::JoinReply r = join(old);
  EXPECT_FALSE(r.accepted());
  EXPECT_THAT(r.reason(), HasSubstr(absl::StrCat("protocol version 99 is not this coordinator's "
                                                 "version ",
                                                 static_cast<int>(v1::PROTOCOL_VERSION_CURRENT))));

  v1::JoinRequest shaped;
  shaped.set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
  shaped.mutable_model_shape()->set_hidden_size(7);
  r = join(shaped);
  EXPECT_FALSE(r.accepted());
  EXPECT_THAT(r.reason(), HasSubstr("model shape differs from the job's: hidden_size 7 != 32"));

  // A worker that cannot form the job's collective (Gloo here) is refused, naming both.
  v1::JoinRequest nccl_only;
  nccl_only.set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
  nccl_only.mutable_capability()->set_backend("nccl");
  r = join(nccl_only);
  EXPECT_FALSE(r.accepted());
  EXPECT_THAT(r.reason(), HasSubstr("the job sums gradients over gloo (cluster.backend) and this "
                                    "worker has only 'nccl'"));

  // A worker must say how it computes (Capability.numerics), in printable text.
  v1::JoinRequest silent;
  silent.set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
  r = join(silent);
  EXPECT_FALSE(r.accepted());
  EXPECT_THAT(r.reason(), HasSubstr("the worker did not report its numeric environment"));
  silent.mutable_capability()->mutable_numerics()->set_blas_core("Has\nwell");
  r = join(silent);
  EXPECT_FALSE(r.accepted());
  EXPECT_THAT(r.reason(),
              HasSubstr("Capability.numerics: blas_core must be at most 256 printable"));

  // An unknown session token gets nothing from the store.
  grpc::ClientContext ctx;
  v1::StoreRequest store;
  store.set_session_token("forged");
  store.mutable_get()->set_key("x");
  v1::StoreReply reply;
  EXPECT_EQ(stub->Store(&ctx, store, &reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // The coordinator binary (it links LibTorch, whose static TLS once broke prometheus-cpp's
  // server threads) serves /metrics on the port it wrote next to its output.
  std::ifstream metrics_port_file(dir_->Join("run/metrics.port"));
  int metrics_port = 0;
  ASSERT_TRUE(metrics_port_file >> metrics_port);
  auto scrape = HttpGet(metrics_port, "/metrics");
  ASSERT_TRUE(scrape.ok()) << scrape.status();
  EXPECT_EQ(scrape->status, 200);
  EXPECT_THAT(scrape->body, HasSubstr("flashdraft_build_info{"));
  EXPECT_THAT(scrape->body, HasSubstr("flashdraft_step 0\n"));
  EXPECT_THAT(scrape->body, HasSubstr("flashdraft_steps 30\n"));
  EXPECT_THAT(scrape->body, HasSubstr("flashdraft_workers{state=\"training\"} 0\n"));
  EXPECT_THAT(scrape->body, HasSubstr("flashdraft_slot_accuracy{position=\"7\"}"));

  // `flashdraft status` asks the same service.
  auto status = RunCommand(absl::StrCat(kBin, "/flashdraft status 127.0.0.1:", coordinator.port()));
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("state waiting  step 0/30  workers 0"));

  // Stopped before any worker joined: a clean, non-zero exit.
  EXPECT_EQ(coordinator.Terminate(), 1);
}

// FetchTensors gives a joined worker the frozen target tensors and the drafter's starting weights
// (the file the coordinator wrote, byte for byte, as "drafter." + name); unknown names are refused.
TEST_F(DistributedTest, FetchTensorsServesFrozenTensorsAndStartingWeights) {
  CoordinatorProcess coordinator(kBin, dir_->Join("job.yaml"));
  ASSERT_GT(coordinator.port(), 0);
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", coordinator.port()), grpc::InsecureChannelCredentials()));
  v1::JoinRequest join;
  join.set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
  join.set_worker_id("fetcher");
  join.mutable_capability()->mutable_numerics()->set_torch("a test client");
  v1::JoinReply joined;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Join(&ctx, join, &joined).ok());
  }
  ASSERT_TRUE(joined.accepted()) << joined.reason();
  auto fetch = [&](const std::vector<std::string>& names, std::vector<v1::TensorChunk>* chunks) {
    grpc::ClientContext ctx;
    v1::FetchTensorsRequest request;
    request.set_session_token(joined.session_token());
    for (const auto& n : names) request.add_names(n);
    auto reader = stub->FetchTensors(&ctx, request);
    v1::TensorChunk chunk;
    while (reader->Read(&chunk)) chunks->push_back(chunk);
    return reader->Finish();
  };
  std::vector<v1::TensorChunk> chunks;
  ASSERT_TRUE(fetch({}, &chunks).ok());
  std::vector<const v1::TensorChunk*> pointers;
  for (const auto& c : chunks) pointers.push_back(&c);
  auto tensors = DecodeTensors(pointers);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  auto weights = SafetensorsModel::Open(dir_->Join("run/initial_weights.safetensors"));
  ASSERT_TRUE(weights.ok()) << weights.status();
  std::vector<std::string> want = {"embed_tokens.weight", "lm_head.weight"};
  for (const auto& name : (*weights)->names()) want.push_back("drafter." + name);
  std::vector<std::string> got;
  for (const auto& t : *tensors) {
    got.push_back(t.spec.name);
    if (t.spec.name.rfind("drafter.", 0) != 0) continue;
    auto view = (*weights)->Get(t.spec.name.substr(8));
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(t.spec.dtype, DType::kF32);
    EXPECT_EQ(t.bytes, std::vector<uint8_t>(view->data, view->data + view->nbytes)) << t.spec.name;
  }
  EXPECT_EQ(got, want);
  EXPECT_GE(want.size(), 6u);  // fc, norms and the layer's projections at least

  chunks.clear();
  grpc::Status missing = fetch({"drafter.layers.9.nope"}, &chunks);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(missing.error_message(), HasSubstr("no tensor 'drafter.layers.9.nope'"));
  EXPECT_NE(coordinator.Terminate(), 0);
}

TEST(LaunchTest, BadInputFailsClearly) {
  TempDir dir;
  ASSERT_TRUE(
      WriteFileAtomically(dir.Join("job.yaml"), JobYaml(dir.Join("missing"), dir.Join("run"), 5))
          .ok());
  auto r =
      RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir.Join("job.yaml"), " --workers 1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("missing/manifest.json: cannot open"));
  r = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir.Join("job.yaml"), " --workers 0"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--workers must be >= 1"));
  // NCCL where the worker cannot run it (no GPU path, or no GPU) is refused before anything
  // starts, not silently replaced by Gloo.
  const auto probe = RunCommand(absl::StrCat(kBin, "/flashdraft-worker --probe"));
  ASSERT_EQ(probe.exit_code, 0) << probe.output;
  ASSERT_THAT(probe.output, HasSubstr("backends: gloo"));
  if (probe.output.find("cuda_devices: 0") == std::string::npos) {
    GTEST_SKIP() << "a GPU is usable here; the refusal is checked on machines without one";
  }
  r = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir.Join("job.yaml"),
                              " --workers 1 --set cluster.backend=nccl"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("cluster.backend nccl needs a"));
  r = RunCommand(absl::StrCat(kBin, "/flashdraft launch ", dir.Join("job.yaml"),
                              " --workers 1 --set cluster.backend=nccl --set worker.device=cuda"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("worker.device cuda needs a flashdraft-worker linked against a "
                                  "CUDA LibTorch"));
}

}  // namespace
}  // namespace flashdraft

namespace flashdraft {
namespace {

// Elastic membership: `kill -9` one of 3 workers while the job runs. The coordinator sees its
// stream break, starts a new epoch with the 2 survivors (new ranks, a new Gloo group under
// epoch/2), sends the uncommitted steps again, and the job finishes — with every step's numbers
// and the exported drafter equal, to the bit, to the run that had 1 worker throughout.
TEST_F(DistributedTest, AWorkerKilledMidRunChangesNoNumber) {
  ASSERT_EQ(exit_codes_[1], 0) << outputs_[1];
  const std::string out = dir_->Join("killed");
  std::filesystem::create_directories(out);
  const pid_t launch = StartProcess({kBin + "/flashdraft", "launch", dir_->Join("job.yaml"),
                                     "--workers", "3", "--out", out, "--max-restarts", "0"},
                                    out + ".log");
  ASSERT_GT(launch, 0);
  bool started = false;
  for (int i = 0; i < 3000 && !started; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    started = ReadSteps(out + "/steps.jsonl").size() >= 3;
  }
  ASSERT_TRUE(started) << *ReadFile(out + ".log");
  int port = 0;
  std::ifstream(out + "/coordinator.port") >> port;
  const pid_t victim =
      FindProcess({"flashdraft-worker", absl::StrCat("127.0.0.1:", port), "--id worker-1"});
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(launch, &status, 0), launch);
  const std::string log = *ReadFile(out + ".log");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
  const auto steps = ReadSteps(out + "/steps.jsonl");
  EXPECT_EQ(FirstDifferentStep(ReadSteps(dir_->Join("run1/steps.jsonl")), steps), "") << log;
  ASSERT_EQ(steps.size(), 30u);
  EXPECT_EQ(steps.front()["world_size"], 3);
  EXPECT_EQ(steps.back()["world_size"], 2) << "the worker was killed after the last step";
  const auto events = ReadEvents(out + "/steps.jsonl");
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.front()["world_size"], 3);
  EXPECT_EQ(events.back()["world_size"], 2);
  EXPECT_GT(events.back()["membership_epoch"].get<int>(), 1);
  EXPECT_TRUE(*ReadFile(dir_->Join("run1/drafter/model.safetensors")) ==
              *ReadFile(out + "/drafter/model.safetensors"));
}

// A worker whose OpenBLAS chose another kernel than the job's other workers is refused, naming
// the difference; when the job pins the kernel (train.blas_kernel), a worker started with another
// starts itself again with the job's and trains.
TEST_F(DistributedTest, AWorkerOfAnotherBlasKernelIsRefusedByName) {
  using ::flashdraft::testing::ProbeBlasKernel;
  const absl::StatusOr<std::string> mine = ProbeBlasKernel(kBin, "");  // this environment's
  ASSERT_TRUE(mine.ok()) << mine.status();
  if (mine->empty()) GTEST_SKIP() << "needs OpenBLAS (libopenblas0-pthread) behind LibTorch";
  const std::string other = *mine == "Prescott" ? "Core2" : "Prescott";
  ASSERT_EQ(ProbeBlasKernel(kBin, "OPENBLAS_CORETYPE=" + other).value_or(""), other)
      << "OpenBLAS did not take OPENBLAS_CORETYPE=" << other;
  const std::string out = dir_->Join("kernels");
  ::flashdraft::testing::SmallJob job;
  job.output_dir = out;
  job.shards_dir = dir_->Join("shards");
  job.max_steps = 100000;
  job.extra = "cluster: {max_workers: 2, heartbeat_interval_seconds: 1}\n";
  ASSERT_TRUE(WriteFileAtomically(out + ".yaml", ::flashdraft::testing::SmallJobYaml(job)).ok());
  CoordinatorProcess coordinator(kBin, out + ".yaml", out + "-coordinator.log");
  ASSERT_GT(coordinator.port(), 0);
  const std::string address = absl::StrCat("127.0.0.1:", coordinator.port());
  const pid_t first = StartProcess(
      {kBin + "/flashdraft-worker", "--coordinator", address, "--id", "first"}, out + "-first.log");
  bool joined = false;
  for (int i = 0; i < 600 && !joined; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    joined = !ReadEvents(out + "/steps.jsonl", "numerics").empty();
  }
  ASSERT_TRUE(joined) << *ReadFile(out + "-coordinator.log");
  const auto numerics = ReadEvents(out + "/steps.jsonl", "numerics").front();
  EXPECT_EQ(numerics["workers"]["blas_core"], *mine) << numerics.dump();
  auto r = RunCommand(absl::StrCat("OPENBLAS_CORETYPE=", other, " ", kBin,
                                   "/flashdraft-worker --coordinator ", address, " --id second"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr(absl::StrCat("refused by the coordinator: its numeric environment "
                                     "differs from the job's other workers' (blas_core '",
                                     other, "' != '", *mine, "')")));
  kill(first, SIGKILL);
  waitpid(first, nullptr, 0);
  coordinator.Terminate();

  // Pinned: the worker started with another kernel joins with the job's after one restart.
  const std::string pinned = dir_->Join("pinned");
  job.output_dir = pinned;
  job.max_steps = 12;
  job.blas_kernel = *mine;
  job.extra.clear();
  ASSERT_TRUE(WriteFileAtomically(pinned + ".yaml", ::flashdraft::testing::SmallJobYaml(job)).ok());
  CoordinatorProcess pinned_coordinator(kBin, pinned + ".yaml", pinned + "-coordinator.log");
  ASSERT_GT(pinned_coordinator.port(), 0);
  r = RunCommand(absl::StrCat(
      "OPENBLAS_CORETYPE=", other, " ", kBin,
      "/flashdraft-worker --coordinator 127.0.0.1:", pinned_coordinator.port(), " --id pinned"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("OpenBLAS chose the kernel '", other,
                                               "' and the job pins '", *mine,
                                               "' (train.blas_kernel): starting again with "
                                               "OPENBLAS_CORETYPE=",
                                               *mine)));
  EXPECT_EQ(pinned_coordinator.Wait(60), 0) << *ReadFile(pinned + "-coordinator.log");
  EXPECT_EQ(ReadSteps(pinned + "/steps.jsonl").size(), 12u);
  EXPECT_EQ(ReadEvents(pinned + "/steps.jsonl", "numerics").front()["workers"]["blas_core"], *mine);

  // cluster.mixed_numerics: admit lets both in, and every record says the job is no longer
  // reproducible to the bit: the event, each step, the checkpoint.
  const std::string mixed = dir_->Join("mixed");
  job.output_dir = mixed;
  job.blas_kernel.clear();
  job.extra = "cluster: {min_workers: 2, max_workers: 2, mixed_numerics: admit}\n";
  ASSERT_TRUE(WriteFileAtomically(mixed + ".yaml", ::flashdraft::testing::SmallJobYaml(job)).ok());
  CoordinatorProcess mixed_coordinator(kBin, mixed + ".yaml", mixed + "-coordinator.log");
  ASSERT_GT(mixed_coordinator.port(), 0);
  const std::string at = absl::StrCat("127.0.0.1:", mixed_coordinator.port());
  std::vector<pid_t> workers;
  for (const std::string& kernel : {std::string(), other}) {
    workers.push_back(StartProcess(
        {kBin + "/flashdraft-worker", "--coordinator", at, "--id", kernel.empty() ? "a" : "b"},
        mixed + "-" + (kernel.empty() ? "a" : "b") + ".log",
        kernel.empty() ? std::vector<std::string>{}
                       : std::vector<std::string>{"OPENBLAS_CORETYPE=" + kernel}));
  }
  EXPECT_EQ(mixed_coordinator.Wait(60), 0) << *ReadFile(mixed + "-coordinator.log");
  for (pid_t w : workers) waitpid(w, nullptr, 0);
  const auto events = ReadEvents(mixed + "/steps.jsonl", "numerics");
  ASSERT_EQ(events.size(), 2u) << *ReadFile(mixed + "/steps.jsonl");
  EXPECT_EQ(events[1]["reproducible"], false);
  EXPECT_THAT(events[1]["mixed"].get<std::string>(), HasSubstr("blas_core"));
  const auto steps = ReadSteps(mixed + "/steps.jsonl");
  ASSERT_EQ(steps.size(), 12u);
  for (const auto& step : steps) EXPECT_EQ(step["reproducible"], false) << step.dump();
  const auto manifest =
      nlohmann::json::parse(*ReadFile(mixed + "/checkpoints/step-00000012/checkpoint.json"));
  EXPECT_EQ(manifest["numerics"]["mixed"], true) << manifest.dump();
  EXPECT_EQ(manifest["numerics"]["precision"], "fp32");
}

TEST_F(DistributedTest, CtrlCStopsEveryProcess) {
  const std::string out = dir_->Join("interrupted");
  ASSERT_TRUE(
      WriteFileAtomically(dir_->Join("long.yaml"), JobYaml(dir_->Join("shards"), out, 100000))
          .ok());
  const pid_t pid = fork();
  if (pid == 0) {
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, STDOUT_FILENO);
    dup2(devnull, STDERR_FILENO);
    execl((kBin + "/flashdraft").c_str(), "flashdraft", "launch", dir_->Join("long.yaml").c_str(),
          "--workers", "2", nullptr);
    _exit(127);
  }
  // Wait until training is under way.
  bool training = false;
  for (int i = 0; i < 600 && !training; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    training = ReadSteps(out + "/steps.jsonl").size() >= 3;
  }
  ASSERT_TRUE(training);
  std::ifstream port_in(out + "/coordinator.port");
  int port = 0;
  port_in >> port;
  ASSERT_GT(port, 0);
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  // Neither the coordinator nor any worker outlives the launcher.
  const std::string address = absl::StrCat("127.0.0.1:", port), job = out + "/job.yaml";
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    EXPECT_EQ(cmdline.find(address), std::string::npos) << "still running: " << cmdline;
    EXPECT_EQ(cmdline.find(job), std::string::npos) << "still running: " << cmdline;
  }
}

}  // namespace
}  // namespace flashdraft
