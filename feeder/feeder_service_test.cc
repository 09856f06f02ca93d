#include "feeder/feeder_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/file_util.h"
#include "flashdraft/v1/feeder.grpc.pb.h"
#include "tests/support/test_util.h"

namespace flashdraft {
namespace {

using ::testing::HasSubstr;

v1::ShardWork Work(std::string ticket, uint64_t step) {
  v1::ShardWork work;
  work.set_ticket(std::move(ticket));
  work.mutable_header()->set_step(step);
  work.mutable_header()->set_num_tensors(1);
  return work;
}

// One chunk message of a 5-byte tensor "t".
std::vector<grpc::ByteBuffer> OneChunk() {
  static const uint8_t kData[] = {1, 2, 3, 4, 5};
  std::vector<grpc::ByteBuffer> out;
  EXPECT_TRUE(EncodeTensorBuffers({"t", DType::kU8, {5}}, kData, 5, 1 << 20, nullptr,
                                  kCoordinatorMessageChunkField, &out)
                  .ok());
  return out;
}

// A real server on 127.0.0.1:0 that asks for the job secret, and a client that has it.
class FeederServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string token = dir_.Join("token");
    ASSERT_TRUE(WriteFileAtomically(token, "a-job-secret-of-some-length\n").ok());
    chmod(token.c_str(), 0600);
    SecurityConfig config;
    config.token_file = token;
    security_ = *ServerSecurity::Create(config, RealClock::Get());
    service_ = NewFeederService(store_, *security_, &metrics_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", security_->credentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_GT(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
    ClientSecurity client;
    client.token_file = token;
    stub_ = v1::Feeder::NewStub(*CreateSecureChannel(address_, client));
  }
  void TearDown() override {
    store_.Shutdown(absl::CancelledError("test over"));
    server_->Shutdown();
  }

  // Fetches `ticket`: the messages received and the call's status.
  std::pair<std::vector<v1::CoordinatorMessage>, grpc::Status> Fetch(const std::string& ticket,
                                                                     uint64_t step,
                                                                     double timeout = 30) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000)));
    v1::FetchShardRequest request;
    request.set_ticket(ticket);
    request.set_step(step);
    auto reader = stub_->FetchShard(&ctx, request);
    std::vector<v1::CoordinatorMessage> got;
    v1::CoordinatorMessage m;
    while (reader->Read(&m)) got.push_back(m);
    return {got, reader->Finish()};
  }

  testing::TempDir dir_;
  ShardStore store_{1 << 20};
  FeederMetrics metrics_{"cpu"};
  std::unique_ptr<ServerSecurity> security_;
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<v1::Feeder::Stub> stub_;
};

TEST_F(FeederServiceTest, AFetchWaitsForTheShardAndGetsTheTrainStreamsMessages) {
  ASSERT_TRUE(store_.Assign(Work("t1", 4), 5).ok());
  std::pair<std::vector<v1::CoordinatorMessage>, grpc::Status> fetched;
  std::thread worker([&] { fetched = Fetch("t1", 4); });
  ASSERT_TRUE(testing::Eventually([&] { return store_.stats().waiting == 1; }));
  std::optional<ShardStore::Pending> p = store_.NextToCompute();
  ASSERT_TRUE(p.has_value());
  store_.Complete(p->key, OneChunk());
  worker.join();
  ASSERT_TRUE(fetched.second.ok()) << fetched.second.error_message();
  ASSERT_EQ(fetched.first.size(), 2u);
  EXPECT_EQ(fetched.first[0].microbatch().step(), 4u);
  const v1::TensorChunk& chunk = fetched.first[1].tensor_chunk();
  EXPECT_EQ(chunk.name(), "t");
  EXPECT_EQ(chunk.data(), std::string("\1\2\3\4\5"));
  // Counted as sent: both messages, as they went on the wire.
  const size_t sent = fetched.first[0].ByteSizeLong() + fetched.first[1].ByteSizeLong();
  EXPECT_THAT(metrics_.Text(),
              HasSubstr(absl::StrCat("flashdraft_feeder_sent_bytes_total ", sent, "\n")));
}

TEST_F(FeederServiceTest, UnknownTicketsAndStrangersAreRefused) {
  store_.Release(3);
  auto unknown = Fetch("nope", 2);
  EXPECT_EQ(unknown.second.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(unknown.second.error_message(), HasSubstr("'nope'"));
  auto empty = Fetch("", 4);
  EXPECT_EQ(empty.second.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  auto stranger = v1::Feeder::NewStub(*CreateSecureChannel(address_, ClientSecurity{}));
  grpc::ClientContext ctx;
  v1::FetchShardRequest request;
  request.set_ticket("t1");
  auto reader = stranger->FetchShard(&ctx, request);
  v1::CoordinatorMessage m;
  EXPECT_FALSE(reader->Read(&m));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(FeederServiceTest, AFetchBeforeItsShardWorkWaitsForIt) {
  std::pair<std::vector<v1::CoordinatorMessage>, grpc::Status> fetched;
  std::thread worker([&] { fetched = Fetch("t2", 7); });
  ASSERT_TRUE(testing::Eventually([&] { return store_.stats().waiting == 1; }));
  ASSERT_TRUE(store_.Assign(Work("t2", 7), 5).ok());  // the Feed stream was slower
  std::optional<ShardStore::Pending> p = store_.NextToCompute();
  ASSERT_TRUE(p.has_value());
  store_.Complete(p->key, OneChunk());
  worker.join();
  ASSERT_TRUE(fetched.second.ok()) << fetched.second.error_message();
  EXPECT_EQ(fetched.first.size(), 2u);
}

TEST_F(FeederServiceTest, AFetchThatGivesUpLeavesNothingBehind) {
  ASSERT_TRUE(store_.Assign(Work("slow", 0), 5).ok());
  auto late = Fetch("slow", 0, /*timeout=*/0.3);  // never computed in time
  EXPECT_EQ(late.second.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(testing::Eventually([&] { return store_.stats().waiting == 0; }));
  // The abandoned wait is gone: completing the shard calls nobody, and a new fetch gets it.
  std::optional<ShardStore::Pending> p = store_.TryNextToCompute();
  ASSERT_TRUE(p.has_value());
  store_.Complete(p->key, OneChunk());
  auto again = Fetch("slow", 0);
  ASSERT_TRUE(again.second.ok()) << again.second.error_message();
  EXPECT_EQ(again.first.size(), 2u);
}

TEST_F(FeederServiceTest, AFetchOfAReleasedStepFails) {
  ASSERT_TRUE(store_.Assign(Work("old", 0), 5).ok());
  std::pair<std::vector<v1::CoordinatorMessage>, grpc::Status> fetched;
  std::thread worker([&] { fetched = Fetch("old", 0); });
  // The step commits (the worker got its shard elsewhere, or is gone) while the fetch waits.
  ASSERT_TRUE(testing::Eventually([&] { return store_.stats().waiting == 1; }));
  store_.Release(1);
  worker.join();
  EXPECT_EQ(fetched.second.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(fetched.first.empty());
}

}  // namespace
}  // namespace flashdraft
