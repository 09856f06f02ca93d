#include "coordinator/service.h"

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/grpc_reactors.h"
#include "common/grpc_status.h"
#include "common/tensor_codec.h"
#include "flashdraft/v1/coordinator.grpc.pb.h"

namespace flashdraft {
namespace {

// FetchTensors: tensors of mapped safetensors files (the frozen target tensors, the drafter's
// starting weights) as chunks, one write in flight, each chunk encoded right before its write as a
// slice of the mapped file (no copy).
class FetchReactor : public SequentialWriteReactor {
 public:
  FetchReactor(std::vector<FetchEntry> entries, size_t max_chunk_bytes)
      : entries_(std::move(entries)), max_chunk_bytes_(max_chunk_bytes) {
    WriteNext();
  }

 private:
  void WriteNext() override {
    while (true) {
      // An empty tensor still sends its one (empty) chunk: num_chunks is at least 1.
      if (tensor_ >= 0 && next_index_ < header_.num_chunks()) {
        const uint64_t offset = uint64_t{next_index_} * max_chunk_bytes_;
        header_.set_offset(offset);
        header_.set_chunk_index(next_index_++);
        buffer_ = EncodeChunkBuffer(header_, view_.data + offset,
                                    std::min<uint64_t>(max_chunk_bytes_, view_.nbytes - offset),
                                    entries_[tensor_].file, /*wrapper_field=*/0);
        StartWrite(&buffer_);
        return;
      }
      ++tensor_;
      if (tensor_ >= static_cast<int>(entries_.size())) {
        Finish(grpc::Status::OK);
        return;
      }
      const FetchEntry& entry = entries_[tensor_];
      absl::StatusOr<TensorView> view = entry.file->Get(entry.name);
      if (!view.ok()) {
        Finish(ToGrpcStatus(view.status()));
        return;
      }
      view_ = *view;
      header_.Clear();
      absl::StatusOr<uint32_t> chunks = StartChunkHeader(
          {entry.wire_name, view_.dtype, view_.shape}, view_.nbytes, max_chunk_bytes_, header_);
      if (!chunks.ok()) {
        Finish(ToGrpcStatus(chunks.status()));
        return;
      }
      next_index_ = 0;
    }
  }

  std::vector<FetchEntry> entries_;
  size_t max_chunk_bytes_;
  int tensor_ = -1;
  TensorView view_;
  v1::TensorChunk header_;
  uint32_t next_index_ = 0;
  grpc::ByteBuffer buffer_;
};

// Train and FetchTensors are raw methods (ByteBuffers) so that tensor bytes are never copied into
// or out of protobuf messages; the bytes on the wire are the same protobuf encoding.
//
// Every method first checks the job secret (ServerSecurity::Authenticate).

class CoordinatorServiceImpl
    : public v1::Coordinator::WithCallbackMethod_Join<v1::Coordinator::WithRawCallbackMethod_Train<
          v1::Coordinator::WithRawCallbackMethod_FetchTensors<
              v1::Coordinator::WithCallbackMethod_Status<v1::Coordinator::WithCallbackMethod_Store<
                  v1::Coordinator::WithCallbackMethod_Drain<v1::Coordinator::Service>>>>>> {
 public:
  explicit CoordinatorServiceImpl(ServiceParts parts) : p_(std::move(parts)) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* request,
                                 v1::JoinReply* reply) override {
    auto* reactor = ctx->DefaultReactor();
    if (Refused(*ctx, reactor)) return reactor;
    p_.controller->Join(*request, reply);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Train(
      grpc::CallbackServerContext* ctx) override {
    using Refuse = Refusal<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>>;
    if (grpc::Status s = p_.security->Authenticate(*ctx); !s.ok()) return new Refuse(s);
    return new TrainSession(p_.controller, p_.streams);
  }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchTensors(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request_bytes) override {
    using Refuse = Refusal<grpc::ServerWriteReactor<grpc::ByteBuffer>>;
    if (grpc::Status s = p_.security->Authenticate(*ctx); !s.ok()) return new Refuse(s);
    v1::FetchTensorsRequest request;
    if (!BufferToMessage(*request_bytes, &request)) {
      return new Refuse(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed FetchTensorsRequest"));
    }
    if (!p_.controller->Valid(request.session_token())) {
      return new Refuse(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "unknown session token"));
    }
    absl::StatusOr<std::vector<FetchEntry>> entries =
        p_.catalog->Resolve({request.names().begin(), request.names().end()});
    if (!entries.ok()) return new Refuse(ToGrpcStatus(entries.status()));
    return NewFetchReactor(*std::move(entries));
  }

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx, const v1::StatusRequest*,
                                   v1::StatusReply* reply) override {
    auto* reactor = ctx->DefaultReactor();
    if (Refused(*ctx, reactor)) return reactor;
    p_.status(reply);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* Store(grpc::CallbackServerContext* ctx, const v1::StoreRequest* req,
                                  v1::StoreReply* reply) override {
    auto* reactor = ctx->DefaultReactor();
    if (Refused(*ctx, reactor)) return reactor;
    if (!p_.controller->Valid(req->session_token())) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "unknown session token"));
      return reactor;
    }
    RendezvousStore& store = *p_.store;
    absl::Status status;
    switch (req->op_case()) {
      case v1::StoreRequest::kSet:
        status = store.Set(req->set().key(), req->set().value());
        break;
      case v1::StoreRequest::kGet: {
        std::string value;
        reply->set_ready(store.Get(req->get().key(), &value));
        reply->set_value(std::move(value));
        break;
      }
      case v1::StoreRequest::kAdd: {
        absl::StatusOr<int64_t> counter = store.Add(req->add().key(), req->add().delta());
        if (counter.ok()) reply->set_counter(*counter);
        status = counter.status();
        break;
      }
      case v1::StoreRequest::kCheck:
        reply->set_ready(store.Check({req->check().keys().begin(), req->check().keys().end()}));
        break;
      case v1::StoreRequest::kDeleteKey:
        reply->set_deleted(store.Delete(req->delete_key().key()));
        break;
      case v1::StoreRequest::kNumKeys:
        reply->set_counter(store.NumKeys());
        break;
      default:
        status = absl::InvalidArgumentError("empty store request");
        break;
    }
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }

  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* ctx, const v1::DrainRequest* request,
                                  v1::DrainReply* reply) override {
    auto* reactor = ctx->DefaultReactor();
    if (Refused(*ctx, reactor)) return reactor;
    p_.controller->Drain(*request, reply);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  // A call without the job secret is finished here with UNAUTHENTICATED (true).
  bool Refused(grpc::CallbackServerContext& ctx, grpc::ServerUnaryReactor* reactor) {
    grpc::Status s = p_.security->Authenticate(ctx);
    if (s.ok()) return false;
    reactor->Finish(std::move(s));
    return true;
  }

  ServiceParts p_;
};

}  // namespace

TrainSession::TrainSession(MembershipController* controller, StreamRegistry* streams)
    : controller_(controller), streams_(streams) {
  streams_->Opened(this);
  controller_->StreamOpened();  // its bind deadline
  StartRead(&in_bytes_);
}

void TrainSession::Ended(const std::string& why) {
  const std::string token = streams_->Ended(this);
  if (!token.empty()) controller_->Lost(token, why);
}

void TrainSession::OnReadDone(bool ok) {
  if (!ok) {
    Ended("the worker closed its stream");
    FinishAfterWrites(grpc::Status::OK);
    return;
  }
  if (!BufferToMessage(in_bytes_, &in_)) {
    if (!token_.empty()) controller_->Lost(token_, "failed: sent a malformed WorkerMessage");
    FinishAfterWrites(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed WorkerMessage"));
    return;
  }
  if (token_.empty()) {
    // The first message identifies the worker and binds its token to this stream.
    absl::Status bound = controller_->Bind(in_.session_token(),
                                           [this] { streams_->Attach(this, in_.session_token()); });
    if (!bound.ok()) {
      FinishAfterWrites(ToGrpcStatus(bound));
      return;
    }
    token_ = in_.session_token();
  } else if (in_.session_token() != token_) {
    controller_->Lost(token_, "failed: changed its session token on its stream");
    FinishAfterWrites(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "token changed"));
    return;
  }
  Dispatch();
  StartRead(&in_bytes_);
}

void TrainSession::Dispatch() {
  switch (in_.kind_case()) {
    case v1::WorkerMessage::kAck:
      controller_->OnAck(token_, in_.ack());
      break;
    case v1::WorkerMessage::kHeartbeat:
      controller_->OnHeartbeat(token_, in_.heartbeat());
      break;
    case v1::WorkerMessage::kError:
      controller_->Lost(token_, absl::StrCat("failed: ", in_.error()));
      break;
    case v1::WorkerMessage::kCheckpoint:
      controller_->OnCheckpointUpload(token_, in_.checkpoint());
      break;
    case v1::WorkerMessage::kTensorChunk:
      controller_->OnCheckpointChunk(token_, in_.tensor_chunk());
      break;
    case v1::WorkerMessage::kCollectiveFailure:
      controller_->OnCollectiveFailure(token_, in_.collective_failure());
      break;
    case v1::WorkerMessage::kLeave:
      controller_->OnLeave(token_, in_.leave().reason());
      break;
    default:
      break;
  }
}

void TrainSession::OnDone() {
  Ended("the stream ended");
  delete this;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewFetchReactor(std::vector<FetchEntry> entries,
                                                            size_t max_chunk_bytes) {
  return new FetchReactor(std::move(entries), max_chunk_bytes);
}

std::unique_ptr<grpc::Service> NewCoordinatorService(ServiceParts parts) {
  return std::make_unique<CoordinatorServiceImpl>(std::move(parts));
}

}  // namespace flashdraft
