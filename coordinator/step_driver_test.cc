// The step protocol without a network: a StepDriver and a MembershipController over fake worker
// streams (FakeWorkerChannels) on a FakeClock. The test plays the workers: it joins them, answers
// every Reform, Microbatch and Commit the coordinator sends as a worker would, and advances the
// clock where a timeout is the point. Nothing sleeps; a lost message fails after 30 s of real time.
#include "coordinator/step_driver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "common/tensor_codec.h"
#include "coordinator/checkpoint_pipeline.h"
#include "coordinator/latest_file_writer.h"
#include "coordinator/membership_controller.h"
#include "coordinator/status_board.h"
#include "coordinator/worker_channels.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::flashdraft::testing::Eventually;
using ::testing::HasSubstr;

constexpr int kBlock = 4;
constexpr int64_t kFeatures = 8;

// Samples of 24 tokens with BF16 features of width 8, every token in the loss.
class MemorySource : public HiddenStateSource {
 public:
  explicit MemorySource(uint64_t n) : n_(n), features_(24 * kFeatures * 2, 0) {}
  uint64_t num_samples() const override { return n_; }
  int64_t feature_size() const override { return kFeatures; }
  DType feature_dtype() const override { return DType::kBF16; }
  int64_t SampleLength(uint64_t) const override { return 24; }
  absl::StatusOr<Sample> Get(uint64_t index) const override {
    Sample s;
    s.index = index;
    s.input_ids.assign(24, static_cast<int64_t>(index % 7) + 1);
    s.loss_mask.assign(24, 1);
    s.feature_dtype = DType::kBF16;
    s.features = features_.data();
    return s;
  }

 private:
  uint64_t n_;
  std::vector<uint8_t> features_;
};

struct JobShape {
  int min_workers = 1;
  int max_workers = 1;
  int64_t total_steps = 3;
  int checkpoint_every_steps = 2;
  double heartbeat_timeout = 20;
  double join_timeout = 60;
};

// The coordinator's parts as Coordinator wires them, minus gRPC and files other than steps.jsonl.
class Harness {
 public:
  explicit Harness(const JobShape& setup)
      : setup_(setup),
        metrics_("gloo", setup.total_steps, kBlock),
        log_(*StepLog::Open(dir_.Join("steps.jsonl"))),
        source_(64),
        scheduler_(source_, Schedule()) {
    CheckpointPipeline::Options options;
    options.upload_timeout_seconds = 100;
    pipeline_ = std::make_unique<CheckpointPipeline>(
        options, CheckpointUploadSpecs({{"w", DType::kF32, {2}}}),
        [this](uint64_t steps, const std::vector<OwnedTensor>& tensors, const std::string&,
               const std::vector<std::string>&) { return WriteCheckpoint(steps, tensors); },
        [] { return std::string(); },
        [this](absl::Status failure) { controller_->Abort(std::move(failure)); }, metrics_, log_,
        clock_);
    ControllerOptions co;
    co.membership.min_workers = setup.min_workers;
    co.membership.max_workers = setup.max_workers;
    co.membership.heartbeat_timeout_seconds = setup.heartbeat_timeout;
    co.membership.bind_timeout_seconds = setup.join_timeout;
    co.join_timeout_seconds = setup.join_timeout;
    co.block_size = kBlock;
    controller_ = std::make_unique<MembershipController>(
        co, std::make_unique<NumericsGroup>("", false), channels_, *pipeline_, metrics_, clock_);
    StepDriverOptions d;
    d.total_steps = setup.total_steps;
    d.learning_rate.learning_rate = 1e-3;
    d.learning_rate.total_steps = setup.total_steps;
    d.checkpoint_every_steps = setup.checkpoint_every_steps;
    driver_ = std::make_unique<StepDriver>(
        d, StepDriverParts{controller_.get(), pipeline_.get(), &board_, &source_, &scheduler_,
                           &log_, &metrics_, &store_, &clock_});
  }
  ~Harness() {
    if (thread_.joinable()) thread_.join();
  }

  void Start() {
    thread_ = std::thread([this] { result_ = driver_->Run(); });
  }
  absl::Status Finish() {
    thread_.join();
    return result_;
  }

  // Joins a worker and binds its stream; its token.
  std::string Join(const std::string& id) {
    v1::JoinRequest request;
    request.set_worker_id(id);
    request.set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
    request.mutable_capability()->mutable_numerics()->set_torch("1.13.1");
    v1::JoinReply reply;
    controller_->Join(request, &reply);
    EXPECT_TRUE(reply.accepted()) << reply.reason();
    const std::string token = reply.session_token();
    EXPECT_TRUE(controller_->Bind(token, [&] { channels_.Attach(token); }).ok());
    return token;
  }

  FakeClock& clock() { return clock_; }
  FakeWorkerChannels& channels() { return channels_; }
  MembershipController& controller() { return *controller_; }
  StatusBoard& board() { return board_; }
  CheckpointPipeline& pipeline() { return *pipeline_; }
  std::vector<uint64_t>& checkpoints() { return checkpoints_; }
  // Makes the checkpoint writer wait until Unblock().
  void BlockWriter() {
    absl::MutexLock lock(&mu_);
    blocked_ = true;
  }
  void Unblock() {
    absl::MutexLock lock(&mu_);
    blocked_ = false;
  }
  // Waits (up to 30 s of real time) until the writer is stuck in WriteCheckpoint.
  bool AwaitWriterWaiting() const {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&writer_waiting_), absl::Seconds(30));
  }

 private:
  SchedulerOptions Schedule() const {
    SchedulerOptions so;
    so.global_batch_size = 4;
    so.block_size = kBlock;
    so.max_anchors = 4;
    so.max_seq_len = 24;
    return so;
  }
  absl::StatusOr<CheckpointInfo> WriteCheckpoint(uint64_t steps,
                                                 const std::vector<OwnedTensor>& tensors) {
    absl::MutexLock lock(&mu_);
    writer_waiting_ = blocked_;
    mu_.Await(absl::Condition(
        +[](bool* blocked) { return !*blocked; }, &blocked_));
    writer_waiting_ = false;
    EXPECT_EQ(tensors.size(), 4u);
    checkpoints_.push_back(steps);
    CheckpointInfo info;
    info.completed_steps = steps;
    info.dir = dir_.Join("checkpoint-" + std::to_string(steps));
    return info;
  }

  JobShape setup_;
  flashdraft::testing::TempDir dir_;
  FakeClock clock_;
  FakeWorkerChannels channels_;
  CoordinatorMetrics metrics_;
  StepLog log_;
  MemorySource source_;
  Scheduler scheduler_;
  StatusBoard board_;
  RendezvousStore store_;
  std::unique_ptr<CheckpointPipeline> pipeline_;
  std::unique_ptr<MembershipController> controller_;
  std::unique_ptr<StepDriver> driver_;
  std::thread thread_;
  absl::Status result_;
  mutable absl::Mutex mu_;
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  bool writer_waiting_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<uint64_t> checkpoints_;  // the writer's thread; read after it is joined
};

// The workers as the test plays them: what each was told, and the answers a worker gives.
class Workers {
 public:
  explicit Workers(Harness& h) : h_(h) {}

  // Handles the next message the coordinator sends; returns it (none: 30 s without one).
  std::optional<FakeWorkerChannels::Sent> Step() {
    std::optional<FakeWorkerChannels::Sent> next = h_.channels().Next();
    if (!next) return next;
    const std::string& token = next->token;
    const v1::CoordinatorMessage& m = next->message;
    if (m.has_reform()) {
      epoch_[token] = m.reform().membership_epoch();
      rank_[token] = static_cast<int>(m.reform().rank());
    } else if (m.has_microbatch()) {
      OnMicrobatch(token, m.microbatch());
    } else if (m.has_commit()) {
      commits_[token].push_back(m.commit().step());
      if (m.commit().checkpoint() && rank_[token] == 0) Upload(token, m.commit().step() + 1);
    } else if (m.has_shutdown()) {
      shutdowns_[token] = m.shutdown();
    }
    return next;
  }
  // Handles messages until `done` holds; false when the coordinator went quiet first.
  template <typename Done>
  bool Until(Done done) {
    while (!done()) {
      if (!Step()) return false;
    }
    return true;
  }

  void OnMicrobatch(const std::string& token, const v1::Microbatch& mb) {
    if (silent_.count(token)) return;
    const int rank = static_cast<int>(mb.rank());
    // A rank acks a step once, at its first shard's header, for all its shards.
    if (static_cast<int64_t>(mb.shard()) != mb.shard_offsets(rank)) return;
    if (hold_ && hold_(token, mb)) {
      held_.emplace_back(token, mb);  // the test acks it later with OnMicrobatch
      return;
    }
    acked_[token].push_back(mb.step());
    v1::StepAck ack;
    ack.set_step(mb.step());
    ack.set_membership_epoch(mb.membership_epoch());
    for (uint32_t k = mb.shard_offsets(rank); k < mb.shard_offsets(rank + 1); ++k) {
      v1::ShardResult* r = ack.add_shards();
      r->set_shard(k);
      r->set_weighted_loss_sum(loss_);
      r->set_weight_sum(1.0);
      r->set_tokens(10);
      for (int i = 0; i < kBlock - 1; ++i) {
        r->add_slot_correct(1);
        r->add_slot_total(2);
      }
    }
    h_.controller().OnAck(token, ack);
  }

  // Rank 0's upload of the state after `steps`: "drafter.w", its moments and the step.
  void Upload(const std::string& token, uint64_t steps) {
    v1::CheckpointUpload announce;
    announce.set_completed_steps(steps);
    announce.set_num_tensors(4);
    h_.controller().OnCheckpointUpload(token, announce);
    const std::vector<float> w = {1.0f, 2.0f};
    const int64_t step = static_cast<int64_t>(steps);
    for (const auto& [name, dtype, bytes] :
         std::vector<std::tuple<std::string, DType, std::vector<uint8_t>>>{
             {"drafter.w", DType::kF32, Bytes(w.data(), 8)},
             {"adamw.w.exp_avg", DType::kF32, Bytes(w.data(), 8)},
             {"adamw.w.exp_avg_sq", DType::kF32, Bytes(w.data(), 8)},
             {"adamw.step", DType::kI64, Bytes(&step, 8)}}) {
      const std::vector<int64_t> shape = {dtype == DType::kI64 ? 1 : 2};
      v1::TensorChunk chunk;
      // A corrupt upload names a tensor the coordinator does not expect.
      ASSERT_TRUE(EncodeTensor({corrupt_upload_ ? name + ".bogus" : name, dtype, shape},
                               bytes.data(), bytes.size(), 1 << 20, chunk,
                               [&](v1::TensorChunk& c) {
                                 h_.controller().OnCheckpointChunk(token, c);
                                 return absl::OkStatus();
                               })
                      .ok());
    }
  }
  static std::vector<uint8_t> Bytes(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    return {b, b + n};
  }

  std::map<std::string, uint64_t> epoch_;
  std::map<std::string, int> rank_;
  std::map<std::string, std::vector<uint64_t>> commits_;
  std::map<std::string, v1::Shutdown> shutdowns_;
  std::set<std::string> silent_;  // tokens that no longer ack
  // Steps whose first header the test keeps back (in held_) instead of acking.
  std::function<bool(const std::string&, const v1::Microbatch&)> hold_;
  std::vector<std::pair<std::string, v1::Microbatch>> held_;
  std::map<std::string, std::vector<uint64_t>> acked_;
  bool corrupt_upload_ = false;
  double loss_ = 2.0;

 private:
  Harness& h_;
};

TEST(StepDriverTest, TrainsCommitsCheckpointsAndFinishes) {
  JobShape setup;
  setup.min_workers = setup.max_workers = 2;
  Harness h(setup);
  Workers w(h);
  const std::string a = h.Join("a"), b = h.Join("b");
  h.Start();
  ASSERT_TRUE(w.Until([&] { return w.shutdowns_.size() == 2; }));
  ASSERT_TRUE(h.Finish().ok());
  EXPECT_EQ(w.epoch_[a], 1u);
  EXPECT_EQ(w.epoch_[b], 1u);
  EXPECT_EQ(w.commits_[a], (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(w.commits_[b], (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_TRUE(w.shutdowns_[a].job_finished());
  EXPECT_EQ(h.checkpoints(), (std::vector<uint64_t>{2, 3}));  // every 2 steps, and the last
  EXPECT_EQ(h.board().state(), JobState::kDone);
  EXPECT_EQ(h.pipeline().last().completed_steps, 3u);
}

TEST(StepDriverTest, AWorkerLostBeforeTheCommitIsReformedAndTheStepSentAgain) {
  JobShape setup;
  setup.max_workers = 2;
  setup.checkpoint_every_steps = 0;
  Harness h(setup);
  Workers w(h);
  const std::string a = h.Join("a"), b = h.Join("b");
  w.silent_.insert(a);  // a never acks step 0: b's ack is in, the step cannot commit
  h.Start();
  ASSERT_TRUE(w.Until([&] { return w.epoch_.count(a) && w.epoch_[a] == 1; }));
  h.controller().Lost(a, "the worker closed its stream");
  ASSERT_TRUE(w.Until([&] { return w.epoch_[b] == 2; }));
  ASSERT_TRUE(w.Until([&] { return w.shutdowns_.count(b) > 0; }));
  ASSERT_TRUE(h.Finish().ok());
  // Step 0 was sent again in epoch 2 and committed there, once.
  EXPECT_EQ(w.commits_[b], (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_TRUE(w.commits_[a].empty());
  EXPECT_THAT(h.channels().close_status(a).error_message(), HasSubstr("removed from the job"));
}

TEST(StepDriverTest, StaleAcksAreIgnoredAndASecondAckReplacesTheFirst) {
  JobShape setup;
  setup.max_workers = 2;
  setup.total_steps = 1;
  Harness h(setup);
  Workers w(h);
  const std::string a = h.Join("a"), b = h.Join("b");
  w.silent_ = {a, b};
  h.Start();
  // Each rank's first shard header of step 0 (the one a rank acks at).
  std::map<std::string, v1::Microbatch> first;
  while (first.size() < 2) {
    std::optional<FakeWorkerChannels::Sent> next = w.Step();
    ASSERT_TRUE(next.has_value());
    const v1::Microbatch& mb = next->message.microbatch();
    if (next->message.has_microbatch() && !first.count(next->token) &&
        static_cast<int64_t>(mb.shard()) == mb.shard_offsets(static_cast<int>(mb.rank()))) {
      first[next->token] = mb;
    }
  }
  w.silent_.clear();
  v1::Microbatch stale = first[a];
  stale.set_membership_epoch(7);  // another epoch's
  w.loss_ = 100;
  w.OnMicrobatch(a, stale);
  w.loss_ = 50;
  w.OnMicrobatch(a, first[a]);  // replaced by the next one
  w.loss_ = 3;
  w.OnMicrobatch(a, first[a]);
  w.OnMicrobatch(b, first[b]);  // b's ack completes the step: a's acks are all in before it
  ASSERT_TRUE(w.Until([&] { return w.shutdowns_.size() == 2; }));
  ASSERT_TRUE(h.Finish().ok());
  v1::StatusReply status;
  h.board().Fill(&status);
  EXPECT_EQ(status.step(), 1u);
  EXPECT_DOUBLE_EQ(status.loss(), 3.0);
}

TEST(StepDriverTest, ABrokenUploadDropsTheUploaderAndSkipsItsCheckpoint) {
  JobShape setup;
  setup.max_workers = 2;
  setup.total_steps = 4;
  setup.checkpoint_every_steps = 2;
  Harness h(setup);
  Workers w(h);
  const std::string a = h.Join("a"), b = h.Join("b");
  w.corrupt_upload_ = true;  // rank 0 (a) sends tensors of the wrong shape
  h.Start();
  ASSERT_TRUE(w.Until([&] { return w.epoch_[b] == 2; }));
  w.corrupt_upload_ = false;
  ASSERT_TRUE(w.Until([&] { return w.shutdowns_.count(b) > 0; }));
  ASSERT_TRUE(h.Finish().ok());
  EXPECT_THAT(h.channels().close_status(a).error_message(),
              HasSubstr("sent a bad checkpoint upload"));
  EXPECT_EQ(h.checkpoints(), (std::vector<uint64_t>{4}));  // step 2's was skipped
}

TEST(StepDriverTest, PausesBelowMinWorkersUntilANewcomerJoins) {
  JobShape setup;
  setup.min_workers = setup.max_workers = 2;
  setup.total_steps = 4;
  Harness h(setup);
  Workers w(h);
  const std::string a = h.Join("a"), b = h.Join("b");
  h.Start();
  ASSERT_TRUE(w.Until([&] { return w.commits_[b].size() == 1; }));
  h.controller().Lost(a, "the worker closed its stream");
  // b alone is below min_workers: the job pauses (for as long as the join timeout allows).
  ASSERT_TRUE(h.board().AwaitState(JobState::kPaused, 30));
  const std::string c = h.Join("c");
  ASSERT_TRUE(w.Until([&] { return w.epoch_.count(c) && w.epoch_[c] == 2; }));
  ASSERT_TRUE(w.Until([&] { return w.shutdowns_.size() == 2; }));
  ASSERT_TRUE(h.Finish().ok());
  EXPECT_EQ(w.commits_[c].back(), 3u);
  EXPECT_EQ(h.board().state(), JobState::kDone);
}

TEST(StepDriverTest, HeartbeatAndJoinTimeoutsRunOnTheClock) {
  JobShape setup;
  setup.heartbeat_timeout = 20;
  setup.join_timeout = 60;
  Harness h(setup);
  Workers w(h);
  const std::string a = h.Join("a");
  w.silent_.insert(a);  // computes forever, never heartbeats
  h.Start();
  ASSERT_TRUE(w.Until([&] { return w.epoch_.count(a) > 0; }));
  h.clock().Advance(21);  // past the heartbeat timeout: lost; nobody left: paused
  ASSERT_TRUE(h.board().AwaitState(JobState::kPaused, 30));
  EXPECT_TRUE(h.channels().closed(a));
  h.clock().Advance(61);  // past the join timeout
  const absl::Status result = h.Finish();
  EXPECT_TRUE(absl::IsDeadlineExceeded(result)) << result;
  EXPECT_THAT(result.message(), HasSubstr("cluster.join_timeout_seconds"));
}

TEST(StepDriverTest, ABlockedCheckpointWriterBlocksNoReaction) {
  JobShape setup;
  setup.total_steps = 4;
  setup.checkpoint_every_steps = 1;
  Harness h(setup);
  Workers w(h);
  const std::string a = h.Join("a");
  h.BlockWriter();
  h.Start();
  // Step 0's commit asks for a checkpoint; rank 0 uploads it as the commit is handled.
  ASSERT_TRUE(w.Until([&] { return !w.commits_[a].empty(); }));
  ASSERT_TRUE(h.AwaitWriterWaiting());
  // The writer is stuck in its "fsync": heartbeats and Status are answered.
  v1::Heartbeat heartbeat;
  heartbeat.set_progress(5);
  heartbeat.set_metrics_address("127.0.0.1:9");
  h.controller().OnHeartbeat(a, heartbeat);
  v1::StatusReply status;
  h.controller().FillWorkers({}, &status);
  ASSERT_EQ(status.workers_size(), 1);
  EXPECT_EQ(status.workers(0).metrics_address(), "127.0.0.1:9");
  ASSERT_TRUE(w.Until([&] { return w.commits_[a].size() == 1; }));
  h.Unblock();
  ASSERT_TRUE(w.Until([&] { return w.shutdowns_.count(a) > 0; }));
  ASSERT_TRUE(h.Finish().ok());
  EXPECT_EQ(h.checkpoints(), (std::vector<uint64_t>{1, 2, 3, 4}));
}

TEST(StepDriverTest, ABlockedScrapeTargetsWriterBlocksNoHeartbeat) {
  absl::Mutex mu;  // outlives the writer's thread (in the harness)
  bool release = false;
  int writes = 0;
  JobShape setup;
  Harness h(setup);
  h.controller().PublishScrapeTargets(
      "127.0.0.1:1", std::make_unique<LatestFileWriter>(
                         "targets.json", h.clock(), [&](const std::string&, const std::string&) {
                           absl::MutexLock lock(&mu);
                           ++writes;
                           mu.Await(absl::Condition(&release));
                           return absl::OkStatus();
                         }));
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* n) { return *n > 0; }, &writes));
  }
  const std::string a = h.Join("a");
  for (int i = 0; i < 3; ++i) {
    v1::Heartbeat heartbeat;
    heartbeat.set_metrics_address("127.0.0.1:" + std::to_string(100 + i));
    h.controller().OnHeartbeat(a, heartbeat);  // returns although the writer is stuck
  }
  {
    absl::MutexLock lock(&mu);
    // Still in the first write; the three later contents collapse into the newest.
    EXPECT_EQ(writes, 1);
    release = true;
  }
  h.controller().Abort(absl::CancelledError("test over"));
  h.Start();
  EXPECT_TRUE(absl::IsCancelled(h.Finish()));
}

TEST(StepDriverTest, RankZeroLostAfterItsAckGivesUpItsCheckpoint) {
  JobShape setup;
  setup.max_workers = 2;
  setup.total_steps = 4;
  setup.checkpoint_every_steps = 1;
  Harness h(setup);
  Workers w(h);
  const std::string a = h.Join("a"), b = h.Join("b");  // a: rank 0, the uploader
  w.hold_ = [&](const std::string& token, const v1::Microbatch& mb) {
    return token == b && mb.step() == 1;
  };
  h.BlockWriter();  // step 1's checkpoint (after step 0) stays in its writer
  h.Start();
  auto a_acked_step_1 = [&] { return std::count(w.acked_[a].begin(), w.acked_[a].end(), 1u) > 0; };
  ASSERT_TRUE(
      w.Until([&] { return !w.commits_[a].empty() && a_acked_step_1() && !w.held_.empty(); }));
  ASSERT_TRUE(h.AwaitWriterWaiting());
  // The driver waits for b's ack of step 1 on the clock (nobody else waits on it now).
  ASSERT_TRUE(Eventually([&] { return h.clock().waiting() == 1; }));
  w.hold_ = nullptr;
  w.OnMicrobatch(w.held_[0].first, w.held_[0].second);
  // Step 1 is acked by all: the driver leaves its wait and cannot see a change before Commit,
  // where it first waits for the blocked writer.
  ASSERT_TRUE(Eventually([&] { return h.clock().waiting() == 0; }));
  h.controller().Lost(a, "the worker closed its stream");  // after its ack, before the commit
  h.Unblock();
  // Step 2's checkpoint had no uploader: skipped, not waited for until the upload timeout.
  ASSERT_TRUE(w.Until([&] { return w.shutdowns_.count(b) > 0; }));
  ASSERT_TRUE(h.Finish().ok());
  EXPECT_EQ(w.commits_[b], (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(w.epoch_[b], 2u);
  EXPECT_EQ(h.checkpoints(), (std::vector<uint64_t>{1, 3, 4}));
}

TEST(StepDriverTest, TimeoutsAreDueAtExactlyTheirMoment) {
  JobShape setup;
  setup.heartbeat_timeout = 20;
  setup.join_timeout = 60;
  Harness h(setup);
  Workers w(h);
  const std::string a = h.Join("a");
  w.silent_.insert(a);
  h.Start();
  ASSERT_TRUE(w.Until([&] { return w.epoch_.count(a) > 0; }));
  h.clock().Advance(20);  // exactly the heartbeat timeout
  ASSERT_TRUE(h.board().AwaitState(JobState::kPaused, 30));
  EXPECT_TRUE(h.channels().closed(a));
  h.clock().Advance(60);  // exactly the join timeout
  const absl::Status result = h.Finish();
  EXPECT_TRUE(absl::IsDeadlineExceeded(result)) << result;
}

TEST(StepDriverTest, DrainRefusesTheRankOfAWorkerAlreadyLost) {
  JobShape setup;
  setup.min_workers = setup.max_workers = 2;
  setup.total_steps = 4;
  Harness h(setup);
  Workers w(h);
  const std::string a = h.Join("a"), b = h.Join("b");
  h.Start();
  ASSERT_TRUE(w.Until([&] { return w.commits_[b].size() == 1; }));
  h.controller().Lost(a, "the worker closed its stream");
  ASSERT_TRUE(h.board().AwaitState(JobState::kPaused, 30));
  // Paused, the epoch's ranks still name a: its rank is nobody's now.
  v1::DrainRequest request;
  request.set_rank(static_cast<uint32_t>(w.rank_[a]));
  v1::DrainReply reply;
  h.controller().Drain(request, &reply);
  EXPECT_FALSE(reply.accepted());
  EXPECT_THAT(reply.message(), HasSubstr("no worker has rank"));
  request.set_rank(static_cast<uint32_t>(w.rank_[b]));
  h.controller().Drain(request, &reply);
  EXPECT_TRUE(reply.accepted()) << reply.message();
  h.controller().Abort(absl::CancelledError("test over"));
  EXPECT_TRUE(absl::IsCancelled(h.Finish()));
}

TEST(StepDriverTest, AStopRequestEndsAfterTheStepInFlightWithACheckpointAndNoExport) {
  JobShape setup;
  setup.total_steps = 10;
  setup.checkpoint_every_steps = 0;
  Harness h(setup);
  Workers w(h);
  const std::string a = h.Join("a");
  h.Start();
  ASSERT_TRUE(w.Until([&] { return w.commits_[a].size() == 1; }));
  h.controller().RequestStop("signal 15");
  ASSERT_TRUE(w.Until([&] { return w.shutdowns_.count(a) > 0; }));
  ASSERT_TRUE(h.Finish().ok());
  EXPECT_FALSE(w.shutdowns_[a].job_finished());
  EXPECT_THAT(w.shutdowns_[a].reason(), HasSubstr("signal 15: stopped after step"));
  EXPECT_EQ(h.board().state(), JobState::kStopped);
  ASSERT_FALSE(w.commits_[a].empty());
  EXPECT_LT(w.commits_[a].back(), 9u);
  // The step the job stopped after is checkpointed (a resumed job starts there).
  EXPECT_EQ(h.checkpoints(), (std::vector<uint64_t>{w.commits_[a].back() + 1}));
}

// A stop asked for while the last step is in flight: the job finished (the workers hear so, the
// drafter is exported), nothing is left to resume.
TEST(StepDriverTest, AStopRequestDuringTheLastStepFinishesTheJob) {
  JobShape setup;
  setup.total_steps = 2;
  setup.checkpoint_every_steps = 0;
  Harness h(setup);
  Workers w(h);
  const std::string a = h.Join("a");
  h.Start();
  ASSERT_TRUE(w.Until([&] { return w.commits_[a].size() == 1; }));
  h.controller().RequestStop("signal 15");
  ASSERT_TRUE(w.Until([&] { return w.shutdowns_.count(a) > 0; }));
  ASSERT_TRUE(h.Finish().ok());
  EXPECT_TRUE(w.shutdowns_[a].job_finished()) << w.shutdowns_[a].reason();
  EXPECT_EQ(h.board().state(), JobState::kDone);
}

TEST(StepDriverTest, AFailedCollectiveNoLossExplainsReformsTheSameMembersAfterTheGrace) {
  JobShape setup;
  setup.max_workers = 2;
  setup.checkpoint_every_steps = 0;
  Harness h(setup);
  Workers w(h);
  const std::string a = h.Join("a"), b = h.Join("b");
  w.silent_.insert(b);  // b's side of the all-reduce of step 0 "failed"
  h.Start();
  ASSERT_TRUE(w.Until([&] { return std::count(w.acked_[a].begin(), w.acked_[a].end(), 0u) > 0; }));
  v1::CollectiveFailure failure;
  failure.set_step(0);
  failure.set_membership_epoch(1);
  failure.set_error("gloo: connection reset by peer");
  h.controller().OnCollectiveFailure(b, failure);
  h.clock().Advance(2);  // ControllerOptions::collective_failure_grace_seconds; nobody was lost
  ASSERT_TRUE(w.Until([&] { return w.epoch_[b] == 2; }));
  w.silent_.clear();
  ASSERT_TRUE(w.Until([&] { return w.shutdowns_.size() == 2; }));
  ASSERT_TRUE(h.Finish().ok());
  EXPECT_EQ(w.epoch_[a], 2u);
  EXPECT_EQ(w.commits_[a], (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(w.commits_[b], (std::vector<uint64_t>{0, 1, 2}));
}

}  // namespace
}  // namespace flashdraft
