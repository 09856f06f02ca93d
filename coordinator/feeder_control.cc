#include "coordinator/feeder_control.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/grpc_reactors.h"
#include "common/grpc_status.h"
#include "common/queued_writer.h"
#include "flashdraft/v1/feeder.grpc.pb.h"

namespace flashdraft {
namespace {

// One feeder's Feed stream: FeedMessages go out through the queue, FeederMessages come in.
class FeedSession
    : public QueuedWriter<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>>,
      public FeedLink {
 public:
  explicit FeedSession(FeederPool& pool) : pool_(pool) { StartRead(&in_bytes_); }

  void Send(grpc::ByteBuffer message) override { QueuedWriter::Send(std::move(message)); }
  void Close(const grpc::Status& status) override { FinishAfterWrites(status); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      End("its stream ended");
      FinishAfterWrites(grpc::Status::OK);
      return;
    }
    if (!BufferToMessage(in_bytes_, &in_)) {
      End("failed: sent a malformed FeederMessage");
      FinishAfterWrites(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed FeederMessage"));
      return;
    }
    if (token_.empty()) {
      // The first message binds the stream to the feeder's session token.
      if (absl::Status bound = pool_.Bind(in_.session_token(), this); !bound.ok()) {
        FinishAfterWrites(ToGrpcStatus(bound));
        return;
      }
      token_ = in_.session_token();
    } else if (in_.session_token() != token_) {
      End("failed: changed its session token on its stream");
      FinishAfterWrites(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "token changed"));
      return;
    }
    if (in_.kind_case() == v1::FeederMessage::kError) {
      End(absl::StrCat("failed: ", Untrusted(in_.error(), 512)));
      FinishAfterWrites(grpc::Status::OK);
      return;
    }
    if (in_.kind_case() == v1::FeederMessage::kStatus) pool_.OnStatus(token_, in_.status());
    if (in_.kind_case() == v1::FeederMessage::kRegenerated) {
      pool_.OnRegenerated(token_, std::move(*in_.mutable_regenerated()));
    }
    StartRead(&in_bytes_);
  }

  void OnDone() override {
    End("its stream ended");
    delete this;
  }

 private:
  // The pool forgets this link before the reactor goes (Lost is idempotent).
  void End(const std::string& why) {
    if (!token_.empty()) pool_.Lost(token_, why);
  }

  FeederPool& pool_;
  grpc::ByteBuffer in_bytes_;
  v1::FeederMessage in_;
  std::string token_;  // empty until the first message
};

class FeederControlImpl
    : public v1::FeederControl::WithCallbackMethod_JoinFeeder<
          v1::FeederControl::WithRawCallbackMethod_Feed<v1::FeederControl::Service>> {
 public:
  FeederControlImpl(FeederPool& pool, ServerSecurity& security)
      : pool_(pool), security_(security) {}

  grpc::ServerUnaryReactor* JoinFeeder(grpc::CallbackServerContext* ctx,
                                       const v1::FeederJoinRequest* request,
                                       v1::FeederJoinReply* reply) override {
    auto* reactor = ctx->DefaultReactor();
    if (grpc::Status s = security_.Authenticate(*ctx); !s.ok()) {
      reactor->Finish(std::move(s));
      return reactor;
    }
    pool_.Join(*request, reply);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Feed(
      grpc::CallbackServerContext* ctx) override {
    if (grpc::Status s = security_.Authenticate(*ctx); !s.ok()) {
      return new Refusal<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>>(s);
    }
    return new FeedSession(pool_);
  }

 private:
  FeederPool& pool_;
  ServerSecurity& security_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewFeederControlService(FeederPool& pool, ServerSecurity& security) {
  return std::make_unique<FeederControlImpl>(pool, security);
}

}  // namespace flashdraft
