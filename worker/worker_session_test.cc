// The worker's session protocol without a network: a fake Train stream (FakeLink) plays the
// coordinator, the collective is a real single-rank Gloo group over an in-process store, and the
// heartbeat logic runs on a FakeClock.
#include "worker/worker_session.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/chunk_wire.h"
#include "common/grpc_options.h"
#include "common/tensor_codec.h"
#include "coordinator/checkpoint_upload.h"
#include "coordinator/microbatch_packer.h"
#include "model/synthetic_data.h"
#include "model/wire_tensor.h"
#include "tests/support/test_util.h"
#include "worker/collective/gloo_collective.h"
#include "worker/leave_request.h"
#include "worker/training_state.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

// The coordinator's end of a Train stream, in memory.
class FakeLink : public CoordinatorLink {
 public:
  // --- the coordinator's side ---
  void Send(const v1::CoordinatorMessage& message) { SendBuffer(MessageToBuffer(message)); }
  void SendBuffer(grpc::ByteBuffer buffer) {
    absl::MutexLock lock(&mu_);
    incoming_.push_back(std::move(buffer));
  }
  // The coordinator ends the stream (its writes fail from now on too).
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // The first message written that `want` accepts; nullopt after 60 s.
  std::optional<v1::WorkerMessage> WaitFor(
      const std::function<bool(const v1::WorkerMessage&)>& want) {
    absl::MutexLock lock(&mu_);
    std::optional<v1::WorkerMessage> found;
    size_t seen = 0;  // messages already looked at
    const auto look = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (; seen < written_.size() && !found; ++seen) {
        if (want(written_[seen])) found = written_[seen];
      }
      return found.has_value();
    };
    mu_.AwaitWithTimeout(absl::Condition(&look), absl::Seconds(60));
    return found;
  }
  std::vector<v1::WorkerMessage> Written() {
    absl::MutexLock lock(&mu_);
    return written_;
  }

  // --- the worker's side ---
  bool Read(grpc::ByteBuffer* out) override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &FakeLink::Readable));
    if (ended_ || incoming_.empty()) return false;
    *out = std::move(incoming_.front());
    incoming_.pop_front();
    return true;
  }
  bool Write(const v1::WorkerMessage& message) override {
    absl::MutexLock lock(&mu_);
    if (closed_ || ended_) return false;
    written_.push_back(message);
    return true;
  }
  // The fake coordinator ends the stream when the worker half-closes, as the real one does.
  void WritesDone() override { End(); }
  void Cancel() override { End(); }
  void Finish() override {}

 private:
  void End() {
    absl::MutexLock lock(&mu_);
    ended_ = true;
  }
  bool Readable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !incoming_.empty() || closed_ || ended_;
  }

  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> incoming_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::WorkerMessage> written_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

v1::CoordinatorMessage ReformMessage(uint64_t epoch, uint64_t next_step) {
  v1::CoordinatorMessage m;
  v1::Reform* r = m.mutable_reform();
  r->set_membership_epoch(epoch);
  r->set_rank(0);
  r->set_world_size(1);
  r->set_store_prefix("epoch/" + std::to_string(epoch));
  r->set_next_step(next_step);
  return m;
}

v1::CoordinatorMessage CommitMessage(uint64_t step, uint64_t epoch, bool checkpoint) {
  v1::CoordinatorMessage m;
  m.mutable_commit()->set_step(step);
  m.mutable_commit()->set_membership_epoch(epoch);
  m.mutable_commit()->set_checkpoint(checkpoint);
  return m;
}

v1::CoordinatorMessage ShutdownMessage(bool finished) {
  v1::CoordinatorMessage m;
  m.mutable_shutdown()->set_reason(finished ? "trained every step" : "stopping");
  m.mutable_shutdown()->set_job_finished(finished);
  return m;
}

bool IsAck(const v1::WorkerMessage& m, uint64_t step, uint64_t epoch) {
  return m.has_ack() && m.ack().step() == step && m.ack().membership_epoch() == epoch;
}

// A tensor's chunks as the coordinator streams them (small chunks: several per tensor).
std::vector<grpc::ByteBuffer> ChunkBuffers(const std::string& name, const torch::Tensor& tensor) {
  torch::Tensor c = tensor.contiguous();
  auto spec = SpecOf(name, c);
  EXPECT_TRUE(spec.ok()) << spec.status();
  std::vector<grpc::ByteBuffer> buffers;
  if (!spec.ok()) return buffers;
  EXPECT_TRUE(EncodeTensorBuffers(*spec, c.data_ptr(), c.nbytes(), 1024,
                                  std::make_shared<torch::Tensor>(c), kCoordinatorMessageChunkField,
                                  &buffers)
                  .ok());
  return buffers;
}

constexpr int kShards = 2;  // train.virtual_shards
constexpr double kLearningRate = 1e-3;

// A tiny job of one rank over two virtual shards, its starting state, and the reference numbers of
// its first step computed here without any protocol.
class WorkerSessionTest : public ::testing::Test {
 protected:
  WorkerSessionTest()
      : lang_(MakeSyntheticLanguage(40, 64, 0.1, 3)),
        config_(SyntheticDrafterConfig(lang_, 4, 32, 1)) {
    torch::set_num_threads(1);
    job_.drafter.block_size = 4;
    job_.train.virtual_shards = kShards;
    job_.train.learning_rate = kLearningRate;
    job_.cluster.collective_timeout_seconds = 30;
    job_.cluster.heartbeat_interval_seconds = 0.05;
    job_.output_dir = dir_.path();
    SyntheticBatchOptions o;
    o.batch = 2;
    o.seq_len = 24;
    o.max_anchors = 4;
    for (int shard = 0; shard < kShards; ++shard)
      batches_.push_back(MakeSyntheticBatch(lang_, o, 1, shard));
    Drafter start(config_);
    start->InitWeights(5);
    auto [embed, head] = MakeSyntheticTarget(lang_, 32, 9);
    fetched_["embed_tokens.weight"] = embed;
    fetched_["lm_head.weight"] = head;
    for (const auto& p : start->named_parameters()) {
      fetched_[std::string(kDrafterWeightPrefix) + p.key()] = p.value().detach().clone();
    }
  }

  std::unique_ptr<WorkerSession> NewSession(
      SessionHooks hooks = {}, const std::string& metrics_address = "",
      c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>()) {
    SessionSetup setup;
    setup.metrics_address = metrics_address;
    setup.worker_id = "w0";
    setup.session_token = "token";
    setup.job = job_;
    setup.drafter_config = config_;
    setup.fetched = fetched_;
    setup.store = std::move(store);
    setup.collective_address = "127.0.0.1";
    auto session = WorkerSession::Create(std::move(setup), std::move(hooks));
    EXPECT_TRUE(session.ok()) << session.status();
    return session.ok() ? *std::move(session) : nullptr;
  }

  // The session's Run on a thread of its own.
  void Start(WorkerSession& session) {
    runner_ = std::thread([&] { result_ = session.Run(link_); });
  }
  absl::Status Join() {
    runner_.join();
    return result_;
  }

  double Gamma() const { return EffectiveLossDecayGamma(job_); }

  // The step's Σw over both shards.
  double WeightSum() {
    Drafter reference = Reference().second;
    double sum = 0;
    torch::NoGradGuard no_grad;
    for (const auto& b : batches_) sum += reference->Loss(b, Gamma()).weight_sum;
    return sum;
  }

  // A trainer at the starting state.
  std::pair<std::unique_ptr<DrafterTrainer>, Drafter> Reference() {
    Drafter d(config_);
    d->SetFrozen(fetched_.at("embed_tokens.weight"), fetched_.at("lm_head.weight"));
    torch::NoGradGuard no_grad;
    for (auto& p : d->named_parameters()) {
      p.value().copy_(fetched_.at(std::string(kDrafterWeightPrefix) + p.key()));
    }
    return {std::make_unique<DrafterTrainer>(d, OptimizerOptionsOf(job_)), d};
  }

  // Step `step`'s shards of `epoch`, as the coordinator streams them (without the tensor `omit`).
  void SendStep(uint64_t step, uint64_t epoch, double weight_sum, int num_shards = kShards,
                const std::string& omit = "") {
    for (int shard = 0; shard < kShards; ++shard) {
      const DrafterBatch& b = batches_[shard];
      v1::CoordinatorMessage m;
      v1::Microbatch* h = m.mutable_microbatch();
      h->set_step(step);
      h->set_membership_epoch(epoch);
      h->set_rank(0);
      h->set_world_size(1);
      h->set_global_weight_sum(weight_sum);
      h->set_learning_rate(kLearningRate);
      h->set_shard(shard);
      h->set_num_shards(num_shards);
      h->add_shard_offsets(0);
      h->add_shard_offsets(num_shards);
      h->set_num_tensors(omit.empty() ? 4 : 3);
      link_.Send(m);
      for (const auto& [name, t] : {std::pair<std::string, torch::Tensor>{"input_ids", b.input_ids},
                                    {"loss_mask", b.loss_mask},
                                    {"hidden_states", b.hidden_states},
                                    {"anchors", b.anchors}}) {
        if (name == omit) continue;
        for (auto& buffer : ChunkBuffers(name, t)) link_.SendBuffer(std::move(buffer));
      }
    }
  }

  testing::TempDir dir_;
  SyntheticLanguage lang_;
  DrafterModelConfig config_;
  JobConfig job_;
  std::vector<DrafterBatch> batches_;
  std::map<std::string, torch::Tensor> fetched_;
  FakeLink link_;
  std::thread runner_;
  absl::Status result_;
};

TEST_F(WorkerSessionTest, TrainsAStepAppliesItAtTheCommitUploadsTheCheckpointAndExports) {
  auto session = NewSession();
  ASSERT_NE(session, nullptr);
  const double weight_sum = WeightSum();
  // The reference: both shards' gradients over the step's Σw, one AdamW step.
  auto [trainer, reference] = Reference();
  std::vector<double> losses;
  for (const auto& b : batches_) {
    DrafterLossResult r = reference->Loss(b, Gamma(), weight_sum);
    r.loss.backward();
    losses.push_back(r.weighted_ce_sum);
  }
  trainer->ApplyWithLearningRate(kLearningRate);

  Start(*session);
  link_.Send(ReformMessage(1, 0));
  SendStep(0, 1, weight_sum);
  auto ack = link_.WaitFor([](const v1::WorkerMessage& m) { return IsAck(m, 0, 1); });
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->worker_id(), "w0");
  EXPECT_EQ(ack->session_token(), "token");
  ASSERT_EQ(ack->ack().shards_size(), kShards);
  for (int k = 0; k < kShards; ++k) {
    EXPECT_EQ(ack->ack().shards(k).shard(), static_cast<uint32_t>(k));
    EXPECT_EQ(ack->ack().shards(k).weighted_loss_sum(), losses[k]);  // the same computation
    EXPECT_EQ(ack->ack().shards(k).slot_total_size(), job_.drafter.block_size - 1);
  }
  link_.Send(CommitMessage(0, 1, /*checkpoint=*/true));
  auto upload = link_.WaitFor([](const v1::WorkerMessage& m) { return m.has_checkpoint(); });
  ASSERT_TRUE(upload.has_value());
  EXPECT_EQ(upload->checkpoint().completed_steps(), 1u);
  const size_t params = reference->parameters().size();
  EXPECT_EQ(upload->checkpoint().num_tensors(), 3 * params + 1);  // weights, 2 moments, step
  link_.Send(ShutdownMessage(/*finished=*/true));
  ASSERT_TRUE(Join().ok()) << result_;

  // The upload's tensors all came before the end. The worker wrote nothing into the job's output
  // directory (the coordinator exports the drafter from the upload, on its own disk).
  size_t chunks = 0;
  for (const auto& m : link_.Written()) chunks += m.has_tensor_chunk();
  EXPECT_GE(chunks, 3 * params + 1);
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("drafter")));
  auto want = reference->named_parameters();
  for (const auto& p : session->drafter().named_parameters()) {
    EXPECT_TRUE(torch::allclose(p.value(), want[p.key()], 1e-5, 1e-7)) << p.key();
    EXPECT_FALSE(torch::equal(p.value(), fetched_.at(std::string(kDrafterWeightPrefix) + p.key())))
        << p.key() << " did not change";
  }
}

// The metrics a worker serves, recorded by the session: its place, each acked step's phases,
// what it received; the first message on the stream tells the coordinator where they are.
TEST_F(WorkerSessionTest, RecordsItsStepsIntoTheWorkersMetricsAndSaysWhereTheyAre) {
  WorkerMetrics metrics("cpu", "gloo");
  SessionHooks hooks;
  hooks.metrics = &metrics;
  auto session = NewSession(std::move(hooks), "10.0.0.7:9401");
  ASSERT_NE(session, nullptr);
  const double weight_sum = WeightSum();
  Start(*session);
  link_.Send(ReformMessage(3, 0));
  SendStep(0, 3, weight_sum);
  ASSERT_TRUE(link_.WaitFor([](const v1::WorkerMessage& m) { return IsAck(m, 0, 3); }));
  link_.Send(CommitMessage(0, 3, /*checkpoint=*/false));
  SendStep(1, 3, weight_sum);
  ASSERT_TRUE(link_.WaitFor([](const v1::WorkerMessage& m) { return IsAck(m, 1, 3); }));
  link_.Send(ShutdownMessage(/*finished=*/true));
  ASSERT_TRUE(Join().ok()) << result_;

  const std::vector<v1::WorkerMessage> written = link_.Written();
  ASSERT_FALSE(written.empty());
  ASSERT_TRUE(written.front().has_heartbeat());
  EXPECT_EQ(written.front().heartbeat().metrics_address(), "10.0.0.7:9401");
  const std::string text = metrics.Text();
  EXPECT_THAT(text, HasSubstr("\nflashdraft_worker_steps_total 2\n"));
  EXPECT_THAT(text, HasSubstr("\nflashdraft_worker_step 1\n"));
  EXPECT_THAT(text, HasSubstr("\nflashdraft_worker_rank 0\n"));
  EXPECT_THAT(text, HasSubstr("\nflashdraft_worker_membership_epoch 3\n"));
  EXPECT_THAT(text,
              HasSubstr("\nflashdraft_worker_phase_duration_seconds_count{phase=\"forward\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("\nflashdraft_worker_collective_errors_total 0\n"));
  EXPECT_THAT(text, HasSubstr("flashdraft_build_info{backend=\"gloo\""));
  EXPECT_THAT(text, HasSubstr("\nprocess_resident_memory_bytes "));
}

TEST_F(WorkerSessionTest, AReformBeforeTheCommitDropsTheStepAndStaleEpochsAreIgnored) {
  auto session = NewSession();
  ASSERT_NE(session, nullptr);
  const double weight_sum = WeightSum();
  Start(*session);
  link_.Send(ReformMessage(1, 0));
  SendStep(0, 1, weight_sum);
  auto first = link_.WaitFor([](const v1::WorkerMessage& m) { return IsAck(m, 0, 1); });
  ASSERT_TRUE(first.has_value());
  // A peer was lost before step 0 committed: epoch 2 re-forms and re-sends step 0. A late copy of
  // epoch 1's step and epoch 1's commit must change nothing.
  link_.Send(ReformMessage(2, 0));
  SendStep(0, 1, weight_sum);
  SendStep(0, 2, weight_sum);
  auto second = link_.WaitFor([](const v1::WorkerMessage& m) { return IsAck(m, 0, 2); });
  ASSERT_TRUE(second.has_value());
  // The dropped gradients left no trace: the re-sent step computes the very same numbers.
  for (int k = 0; k < kShards; ++k) {
    EXPECT_EQ(second->ack().shards(k).weighted_loss_sum(),
              first->ack().shards(k).weighted_loss_sum());
  }
  link_.Send(CommitMessage(0, 1, /*checkpoint=*/true));  // stale: ignored, nothing uploaded
  link_.Send(CommitMessage(0, 2, false));
  link_.Send(ShutdownMessage(/*finished=*/false));
  ASSERT_TRUE(Join().ok()) << result_;
  int acks = 0;
  for (const auto& m : link_.Written()) acks += m.has_ack();
  EXPECT_EQ(acks, 2);  // one per epoch: the stale microbatches were not computed
  for (const auto& m : link_.Written()) EXPECT_FALSE(m.has_checkpoint());

  // One step applied, not two.
  auto [trainer, reference] = Reference();
  for (const auto& b : batches_) reference->Loss(b, Gamma(), weight_sum).loss.backward();
  trainer->ApplyWithLearningRate(kLearningRate);
  auto want = reference->named_parameters();
  for (const auto& p : session->drafter().named_parameters()) {
    EXPECT_TRUE(torch::allclose(p.value(), want[p.key()], 1e-5, 1e-7)) << p.key();
  }
}

TEST_F(WorkerSessionTest, TheEndOfTheStreamIsUnavailableSoTheWorkerJoinsAgain) {
  auto session = NewSession();
  ASSERT_NE(session, nullptr);
  Start(*session);
  link_.Send(ReformMessage(1, 0));
  link_.Close();
  absl::Status s = Join();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("closed the Train stream"));
}

TEST_F(WorkerSessionTest, AMalformedMessageEndsTheSessionAndIsReported) {
  auto session = NewSession();
  ASSERT_NE(session, nullptr);
  Start(*session);
  link_.Send(ReformMessage(1, 0));
  const char garbage[] = "\xff\xff\xff\xff";
  grpc::Slice slice(garbage, 4);
  link_.SendBuffer(grpc::ByteBuffer(&slice, 1));
  absl::Status s = Join();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  auto error = link_.WaitFor([](const v1::WorkerMessage& m) { return !m.error().empty(); });
  ASSERT_TRUE(error.has_value());
  EXPECT_THAT(error->error(), HasSubstr("malformed CoordinatorMessage"));
}

TEST_F(WorkerSessionTest, AShardLayoutThatIsNotTheJobsIsFatal) {
  auto session = NewSession();
  ASSERT_NE(session, nullptr);
  Start(*session);
  link_.Send(ReformMessage(1, 0));
  SendStep(0, 1, 1.0, /*num_shards=*/3);
  absl::Status s = Join();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("shard layout"));
  EXPECT_TRUE(link_.WaitFor([](const v1::WorkerMessage& m) { return !m.error().empty(); }));
}

// A microbatch is looked up by the names the coordinator sends: one without its hidden states
// ends the session with an error that names the tensor, told to the coordinator.
TEST_F(WorkerSessionTest, AMicrobatchWithoutATensorEndsTheSessionNamingIt) {
  auto session = NewSession();
  ASSERT_NE(session, nullptr);
  Start(*session);
  link_.Send(ReformMessage(1, 0));
  SendStep(0, 1, WeightSum(), kShards, /*omit=*/"hidden_states");
  absl::Status s = Join();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("sent no 'hidden_states' tensor"));
  auto error = link_.WaitFor([](const v1::WorkerMessage& m) { return !m.error().empty(); });
  ASSERT_TRUE(error.has_value());
  EXPECT_THAT(error->error(), HasSubstr("'hidden_states'"));
  for (const auto& m : link_.Written()) EXPECT_FALSE(m.has_ack());
}

// Each epoch's group is formed by the injected factory, over the store under the epoch's prefix,
// as the rank and world of its Reform.
TEST_F(WorkerSessionTest, FormsEachEpochsGroupThroughTheInjectedFactory) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::pair<int, int>> formed;  // (rank, world); on the training thread until Join
  SessionHooks hooks;
  hooks.collective_factory =
      [&](c10::intrusive_ptr<c10d::Store> prefixed, int rank, int world,
          const AbortCheck& abort) -> absl::StatusOr<std::unique_ptr<Collective>> {
    formed.emplace_back(rank, world);
    prefixed->set("formed", {1});
    GlooOptions o;
    o.address = "127.0.0.1";
    return GlooCollective::Create(prefixed, rank, world, o, abort);
  };
  auto session = NewSession(std::move(hooks), "", store);
  ASSERT_NE(session, nullptr);
  const double weight_sum = WeightSum();
  Start(*session);
  link_.Send(ReformMessage(1, 0));
  SendStep(0, 1, weight_sum);
  ASSERT_TRUE(link_.WaitFor([](const v1::WorkerMessage& m) { return IsAck(m, 0, 1); }));
  link_.Send(ReformMessage(2, 0));
  SendStep(0, 2, weight_sum);
  ASSERT_TRUE(link_.WaitFor([](const v1::WorkerMessage& m) { return IsAck(m, 0, 2); }));
  link_.Send(ShutdownMessage(/*finished=*/false));
  ASSERT_TRUE(Join().ok()) << result_;
  EXPECT_EQ(formed, (std::vector<std::pair<int, int>>{{0, 1}, {0, 1}}));
  EXPECT_TRUE(store->check({"epoch/1/formed", "epoch/2/formed"}));
}

// A group that cannot form is a collective failure the coordinator hears of (it re-forms the
// group); the next epoch's group trains.
TEST_F(WorkerSessionTest, AGroupThatCannotFormIsReportedAndTheNextEpochTrains) {
  int calls = 0;
  SessionHooks hooks;
  hooks.collective_factory =
      [&](c10::intrusive_ptr<c10d::Store> store, int rank, int world,
          const AbortCheck& abort) -> absl::StatusOr<std::unique_ptr<Collective>> {
    if (++calls == 1) return absl::UnavailableError("peer 10.0.0.9 unreachable");
    return GlooCollective::Create(store, rank, world, GlooOptions{}, abort);
  };
  WorkerMetrics metrics("cpu", "gloo");
  hooks.metrics = &metrics;
  auto session = NewSession(std::move(hooks));
  ASSERT_NE(session, nullptr);
  const double weight_sum = WeightSum();
  Start(*session);
  link_.Send(ReformMessage(1, 5));
  auto failure =
      link_.WaitFor([](const v1::WorkerMessage& m) { return m.has_collective_failure(); });
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->collective_failure().step(), 5u);
  EXPECT_EQ(failure->collective_failure().membership_epoch(), 1u);
  EXPECT_THAT(failure->collective_failure().error(), HasSubstr("peer 10.0.0.9 unreachable"));
  link_.Send(ReformMessage(2, 0));
  SendStep(0, 2, weight_sum);
  ASSERT_TRUE(link_.WaitFor([](const v1::WorkerMessage& m) { return IsAck(m, 0, 2); }));
  link_.Send(ShutdownMessage(/*finished=*/false));
  ASSERT_TRUE(Join().ok()) << result_;
  EXPECT_EQ(calls, 2);
  EXPECT_THAT(metrics.Text(), HasSubstr("\nflashdraft_worker_collective_errors_total 1\n"));
}

// SIGTERM's LeaveRequest reaches the coordinator as a Leave, once.
TEST_F(WorkerSessionTest, ALeaveRequestIsToldToTheCoordinator) {
  LeaveRequest leave;
  SessionHooks hooks;
  hooks.leave = &leave;
  auto session = NewSession(std::move(hooks));
  ASSERT_NE(session, nullptr);
  Start(*session);
  link_.Send(ReformMessage(1, 0));
  ASSERT_TRUE(link_.WaitFor([](const v1::WorkerMessage& m) { return m.has_heartbeat(); }));
  for (const auto& m : link_.Written()) EXPECT_FALSE(m.has_leave());
  leave.Request();
  ASSERT_TRUE(link_.WaitFor([](const v1::WorkerMessage& m) { return m.has_leave(); }));
  link_.Send(ShutdownMessage(/*finished=*/false));
  ASSERT_TRUE(Join().ok()) << result_;
  int leaves = 0;
  for (const auto& m : link_.Written()) leaves += m.has_leave();
  EXPECT_EQ(leaves, 1);
}

TEST_F(WorkerSessionTest, StartingWeightsOfAnotherShapeAreRefused) {
  SessionSetup setup;
  setup.job = job_;
  setup.drafter_config = config_;
  setup.fetched = fetched_;
  setup.fetched.erase(std::string(kDrafterWeightPrefix) + "fc.weight");
  auto session = WorkerSession::Create(std::move(setup));
  ASSERT_FALSE(session.ok());
  EXPECT_THAT(std::string(session.status().message()), HasSubstr("drafter.fc.weight"));
}

// The inbox assembles microbatches from chunks and refuses a stream out of order.
// A checkpoint upload of tensors larger than one chunk (one of a size no multiple of the chunk
// size) arrives whole: every chunk carries the tensor's header (a real drafter's matrices are
// many chunks each; the second chunk once came without one and the checkpoint was refused).
// A snapshot's tensors, in chunks of the real size, reach the coordinator's receiving end
// (UploadReceiver) whole: tensors of 2 chunks and a part, of 1, of exactly 3, and of more than
// gRPC's message limit; every message, with the worker's id and token, fits what the coordinator
// accepts.
TEST(SendCheckpointTest, TensorsOfSeveralChunksArriveWhole) {
  const int64_t floats_per_chunk = kDefaultMaxChunkBytes / 4;
  NamedTensors tensors = {{"drafter.fc.weight", torch::randn({2 * floats_per_chunk + 123})},
                          {"drafter.norm.weight", torch::randn({7})},
                          {"adamw.fc.weight.exp_avg", torch::randn({3, floats_per_chunk})},
                          {"adamw.fc.weight.exp_avg_sq", torch::randn({4100, 4096})}};
  ASSERT_GT(tensors[3].second.nbytes(), static_cast<size_t>(kMaxMessageBytes));
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : tensors) {
    specs.push_back({name, FromTorchDType(t.scalar_type()).value(), t.sizes().vec()});
  }
  UploadReceiver receiver(specs);
  const std::string token(32, 't');
  receiver.Expect(token, 5);
  int chunks = 0;
  auto write = [&](v1::WorkerMessage& m) {
    m.set_worker_id(std::string(128, 'w'));  // as WorkerSession::Write sends it; ids are bounded
    m.set_session_token(token);
    // What the coordinator's Train stream reads, within the limit it sets.
    const std::string wire = m.SerializeAsString();
    EXPECT_LE(wire.size(), static_cast<size_t>(kMaxServerReceiveBytes));
    v1::WorkerMessage in;
    EXPECT_TRUE(in.ParseFromString(wire));
    chunks += in.has_tensor_chunk();
    const absl::Status s = in.has_checkpoint() ? receiver.Begin(token, in.checkpoint())
                                               : receiver.Add(token, in.tensor_chunk());
    EXPECT_TRUE(s.ok()) << s;
    return true;
  };
  ASSERT_TRUE(SendCheckpoint(tensors, 5, write, [] {}).ok());
  EXPECT_EQ(chunks, 3 + 1 + 3 + 17);
  ASSERT_TRUE(receiver.Complete(5));
  const std::vector<OwnedTensor> received = receiver.Take();
  ASSERT_EQ(received.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = tensors[i].second;
    EXPECT_EQ(received[i].spec, specs[i]);
    ASSERT_EQ(received[i].bytes.size(), t.nbytes()) << tensors[i].first;
    EXPECT_EQ(std::memcmp(received[i].bytes.data(), t.data_ptr(), t.nbytes()), 0)
        << tensors[i].first;
  }
}

TEST(SessionInboxTest, ChunksOutsideAMicrobatchAreAnError) {
  FakeLink link;
  SessionInbox inbox;
  link.Send(ReformMessage(3, 0));
  link.SendBuffer(ChunkBuffers("x", torch::arange(10, torch::kInt64)).at(0));
  link.Close();
  inbox.ReadAll(link);
  InboxItem reform = inbox.Pop();
  EXPECT_EQ(reform.kind, InboxItem::kReform);
  InboxItem error = inbox.Pop();
  EXPECT_EQ(error.kind, InboxItem::kError);
  EXPECT_THAT(error.text, HasSubstr("outside a microbatch"));
  EXPECT_TRUE(inbox.stream_lost());
  EXPECT_EQ(inbox.newest_epoch(), SessionInbox::kSessionOver);
}

TEST(SessionInboxTest, AssemblesAMicrobatchAndStopsAtTheShutdown) {
  FakeLink link;
  SessionInbox inbox;
  WorkerMetrics metrics("cpu", "gloo");
  inbox.ReportTo(&metrics);
  size_t sent_bytes = 0;  // up to the Shutdown
  const auto send = [&](const v1::CoordinatorMessage& m) {
    sent_bytes += m.ByteSizeLong();
    link.Send(m);
  };
  send(ReformMessage(2, 0));
  v1::CoordinatorMessage m;
  m.mutable_microbatch()->set_step(4);
  m.mutable_microbatch()->set_num_tensors(1);
  send(m);
  torch::Tensor t = torch::arange(1000, torch::kFloat32);
  std::vector<grpc::ByteBuffer> buffers = ChunkBuffers("x", t);
  EXPECT_GT(buffers.size(), 1u);
  for (auto& b : buffers) {
    sent_bytes += b.Length();
    link.SendBuffer(b);
  }
  send(CommitMessage(4, 2, true));
  send(ShutdownMessage(true));
  link.Send(ReformMessage(9, 0));  // after the Shutdown: never read
  inbox.ReadAll(link);             // returns at the Shutdown, with the stream still open
  // Counted as read, not when a heartbeat next samples them (a scrape saw 0 after 5 steps).
  EXPECT_THAT(metrics.Text(), HasSubstr(absl::StrCat(
                                  "flashdraft_worker_stream_bytes_total{direction=\"received\"} ",
                                  sent_bytes, "\n")));
  EXPECT_EQ(inbox.Pop().kind, InboxItem::kReform);
  InboxItem batch = inbox.Pop();
  ASSERT_EQ(batch.kind, InboxItem::kBatch);
  EXPECT_EQ(batch.step, 4u);
  ASSERT_EQ(batch.tensors.count("x"), 1u);
  EXPECT_TRUE(torch::equal(batch.tensors["x"], t));
  InboxItem commit = inbox.Pop();
  ASSERT_EQ(commit.kind, InboxItem::kCommit);
  EXPECT_TRUE(commit.checkpoint);
  EXPECT_EQ(commit.epoch, 2u);
  InboxItem shutdown = inbox.Pop();
  EXPECT_EQ(shutdown.kind, InboxItem::kShutdown);
  EXPECT_TRUE(shutdown.job_finished);
  EXPECT_FALSE(inbox.stream_lost());
  EXPECT_EQ(inbox.newest_epoch(), SessionInbox::kSessionOver);
}

// A feeder in memory: the shards it holds by ticket (header and chunk buffers); a ticket it does
// not have fails as an unreachable feeder would. A "hang" ticket answers nothing until `inbox` has
// a newer epoch than the ref's (the real fetch is cancelled then; gRPC's cancellation itself is not
// what this tests).
class FakeFetcher : public ShardFetcher {
 public:
  absl::Status Fetch(const v1::ShardRef& ref, grpc::ClientContext*,
                     const std::function<bool(const grpc::ByteBuffer&)>& on_message) override {
    if (ref.ticket() == "hang") {
      hung.Notify();
      while (inbox->newest_epoch() <= ref.membership_epoch()) absl::SleepFor(absl::Milliseconds(1));
      return absl::CancelledError("cancelled");
    }
    auto it = shards.find(ref.ticket());
    if (it == shards.end()) return absl::UnavailableError("feeder unreachable");
    for (const grpc::ByteBuffer& b : it->second) {
      if (!on_message(b)) return absl::DataLossError("stopped");
    }
    return absl::OkStatus();
  }
  std::map<std::string, std::vector<grpc::ByteBuffer>> shards;
  absl::Notification hung;
  const SessionInbox* inbox = nullptr;
};

v1::CoordinatorMessage ShardRefMessage(const std::string& ticket, uint64_t step, uint64_t epoch) {
  v1::CoordinatorMessage m;
  v1::ShardRef* ref = m.mutable_shard_ref();
  ref->set_feeder_address("feeder:1");
  ref->set_ticket(ticket);
  ref->set_step(step);
  ref->set_membership_epoch(epoch);
  return m;
}

// A shard as a feeder serves it: its header, then one tensor "x" in several chunks.
std::vector<grpc::ByteBuffer> ServedShard(uint64_t step, uint64_t epoch, const torch::Tensor& x) {
  v1::CoordinatorMessage header;
  header.mutable_microbatch()->set_step(step);
  header.mutable_microbatch()->set_membership_epoch(epoch);
  header.mutable_microbatch()->set_num_tensors(1);
  std::vector<grpc::ByteBuffer> out = {MessageToBuffer(header)};
  for (grpc::ByteBuffer& b : ChunkBuffers("x", x)) out.push_back(std::move(b));
  return out;
}

TEST(SessionInboxTest, ShardsByReferenceAreFetchedInOrderAndLostOnesReported) {
  FakeFetcher feeder;
  const torch::Tensor x = torch::arange(1000, torch::kFloat32);
  feeder.shards["a"] = ServedShard(4, 2, x);
  std::vector<grpc::ByteBuffer> wrong = ServedShard(5, 2, x);  // not the step the ref names
  feeder.shards["wrong"] = wrong;
  FakeLink link;
  SessionInbox inbox;
  inbox.FetchShardsWith(&feeder);
  link.Send(ReformMessage(2, 0));
  link.Send(ShardRefMessage("a", 4, 2));
  link.Send(ShardRefMessage("gone", 4, 2));   // the feeder cannot be reached
  link.Send(ShardRefMessage("wrong", 4, 2));  // the feeder answers with another shard
  link.Send(ShardRefMessage("a", 4, 1));      // of an older epoch: dropped
  link.Send(ShardRefMessage("a", 4, 2));
  std::thread reader([&] { inbox.ReadAll(link); });
  EXPECT_EQ(inbox.Pop().kind, InboxItem::kReform);
  std::vector<InboxItem> fetched;
  for (int i = 0; i < 4; ++i) fetched.push_back(inbox.Pop());
  link.Send(ShutdownMessage(true));
  reader.join();
  ASSERT_EQ(fetched.size(), 4u);
  ASSERT_EQ(fetched[0].kind, InboxItem::kBatch);
  EXPECT_TRUE(torch::equal(fetched[0].tensors.at("x"), x));
  EXPECT_EQ(fetched[1].kind, InboxItem::kShardLost);
  EXPECT_THAT(fetched[1].text, HasSubstr("feeder unreachable"));
  EXPECT_EQ(fetched[1].step, 4u);
  EXPECT_EQ(fetched[1].epoch, 2u);
  EXPECT_EQ(fetched[2].kind, InboxItem::kShardLost);
  ASSERT_EQ(fetched[3].kind, InboxItem::kBatch) << "a lost shard leaves nothing half-assembled";
  EXPECT_TRUE(torch::equal(fetched[3].tensors.at("x"), x));
}

TEST(SessionInboxTest, AReformCancelsTheFetchOfAnOlderEpochsShard) {
  FakeFetcher feeder;
  FakeLink link;
  SessionInbox inbox;
  feeder.inbox = &inbox;
  inbox.FetchShardsWith(&feeder);
  link.Send(ReformMessage(2, 0));
  link.Send(ShardRefMessage("hang", 4, 2));  // its feeder never answers
  std::thread reader([&] { inbox.ReadAll(link); });
  EXPECT_EQ(inbox.Pop().kind, InboxItem::kReform);
  feeder.hung.WaitForNotification();
  link.Send(ReformMessage(3, 0));  // read while the fetch hangs, which it cancels
  EXPECT_EQ(inbox.Pop().kind, InboxItem::kReform);
  link.Send(ShutdownMessage(true));
  reader.join();
  EXPECT_EQ(inbox.Pop().kind, InboxItem::kShutdown) << "the cancelled fetch reports nothing";
}

// One microbatch of samples of `lengths` tokens and `feature_size` features of `dtype`, packed by
// the coordinator's MicrobatchPacker in chunks of `chunk_bytes` and read by the worker's inbox:
// every tensor arrives whole, right-padded (anchors with -1). Each source row may hold `unsent`
// more columns and then `teacher` teacher columns: hidden_states carries the first feature_size,
// teacher_hidden the last `teacher`, and nothing carries the columns between.
void PackAndReceive(const std::vector<int64_t>& lengths, int64_t feature_size,
                    torch::ScalarType dtype, size_t chunk_bytes, int64_t unsent = 0,
                    int64_t teacher = 0) {
  const int64_t b = static_cast<int64_t>(lengths.size());
  const int64_t s = *std::max_element(lengths.begin(), lengths.end());
  const int64_t row = feature_size + unsent + teacher;
  MicrobatchPacker packer(b, s, {row, feature_size, teacher, FromTorchDType(dtype).value()},
                          chunk_bytes);
  torch::Tensor ids = torch::zeros({b, s}, torch::kInt64), mask = torch::zeros({b, s}, torch::kU8);
  torch::Tensor anchors = torch::full({b, b}, -1, torch::kInt64);
  std::vector<torch::Tensor> features;
  for (int64_t i = 0; i < b; ++i) {
    Sample sample;
    sample.index = static_cast<uint64_t>(i);
    for (int64_t t = 0; t < lengths[i]; ++t) {
      sample.input_ids.push_back(1000 * i + t + 1);
      sample.loss_mask.push_back(t % 3 != 0);
    }
    const int64_t len = lengths[i];
    ids[i].narrow(0, 0, len).copy_(torch::tensor(sample.input_ids, torch::kInt64));
    mask[i].narrow(0, 0, len).copy_(torch::tensor(sample.loss_mask, torch::kInt64));
    features.push_back(torch::randn({len, row}).to(dtype));
    sample.features = static_cast<const uint8_t*>(features.back().data_ptr());
    anchors[i].narrow(0, 0, i + 1).fill_(i);
    ASSERT_TRUE(packer.Add(sample, std::vector<int64_t>(i + 1, i)).ok());
  }
  std::vector<grpc::ByteBuffer> buffers;
  ASSERT_TRUE(packer.Encode(&buffers).ok());
  FakeLink link;
  v1::CoordinatorMessage header;
  header.mutable_microbatch()->set_step(3);
  header.mutable_microbatch()->set_num_tensors(MicrobatchPacker::NumTensors(teacher > 0));
  link.Send(header);
  for (grpc::ByteBuffer& buffer : buffers) link.SendBuffer(std::move(buffer));
  link.Send(ShutdownMessage(true));
  SessionInbox inbox;
  inbox.ReadAll(link);
  InboxItem batch = inbox.Pop();
  ASSERT_EQ(batch.kind, InboxItem::kBatch) << batch.text;
  EXPECT_TRUE(torch::equal(batch.tensors.at("input_ids"), ids));
  EXPECT_TRUE(torch::equal(batch.tensors.at("loss_mask"), mask));
  EXPECT_TRUE(torch::equal(batch.tensors.at("anchors"), anchors));
  EXPECT_EQ(batch.tensors.count("teacher_hidden"), teacher > 0 ? 1u : 0u);
  const std::pair<const char*, std::pair<int64_t, int64_t>> columns[] = {
      {"hidden_states", {0, feature_size}}, {"teacher_hidden", {row - teacher, teacher}}};
  for (const auto& [name, range] : columns) {
    if (range.second == 0) continue;
    const torch::Tensor got = batch.tensors.at(name);
    ASSERT_EQ(got.sizes().vec(), (std::vector<int64_t>{b, s, range.second})) << name;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t len = lengths[i];
      EXPECT_TRUE(
          torch::equal(got[i].narrow(0, 0, len), features[i].narrow(1, range.first, range.second)))
          << name << " of sample " << i;
      EXPECT_EQ(torch::count_nonzero(got[i].narrow(0, len, s - len)).item<int64_t>(), 0)
          << name << " of sample " << i << ": its padding";
    }
  }
}

// The data stream with tensors of several chunks (64 KiB here): hidden_states of exactly 4 chunks,
// of 2 and a part (BF16), and of more than gRPC's message limit (a real sample's are 168 MB), whose
// input_ids take 2 chunks too.
TEST(SessionInboxTest, MicrobatchTensorsOfSeveralChunksArriveWhole) {
  constexpr size_t kChunk = 64 << 10;
  ASSERT_NO_FATAL_FAILURE(PackAndReceive({32, 20}, 1024, torch::kFloat32, kChunk));      // 4 chunks
  ASSERT_NO_FATAL_FAILURE(PackAndReceive({25, 7, 19}, 1000, torch::kBFloat16, kChunk));  // 150000 B
  ASSERT_GT(2 * 4100 * 2048 * sizeof(float), static_cast<size_t>(kMaxMessageBytes));
  ASSERT_NO_FATAL_FAILURE(PackAndReceive({4100, 4000}, 2048, torch::kFloat32, kChunk));
}

// Distillation's teacher columns (the last of each source row) travel as their own tensor, and
// columns the job does not use (a teacher with train.loss ce) stay behind.
TEST(SessionInboxTest, TheTeacherColumnsTravelAsTheirOwnTensor) {
  constexpr size_t kChunk = 64 << 10;
  ASSERT_NO_FATAL_FAILURE(PackAndReceive({25, 7, 19}, 1000, torch::kBFloat16, kChunk, 0, 200));
  ASSERT_NO_FATAL_FAILURE(PackAndReceive({40, 33}, 768, torch::kFloat32, kChunk, 256, 0));
  ASSERT_NO_FATAL_FAILURE(PackAndReceive({40, 33}, 768, torch::kFloat32, kChunk, 64, 256));
}

// --- The heartbeat thread's logic on a FakeClock ---

struct MonitorHarness {
  FakeClock clock;
  SessionProgress progress;
  std::vector<v1::WorkerMessage> sent;
  bool stream_writable = true;
  int stuck_calls = 0;
  SessionMonitor monitor{clock, MonitorOptions{2.0, 300.0}, progress,
                         [this](v1::WorkerMessage& m) {
                           sent.push_back(m);
                           return stream_writable;
                         },
                         [this] { ++stuck_calls; }};
  int Count(bool (v1::WorkerMessage::*has)() const) const {
    int n = 0;
    for (const auto& m : sent) n += (m.*has)();
    return n;
  }
};

TEST(SessionMonitorTest, HeartbeatsEveryIntervalCarryTheTrainingThreadsProgress) {
  MonitorHarness h;
  h.progress.Enter("backward", 12, true);
  h.monitor.Tick(false, false);
  ASSERT_EQ(h.Count(&v1::WorkerMessage::has_heartbeat), 1);
  const v1::Heartbeat& beat = h.sent.back().heartbeat();
  EXPECT_EQ(beat.phase(), "backward");
  EXPECT_EQ(beat.step(), 12u);
  EXPECT_TRUE(beat.busy());
  EXPECT_EQ(beat.progress(), h.progress.counter.load());
  h.clock.Advance(1.9);
  h.monitor.Tick(false, false);
  EXPECT_EQ(h.Count(&v1::WorkerMessage::has_heartbeat), 1);
  h.clock.Advance(0.2);
  h.monitor.Tick(false, false);
  EXPECT_EQ(h.Count(&v1::WorkerMessage::has_heartbeat), 2);
}

TEST(SessionMonitorTest, ALeaveRequestIsSentOnce) {
  MonitorHarness h;
  h.monitor.Tick(true, false);
  h.monitor.Tick(true, false);
  h.clock.Advance(10);
  h.monitor.Tick(true, false);
  ASSERT_EQ(h.Count(&v1::WorkerMessage::has_leave), 1);
}

TEST(SessionMonitorTest, AStuckTrainingThreadWithTheStreamGoneEndsTheProcess) {
  MonitorHarness h;
  h.stream_writable = false;
  h.progress.Enter("forward", 3, true);
  // Stuck, but the coordinator is still there: it decides (it declares the worker lost).
  h.monitor.Tick(false, false);
  h.clock.Advance(1000);
  h.monitor.Tick(false, false);
  EXPECT_EQ(h.stuck_calls, 0);
  // The stream is gone: the stall counts from when that was seen.
  h.monitor.Tick(false, true);
  h.clock.Advance(299);
  h.monitor.Tick(false, true);
  EXPECT_EQ(h.stuck_calls, 0);
  // Progress resets the count.
  h.progress.Enter("backward", 3, true);
  h.clock.Advance(2);
  h.monitor.Tick(false, true);
  h.clock.Advance(299);
  h.monitor.Tick(false, true);
  EXPECT_EQ(h.stuck_calls, 0);
  h.clock.Advance(2);
  h.monitor.Tick(false, true);
  EXPECT_EQ(h.stuck_calls, 1);
  h.clock.Advance(1000);
  h.monitor.Tick(false, true);
  EXPECT_EQ(h.stuck_calls, 1);  // once
}

// /healthz: 503 while the training thread computes without progress past the stall timeout
// (stream or no stream), and once the heartbeat thread itself stops reporting.
TEST(SessionMonitorTest, TellsHealthzWhetherTheTrainingThreadMakesProgress) {
  FakeClock clock;
  SessionProgress progress;
  HealthState health(clock);
  SessionMonitor monitor(
      clock, MonitorOptions{2.0, 300.0, 20.0}, progress, [](v1::WorkerMessage&) { return true; },
      [] {}, &health);
  progress.Enter("forward", 3, true);
  monitor.Tick(false, false);
  EXPECT_EQ(health.Healthz().status, 200);
  clock.Advance(299);
  monitor.Tick(false, false);
  EXPECT_EQ(health.Healthz().status, 200);
  progress.Enter("backward", 3, true);
  clock.Advance(2);
  monitor.Tick(false, false);
  clock.Advance(301);
  monitor.Tick(false, false);
  EXPECT_EQ(health.Healthz().status, 503);
  EXPECT_EQ(health.Healthz().body,
            "the training thread has made no progress in backward of step 3 for 301 s "
            "(cluster.stall_timeout_seconds: 300)");
  progress.Enter("reduce", 3, false);  // waiting for its peers is not stuck
  clock.Advance(1000);
  monitor.Tick(false, false);
  EXPECT_EQ(health.Healthz().status, 200);
  clock.Advance(21);  // no tick: the heartbeat thread stopped
  EXPECT_EQ(health.Healthz().status, 503);
  EXPECT_EQ(health.Healthz().body, "no progress report from the heartbeat thread for 21.0 s");
}

TEST(SessionMonitorTest, AThreadWaitingForItsPeersIsNotStuck) {
  MonitorHarness h;
  h.progress.Enter("reduce", 3, false);
  h.monitor.Tick(false, true);
  h.clock.Advance(10000);
  h.monitor.Tick(false, true);
  EXPECT_EQ(h.stuck_calls, 0);
}

}  // namespace
}  // namespace flashdraft
