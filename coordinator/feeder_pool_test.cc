#include "coordinator/feeder_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/chunk_wire.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

// What a feeder's stream carried.
class FakeFeedLink : public FeedLink {
 public:
  void Send(grpc::ByteBuffer message) override {
    v1::FeedMessage m;
    ASSERT_TRUE(BufferToMessage(message, &m));
    sent.push_back(m);
  }
  void Close(const grpc::Status& status) override { closed = status.ok() ? "OK" : "error"; }
  std::vector<v1::FeedMessage> sent;
  std::string closed;
};

NumericEnv Numerics() {
  NumericEnv env;
  env.torch = "1.13.1";
  env.torch_build = "cpu, AVX2";
  env.blas = "OpenBLAS 0.3.21";
  env.blas_core = "Haswell";
  env.device = "cpu";
  env.blas_threads = 1;
  env.cpu = "a CPU";
  return env;
}

FeederPoolOptions Options() {
  FeederPoolOptions o;
  o.target = {"c0nf1g", "t3ns0rs"};
  o.numerics = Numerics();
  o.job_config_yaml = "name: job\n";
  return o;
}

v1::FeederJoinRequest Request(const std::string& id) {
  v1::FeederJoinRequest r;
  r.set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
  r.set_feeder_id(id);
  r.set_serve_address(id + ".host:7000");
  r.mutable_target()->set_config_sha256("c0nf1g");
  r.mutable_target()->set_tensors_sha256("t3ns0rs");
  NumericEnvToProto(Numerics(), r.mutable_capability()->mutable_numerics());
  return r;
}

v1::ShardWork Work(uint64_t step, uint32_t shard) {
  v1::ShardWork w;
  w.set_ticket(absl::StrCat("t", step, ".", shard));
  w.mutable_header()->set_step(step);
  w.mutable_header()->set_shard(shard);
  return w;
}

TEST(FeederRefusalTest, AFeederOfAnotherTargetOrNumericsIsRefusedSayingWhy) {
  EXPECT_EQ(FeederRefusal(Request("f"), Options()), "");
  v1::FeederJoinRequest r = Request("f");
  r.set_protocol_version(6);
  EXPECT_THAT(FeederRefusal(r, Options()), HasSubstr("protocol version 6"));
  r = Request("f");
  r.mutable_target()->set_config_sha256("other");
  EXPECT_THAT(FeederRefusal(r, Options()),
              HasSubstr("config.json (sha256 other) is not the job's"));
  r = Request("f");
  r.mutable_target()->set_tensors_sha256("other");
  EXPECT_THAT(FeederRefusal(r, Options()), HasSubstr("its target's tensors"));
  r = Request("f");
  r.set_serve_address("");
  EXPECT_THAT(FeederRefusal(r, Options()), HasSubstr("no serve_address"));
  r = Request("");
  EXPECT_THAT(FeederRefusal(r, Options()), HasSubstr("feeder id"));
  r = Request("f");
  NumericEnv other = Numerics();
  other.blas_core = "SkylakeX";
  NumericEnvToProto(other, r.mutable_capability()->mutable_numerics());
  EXPECT_THAT(FeederRefusal(r, Options()),
              HasSubstr("numeric environment differs from the coordinator's"));
  // A job that regenerates its replies needs the feeders' tokenizer to be its own.
  FeederPoolOptions regenerating = Options();
  regenerating.tokenizer_crc32c = 0xabcd;
  EXPECT_THAT(FeederRefusal(Request("f"), regenerating),
              HasSubstr("tokenizer.json (none) is not the job's (crc32c abcd)"));
  r = Request("f");
  r.set_tokenizer_crc32c(0x1234);
  EXPECT_THAT(FeederRefusal(r, regenerating), HasSubstr("tokenizer.json (crc32c 1234)"));
  EXPECT_EQ(FeederRefusal(r, Options()), "") << "no regeneration: any tokenizer";
  r.set_tokenizer_crc32c(0xabcd);
  EXPECT_EQ(FeederRefusal(r, regenerating), "");
}

// A pool with feeders joined and bound, by id.
class FeederPoolTest : public ::testing::Test {
 protected:
  std::string JoinAndBind(const std::string& id, FeedLink* link) {
    v1::FeederJoinReply reply;
    pool_.Join(Request(id), &reply);
    EXPECT_TRUE(reply.accepted()) << reply.reason();
    EXPECT_EQ(reply.job_config_yaml(), "name: job\n");
    EXPECT_TRUE(pool_.Bind(reply.session_token(), link).ok());
    return reply.session_token();
  }
  static std::vector<std::string> Tickets(const FakeFeedLink& link) {
    std::vector<std::string> out;
    for (const auto& m : link.sent) {
      if (m.has_work()) out.push_back(m.work().ticket());
    }
    return out;
  }

  FakeClock clock_;
  FeederPool pool_{Options(), clock_};
};

TEST_F(FeederPoolTest, ShardsGoToTheLeastLoadedFeederAndBackToTheirOwnerWhenSentAgain) {
  FakeFeedLink a, b;
  JoinAndBind("a", &a);
  JoinAndBind("b", &b);
  EXPECT_EQ(pool_.live(), 2);
  EXPECT_EQ(*pool_.Assign(Work(0, 0)), "a.host:7000");  // a tie: the earlier one
  EXPECT_EQ(*pool_.Assign(Work(0, 1)), "b.host:7000");
  EXPECT_EQ(*pool_.Assign(Work(0, 2)), "a.host:7000");
  EXPECT_EQ(*pool_.Assign(Work(1, 0)), "b.host:7000");
  // Step 0 again (a re-formed group): each shard to the feeder that holds it.
  v1::ShardWork again = Work(0, 1);
  again.set_ticket("again");
  EXPECT_EQ(*pool_.Assign(again), "b.host:7000");
  EXPECT_THAT(Tickets(a), ::testing::ElementsAre("t0.0", "t0.2"));
  EXPECT_THAT(Tickets(b), ::testing::ElementsAre("t0.1", "t1.0", "again"));
  // Step 0 commits: both hear it; a, now empty, takes the next shard.
  pool_.Release(1);
  ASSERT_TRUE(a.sent.back().has_release());
  EXPECT_EQ(a.sent.back().release().committed_steps(), 1u);
  EXPECT_TRUE(b.sent.back().has_release());
  EXPECT_EQ(*pool_.Assign(Work(1, 1)), "a.host:7000");
}

TEST_F(FeederPoolTest, AFeederLostWithWorkInFlightAsksForTheStepsAgain) {
  std::vector<std::string> reforms;
  pool_.SetOnLostWork([&](const std::string& why) { reforms.push_back(why); });
  FakeFeedLink a, b;
  const std::string ta = JoinAndBind("a", &a);
  const std::string tb = JoinAndBind("b", &b);
  pool_.Assign(Work(0, 0));  // a
  pool_.Release(1);
  pool_.Lost(ta, "its stream ended");  // nothing of it was in flight
  EXPECT_TRUE(reforms.empty());
  pool_.Assign(Work(1, 0));  // b, the only one left
  pool_.Lost(tb, "its stream ended");
  ASSERT_EQ(reforms.size(), 1u);
  EXPECT_THAT(reforms[0], HasSubstr("feeder 'b' was lost (its stream ended) with 1 shard(s)"));
  EXPECT_EQ(pool_.live(), 0);
  EXPECT_FALSE(pool_.Assign(Work(1, 0)).has_value());
  // The same id may join again once its old self is gone.
  FakeFeedLink b2;
  JoinAndBind("b", &b2);
  EXPECT_EQ(*pool_.Assign(Work(1, 0)), "b.host:7000");
  EXPECT_EQ(b2.sent.front().release().committed_steps(), 1u) << "a newcomer hears where the job is";
}

TEST_F(FeederPoolTest, JoinsAndBindsAreChecked) {
  FakeFeedLink a;
  JoinAndBind("a", &a);
  v1::FeederJoinReply twice;
  pool_.Join(Request("a"), &twice);
  EXPECT_FALSE(twice.accepted());
  EXPECT_THAT(twice.reason(), HasSubstr("feeder id 'a' is already in the job"));
  EXPECT_TRUE(absl::IsNotFound(pool_.Bind("no-such-token", &a)));
  v1::FeederJoinReply b;
  pool_.Join(Request("b"), &b);
  ASSERT_TRUE(pool_.Bind(b.session_token(), &a).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(pool_.Bind(b.session_token(), &a)));
}

TEST_F(FeederPoolTest, AwaitLiveWaitsOnTheClockForFeeders) {
  // None comes: the deadline on the fake clock ends the wait.
  bool waited = false;
  absl::Status none;
  std::thread t([&] { none = pool_.AwaitLive(1, clock_.Now() + 60, [&] { waited = true; }); });
  while (clock_.waiting() == 0) std::this_thread::yield();
  clock_.Advance(61);
  t.join();
  EXPECT_TRUE(waited);
  EXPECT_TRUE(absl::IsDeadlineExceeded(none)) << none;
  EXPECT_THAT(none.message(), HasSubstr("cluster.min_feeders"));
  // One comes.
  absl::Status one;
  std::thread u([&] { one = pool_.AwaitLive(1, clock_.Now() + 60, nullptr); });
  while (clock_.waiting() == 0) std::this_thread::yield();
  FakeFeedLink a;
  JoinAndBind("a", &a);
  u.join();
  EXPECT_TRUE(one.ok()) << one;
  // An abort ends a wait with its reason.
  pool_.Abort(absl::CancelledError("stopped"));
  EXPECT_EQ(pool_.AwaitLive(2, clock_.Now() + 60, nullptr).message(), "stopped");
}

TEST(FeederPoolSilenceTest, AFeederSilentPastTheHeartbeatTimeoutIsLost) {
  FakeClock clock;
  FeederPoolOptions o = Options();
  o.heartbeat_timeout_seconds = 10;
  FeederPool pool(o, clock);
  std::vector<std::string> lost;
  absl::Mutex mu;
  pool.SetOnLostWork([&](const std::string& why) {
    absl::MutexLock lock(&mu);
    lost.push_back(why);
  });
  FakeFeedLink link;
  v1::FeederJoinReply reply;
  pool.Join(Request("a"), &reply);
  ASSERT_TRUE(pool.Bind(reply.session_token(), &link).ok());
  ASSERT_TRUE(pool.Assign(Work(0, 0)).has_value());
  const auto parked = [&] { return clock.waiting() > 0; };
  while (!parked()) std::this_thread::yield();
  clock.Advance(6);
  pool.OnStatus(reply.session_token(), v1::FeederStatus());  // heard at +6: due at +16
  clock.Advance(6);                                          // +12
  while (!parked()) std::this_thread::yield();
  EXPECT_EQ(pool.live(), 1);
  clock.Advance(5);  // +17
  // The watch drops it, then calls back (outside the pool's lock).
  const auto called = [&] {
    absl::MutexLock lock(&mu);
    return !lost.empty();
  };
  for (int i = 0; i < 30000 && !called(); ++i) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(pool.live(), 0);
  EXPECT_EQ(link.closed, "error");
  absl::MutexLock lock(&mu);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_THAT(lost[0], HasSubstr("sent nothing for 10 s (cluster.heartbeat_timeout_seconds)"));
}

// A feeder whose status says a computation has run past the stall timeout (a stuck compute
// thread, its status thread alive) is lost, its stream closed, its work asked for again.
TEST(FeederPoolSilenceTest, AFeederStuckInAComputationIsLost) {
  FakeClock clock;
  FeederPoolOptions o = Options();
  o.stall_timeout_seconds = 300;
  FeederPool pool(o, clock);
  std::vector<std::string> lost;
  pool.SetOnLostWork([&](const std::string& why) { lost.push_back(why); });
  FakeFeedLink link;
  v1::FeederJoinReply reply;
  pool.Join(Request("a"), &reply);
  ASSERT_TRUE(pool.Bind(reply.session_token(), &link).ok());
  ASSERT_TRUE(pool.Assign(Work(0, 0)).has_value());
  v1::FeederStatus status;
  status.set_computing_seconds(299);
  pool.OnStatus(reply.session_token(), status);
  EXPECT_EQ(pool.live(), 1);
  status.set_computing_seconds(301);
  pool.OnStatus(reply.session_token(), status);
  EXPECT_EQ(pool.live(), 0);
  EXPECT_EQ(link.closed, "error");
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_THAT(lost[0], HasSubstr("a shard's computation has run for 301 s "
                                 "(cluster.stall_timeout_seconds)"));
}

// A feeder that joins and never opens its Feed stream (it crashed in between, a network cut) is
// dropped once the heartbeat timeout has passed since its join: it leaves the status rows.
TEST(FeederPoolSilenceTest, AFeederThatNeverOpensItsStreamIsDroppedAfterTheTimeout) {
  FakeClock clock;
  FeederPoolOptions o = Options();
  o.heartbeat_timeout_seconds = 10;
  FeederPool pool(o, clock);
  v1::FeederJoinReply reply;
  pool.Join(Request("a"), &reply);
  ASSERT_TRUE(reply.accepted());
  const auto rows = [&] {
    v1::StatusReply status;
    pool.Fill(&status);
    return status.feeders_size();
  };
  while (clock.waiting() == 0) std::this_thread::yield();
  clock.Advance(9);
  while (clock.waiting() == 0) std::this_thread::yield();
  EXPECT_EQ(rows(), 1);
  clock.Advance(2);
  for (int i = 0; i < 30000 && rows() > 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(rows(), 0);
  FakeFeedLink link;
  EXPECT_TRUE(absl::IsNotFound(pool.Bind(reply.session_token(), &link))) << "too late";
}

TEST_F(FeederPoolTest, StatusRowsAndMetricsSayWhoFeedsAndWhoIsMissing) {
  CoordinatorMetrics metrics("gloo", 10, 4);
  pool_.ReportTo(&metrics);
  absl::Status waited;
  std::thread t([&] { waited = pool_.AwaitLive(2, clock_.Now() + 60, nullptr); });
  while (clock_.waiting() == 0) std::this_thread::yield();
  EXPECT_THAT(metrics.Text(), HasSubstr("flashdraft_feeders_missing 2\n"));
  FakeFeedLink a, b;
  const std::string ta = JoinAndBind("a", &a);
  EXPECT_THAT(metrics.Text(), HasSubstr("flashdraft_feeders_missing 1\n"));
  v1::FeederJoinReply joining;
  pool_.Join(Request("b"), &joining);  // joined, no stream yet
  v1::FeederStatus status;
  status.set_held_bytes(2000000);
  status.set_shards_computed(7);
  clock_.Advance(3);
  pool_.OnStatus(ta, status);
  pool_.Assign(Work(0, 0));
  clock_.Advance(1);
  v1::StatusReply reply;
  pool_.Fill(&reply);
  ASSERT_EQ(reply.feeders_size(), 2);
  EXPECT_EQ(reply.feeders(0).feeder_id(), "a");
  EXPECT_EQ(reply.feeders(0).serve_address(), "a.host:7000");
  EXPECT_EQ(reply.feeders(0).seconds_since_heard(), 1);
  EXPECT_EQ(reply.feeders(0).held_bytes(), 2000000u);
  EXPECT_EQ(reply.feeders(0).shards_computed(), 7u);
  EXPECT_EQ(reply.feeders(0).shards_outstanding(), 1u);
  EXPECT_EQ(reply.feeders(1).seconds_since_heard(), -1) << "b has no stream yet";
  ASSERT_TRUE(pool_.Bind(joining.session_token(), &b).ok());
  t.join();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_THAT(metrics.Text(), HasSubstr("flashdraft_feeders 2\n"));
  EXPECT_THAT(metrics.Text(), HasSubstr("flashdraft_feeders_missing 0\n"));
}

// A feeder's /metrics (from its first status) is a scrape target while it is in the job; each
// change is told, the later statuses (without the address) change nothing.
TEST_F(FeederPoolTest, FeedersThatServeMetricsAreScrapeTargetsWhileInTheJob) {
  int changes = 0;
  pool_.SetOnScrapeTargetsChanged([&] { ++changes; });
  FakeFeedLink a, b;
  const std::string ta = JoinAndBind("a", &a);
  const std::string tb = JoinAndBind("b", &b);
  EXPECT_TRUE(pool_.ScrapeTargets().empty());
  v1::FeederStatus first;
  first.set_metrics_address("b.host:9500");
  pool_.OnStatus(tb, first);
  pool_.OnStatus(ta, v1::FeederStatus());  // a serves none
  pool_.OnStatus(tb, v1::FeederStatus());
  EXPECT_EQ(changes, 1);
  std::vector<ScrapeTarget> targets = pool_.ScrapeTargets();
  ASSERT_EQ(targets.size(), 1u);
  EXPECT_EQ(targets[0].address, "b.host:9500");
  EXPECT_EQ(targets[0].role, "feeder");
  EXPECT_EQ(targets[0].id, "b");
  pool_.Lost(ta, "gone");
  EXPECT_EQ(changes, 1) << "a was no target";
  pool_.Lost(tb, "gone");
  EXPECT_EQ(changes, 2);
  EXPECT_TRUE(pool_.ScrapeTargets().empty());
}

TEST_F(FeederPoolTest, FinishShutsEveryFeederDown) {
  FakeFeedLink a;
  JoinAndBind("a", &a);
  pool_.Finish("job finished");
  ASSERT_TRUE(a.sent.back().has_shutdown());
  EXPECT_EQ(a.sent.back().shutdown().reason(), "job finished");
  EXPECT_EQ(a.closed, "OK");
  v1::FeederJoinReply late;
  pool_.Join(Request("late"), &late);
  EXPECT_FALSE(late.accepted());
}

// A feeder's stream during a regeneration, read by the test while the pool's Regenerate runs on
// another thread: the lines it was sent, and how it was closed.
class LineLink : public FeedLink {
 public:
  void Send(grpc::ByteBuffer message) override {
    v1::FeedMessage m;
    ASSERT_TRUE(BufferToMessage(message, &m));
    absl::MutexLock lock(&mu_);
    if (m.has_regenerate()) lines_.push_back(m.regenerate().line());
  }
  void Close(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    closed_ = status.ok() ? "OK" : status.error_message();
  }
  std::vector<uint64_t> lines() const {
    absl::MutexLock lock(&mu_);
    return lines_;
  }
  std::string closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<uint64_t> lines_ ABSL_GUARDED_BY(mu_);
  std::string closed_ ABSL_GUARDED_BY(mu_);
};

std::vector<v1::RegenerateWork> Lines(uint64_t count) {
  std::vector<v1::RegenerateWork> lines;
  for (uint64_t i = 1; i <= count; ++i) {
    v1::RegenerateWork& w = lines.emplace_back();
    w.set_line(i);
    w.set_text(absl::StrCat("{\"line\": ", i, "}"));
  }
  return lines;
}

// An answer: the line's number as its one token (0 for a bad one).
v1::RegeneratedLine Answer(uint64_t line, bool good = true) {
  v1::RegeneratedLine a;
  a.set_line(line);
  a.add_input_ids(good ? static_cast<int64_t>(line) : 0);
  a.set_loss_mask(std::string(1, '\1'));
  return a;
}

// Regenerate on a thread of its own, and what it accepted.
class RegenerationTest : public FeederPoolTest {
 protected:
  void Start(uint64_t lines) {
    thread_ = std::thread([this, lines] {
      result_ = pool_.Regenerate(
          Lines(lines), 60,
          [this](v1::RegeneratedLine& a) {
            if (a.input_ids(0) == 0) return absl::InvalidArgumentError("token 0 is not allowed");
            absl::MutexLock lock(&mu_);
            accepted_.push_back(a.line());
            return absl::OkStatus();
          },
          [this](size_t n) {
            absl::MutexLock lock(&mu_);
            progress_ = n;
          });
    });
  }
  absl::Status Join() {
    thread_.join();
    return result_;
  }
  std::vector<uint64_t> accepted() const {
    absl::MutexLock lock(&mu_);
    std::vector<uint64_t> sorted = accepted_;
    std::sort(sorted.begin(), sorted.end());
    return sorted;
  }
  static bool Holds(const LineLink& link, size_t count) {
    return testing::Eventually([&] { return link.lines().size() == count; });
  }

  std::thread thread_;
  absl::Status result_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> accepted_ ABSL_GUARDED_BY(mu_);
  size_t progress_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(RegenerationTest, LinesSpreadOverTheFeedersAndALostFeedersLinesGoToOthers) {
  LineLink a, b;
  const std::string ta = JoinAndBind("a", &a);
  const std::string tb = JoinAndBind("b", &b);
  Start(10);
  // Four lines in flight each, alternately (a tie goes to the earlier feeder).
  ASSERT_TRUE(Holds(a, 4) && Holds(b, 4));
  EXPECT_THAT(a.lines(), ::testing::ElementsAre(1, 3, 5, 7));
  EXPECT_THAT(b.lines(), ::testing::ElementsAre(2, 4, 6, 8));
  pool_.OnRegenerated(ta, Answer(1));  // room at a: the next line
  ASSERT_TRUE(Holds(a, 5));
  EXPECT_EQ(a.lines().back(), 9u);
  // b goes with four lines: they wait for room, and a newcomer takes them.
  pool_.Lost(tb, "its stream ended");
  pool_.OnRegenerated(tb, Answer(2));  // a lost feeder's late answer: dropped
  pool_.OnRegenerated(ta, Answer(2));  // a line a does not hold: dropped
  LineLink c;
  const std::string tc = JoinAndBind("c", &c);
  ASSERT_TRUE(Holds(c, 4));
  EXPECT_THAT(c.lines(), ::testing::ElementsAre(2, 4, 6, 8));
  for (uint64_t line : {3, 5, 7, 9}) pool_.OnRegenerated(ta, Answer(line));
  ASSERT_TRUE(Holds(a, 6));
  EXPECT_EQ(a.lines().back(), 10u);
  for (uint64_t line : {2, 4, 6, 8}) pool_.OnRegenerated(tc, Answer(line));
  pool_.OnRegenerated(ta, Answer(10));
  ASSERT_TRUE(Join().ok()) << result_;
  EXPECT_THAT(accepted(), ::testing::ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9, 10));
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(progress_, 10u);
}

TEST_F(RegenerationTest, ARefusedAnswerDropsItsFeederAndItsLinesGoToAnother) {
  LineLink a, b;
  const std::string ta = JoinAndBind("a", &a);
  Start(2);
  ASSERT_TRUE(Holds(a, 2));
  pool_.OnRegenerated(ta, Answer(1, /*good=*/false));
  ASSERT_TRUE(testing::Eventually([&] { return pool_.live() == 0; }));
  EXPECT_THAT(a.closed(), HasSubstr("its answer for line 1 was refused: token 0 is not allowed"));
  const std::string tb = JoinAndBind("b", &b);
  ASSERT_TRUE(Holds(b, 2));
  EXPECT_THAT(b.lines(), ::testing::ElementsAre(1, 2));
  pool_.OnRegenerated(tb, Answer(1));
  pool_.OnRegenerated(tb, Answer(2));
  ASSERT_TRUE(Join().ok()) << result_;
  EXPECT_THAT(accepted(), ::testing::ElementsAre(1, 2));
}

TEST_F(RegenerationTest, ALineThatTakesThreeFeedersDownFailsNamingIt) {
  LineLink links[3];
  Start(1);
  for (int i = 0; i < 3; ++i) {
    const std::string token = JoinAndBind(absl::StrCat("f", i), &links[i]);
    ASSERT_TRUE(Holds(links[i], 1)) << i;
    pool_.Lost(token, absl::StrCat("crashed ", i));
  }
  const absl::Status s = Join();
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("line 1 of the data file: 3 feeders were lost or refused"));
  EXPECT_THAT(s.message(), HasSubstr("the last: crashed 2"));
}

TEST_F(RegenerationTest, WithNoFeederLiveItWaitsThenGivesUp) {
  Start(3);
  ASSERT_TRUE(testing::Eventually([&] { return clock_.waiting() > 0; }));
  clock_.Advance(61);
  const absl::Status s = Join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("no feeder was live for 60 s"));
}

TEST_F(RegenerationTest, AnAbortEndsIt) {
  LineLink a;
  JoinAndBind("a", &a);
  Start(3);
  ASSERT_TRUE(Holds(a, 3));
  pool_.Abort(absl::CancelledError("stopped"));
  EXPECT_EQ(Join().message(), "stopped");
}

}  // namespace
}  // namespace flashdraft
