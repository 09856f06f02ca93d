#include "common/raw_client_stream.h"

#include <grpcpp/generic/async_generic_service.h>
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "common/chunk_wire.h"
#include "flashdraft/v1/coordinator.pb.h"

namespace flashdraft {
namespace {

// Echoes every message of any call; after a message "end" it finishes the call with
// FAILED_PRECONDITION "told to end".
class EchoReactor : public grpc::ServerGenericBidiReactor {
 public:
  EchoReactor() { StartRead(&in_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    v1::StoreSet set;
    if (BufferToMessage(in_, &set) && set.key() == "end") {
      Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "told to end"));
      return;
    }
    out_ = in_;
    StartWrite(&out_);
  }
  void OnWriteDone(bool ok) override {
    if (ok) StartRead(&in_);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer in_, out_;
};

class EchoService : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new EchoReactor();
  }
};

class RawClientStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_GT(port_, 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override { server_->Shutdown(); }

  static grpc::ByteBuffer Message(const std::string& key) {
    v1::StoreSet set;
    set.set_key(key);
    return MessageToBuffer(set);
  }
  static std::string Key(const grpc::ByteBuffer& buffer) {
    v1::StoreSet set;
    EXPECT_TRUE(BufferToMessage(buffer, &set));
    return set.key();
  }

  EchoService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(RawClientStreamTest, WritersOnSeveralThreadsAndOneReader) {
  grpc::ClientContext ctx;
  RawClientStream stream(channel_, "/any.Service/Echo", &ctx);
  std::thread a([&] {
    for (int i = 0; i < 50; ++i) ASSERT_TRUE(stream.Write(Message("a" + std::to_string(i))));
  });
  std::thread b([&] {
    for (int i = 0; i < 50; ++i) ASSERT_TRUE(stream.Write(Message("b" + std::to_string(i))));
  });
  std::set<std::string> seen;
  grpc::ByteBuffer buffer;
  for (int i = 0; i < 100 && stream.Read(&buffer); ++i) seen.insert(Key(buffer));
  a.join();
  b.join();
  EXPECT_EQ(seen.size(), 100u);
  stream.WritesDone();
  EXPECT_FALSE(stream.Write(Message("late")));  // after the half-close
  EXPECT_FALSE(stream.Read(&buffer));
  EXPECT_TRUE(stream.Finish().ok());
}

TEST_F(RawClientStreamTest, TheServersEndAndACancelEndTheCall) {
  {
    grpc::ClientContext ctx;
    RawClientStream stream(channel_, "/any.Service/Echo", &ctx);
    ASSERT_TRUE(stream.Write(Message("end")));
    grpc::ByteBuffer buffer;
    EXPECT_FALSE(stream.Read(&buffer));
    const grpc::Status status = stream.Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(status.error_message(), "told to end");
    EXPECT_FALSE(stream.Write(Message("after the end")));
  }
  grpc::ClientContext ctx;
  RawClientStream stream(channel_, "/any.Service/Echo", &ctx);
  grpc::ByteBuffer buffer;
  std::thread reader([&] { EXPECT_FALSE(stream.Read(&buffer)); });  // blocks until the cancel
  ctx.TryCancel();
  reader.join();
  EXPECT_EQ(stream.Finish().error_code(), grpc::StatusCode::CANCELLED);
}

}  // namespace
}  // namespace flashdraft
