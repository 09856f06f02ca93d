#include "feeder/feeder_service.h"

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/chunk_wire.h"
#include "common/grpc_reactors.h"
#include "common/grpc_status.h"
#include "flashdraft/v1/feeder.grpc.pb.h"

namespace flashdraft {
namespace {

// One FetchShard call: waits on the store for the ticket's shard, then writes its messages one at
// a time. Exactly one of the store's answer and a cancellation starts the reply (the store hands a
// waiter out once: CancelWait fails when the answer is already on its way).
class FetchShardReactor : public SequentialWriteReactor {
 public:
  FetchShardReactor(ShardStore& store, const v1::FetchShardRequest& fetch, FeederMetrics* metrics)
      : store_(store), metrics_(metrics) {
    const uint64_t id = store_.WhenReady(
        fetch.ticket(), fetch.step(), [this](absl::StatusOr<std::vector<grpc::ByteBuffer>> answer) {
          OnAnswer(std::move(answer));
        });
    absl::MutexLock lock(&mu_);
    wait_id_ = id;
  }

  void OnCancel() override {
    uint64_t id;
    {
      absl::MutexLock lock(&mu_, absl::Condition(this, &FetchShardReactor::HasWaitIdLocked));
      id = wait_id_;
    }
    if (store_.CancelWait(id)) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

 private:
  bool HasWaitIdLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wait_id_ != 0; }

  void OnAnswer(absl::StatusOr<std::vector<grpc::ByteBuffer>> answer) {
    if (!answer.ok()) {
      Finish(ToGrpcStatus(answer.status()));
      return;
    }
    messages_ = *std::move(answer);
    WriteNext();
  }
  // Writes happen one after another (each from the previous one's OnWriteDone): no lock needed.
  void WriteNext() override {
    if (next_ >= messages_.size()) {
      Finish(grpc::Status::OK);
      return;
    }
    if (metrics_ != nullptr) metrics_->AddSentBytes(messages_[next_].Length());
    StartWrite(&messages_[next_++]);
  }

  ShardStore& store_;
  FeederMetrics* const metrics_;
  absl::Mutex mu_;
  uint64_t wait_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<grpc::ByteBuffer> messages_;
  size_t next_ = 0;
};

class FeederServiceImpl : public v1::Feeder::WithRawCallbackMethod_FetchShard<v1::Feeder::Service> {
 public:
  FeederServiceImpl(ShardStore& store, ServerSecurity& security, FeederMetrics* metrics)
      : store_(store), security_(security), metrics_(metrics) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchShard(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* request) override {
    using Refuse = Refusal<grpc::ServerWriteReactor<grpc::ByteBuffer>>;
    if (grpc::Status s = security_.Authenticate(*ctx); !s.ok()) return new Refuse(s);
    v1::FetchShardRequest fetch;
    if (!BufferToMessage(*request, &fetch) || fetch.ticket().empty()) {
      return new Refuse(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed FetchShardRequest"));
    }
    return new FetchShardReactor(store_, fetch, metrics_);
  }

 private:
  ShardStore& store_;
  ServerSecurity& security_;
  FeederMetrics* const metrics_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewFeederService(ShardStore& store, ServerSecurity& security,
                                                FeederMetrics* metrics) {
  return std::make_unique<FeederServiceImpl>(store, security, metrics);
}

}  // namespace flashdraft
