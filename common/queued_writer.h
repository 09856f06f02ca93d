// The outbound half of a callback-API server stream: any thread may Send() a message; the reactor
// keeps one write in flight and starts the next from OnWriteDone, so nothing ever blocks in a
// reaction. `Reactor` is grpc::ServerWriteReactor<grpc::ByteBuffer> or
// grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace flashdraft {

template <typename Reactor>
class QueuedWriter : public Reactor {
 public:
  // Queues `message`; dropped once the stream is finishing or broken.
  void Send(grpc::ByteBuffer message) ABSL_LOCKS_EXCLUDED(write_mu_) {
    absl::MutexLock lock(&write_mu_);
    if (finished_ || finish_pending_) return;
    queue_.push_back(std::move(message));  // deque: the front's address stays valid
    if (!writing_) {
      writing_ = true;
      this->StartWrite(&queue_.front());
    }
  }

  // Finishes once every queued message has been written (at once when none is queued).
  void FinishAfterWrites(grpc::Status status) ABSL_LOCKS_EXCLUDED(write_mu_) {
    absl::MutexLock lock(&write_mu_);
    if (finished_ || finish_pending_) return;
    finish_status_ = std::move(status);
    finish_pending_ = true;
    if (!writing_) FinishLocked();
  }

  void OnWriteDone(bool ok) ABSL_LOCKS_EXCLUDED(write_mu_) override {
    absl::MutexLock lock(&write_mu_);
    queue_.pop_front();
    if (!ok) {  // the peer is gone: drop the rest
      queue_.clear();
      writing_ = false;
      if (!finished_) {
        finish_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed");
        FinishLocked();
      }
      return;
    }
    if (!queue_.empty() && !finished_) {
      this->StartWrite(&queue_.front());
    } else {
      writing_ = false;
      if (finish_pending_) FinishLocked();
    }
  }

 private:
  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) {
    finished_ = true;
    this->Finish(finish_status_);
  }

  absl::Mutex write_mu_;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(write_mu_);
  bool writing_ ABSL_GUARDED_BY(write_mu_) = false;
  bool finished_ ABSL_GUARDED_BY(write_mu_) = false;
  bool finish_pending_ ABSL_GUARDED_BY(write_mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(write_mu_);
};

}  // namespace flashdraft
