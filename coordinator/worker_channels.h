// How the coordinator's protocol logic reaches the workers: one Train stream per session token.
// StreamRegistry (coordinator/stream_registry.h) implements it over gRPC reactors;
// FakeWorkerChannels (below) records what was sent, for the step protocol's unit tests.
//
// Every method is non-blocking (it queues) and thread-safe.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/chunk_wire.h"
#include "flashdraft/v1/coordinator.pb.h"

namespace flashdraft {

class WorkerChannels {
 public:
  virtual ~WorkerChannels() = default;
  // Queues `message` on `token`'s Train stream; false when the token has no stream.
  virtual bool Send(const std::string& token, grpc::ByteBuffer message) = 0;
  // Ends `token`'s stream with `status` once what is queued (and `last`, when given) is written;
  // the stream is forgotten. Nothing happens when the token has no stream.
  virtual void Close(const std::string& token, const grpc::Status& status,
                     const grpc::ByteBuffer* last = nullptr) = 0;
  // Close() on every bound stream.
  virtual void CloseAll(const grpc::Status& status, const grpc::ByteBuffer* last = nullptr) = 0;
  // Ends the streams that sent no first message within `timeout_seconds` of opening, as of `now`
  // (DEADLINE_EXCEEDED naming the timeout); returns when the next remaining one expires
  // (infinity: none). A stream expires at exactly its open time + timeout (as Membership's
  // deadlines do), so a wait until that moment never finds nothing to do.
  virtual double CloseUnbound(double now, double timeout_seconds) = 0;
};

// For tests: a queue of what was sent to whom, in order, and the status each stream was closed
// with; thread-safe.
class FakeWorkerChannels : public WorkerChannels {
 public:
  struct Sent {
    std::string token;
    v1::CoordinatorMessage message;
  };
  // A token has a stream (Send succeeds) once attached, until closed.
  void Attach(const std::string& token) {
    absl::MutexLock lock(&mu_);
    open_[token] = true;
  }
  bool Send(const std::string& token, grpc::ByteBuffer message) override {
    absl::MutexLock lock(&mu_);
    if (!open_[token]) return false;
    PushLocked(token, &message);
    return true;
  }
  void Close(const std::string& token, const grpc::Status& status,
             const grpc::ByteBuffer* last) override {
    absl::MutexLock lock(&mu_);
    CloseLocked(token, status, last);
  }
  void CloseAll(const grpc::Status& status, const grpc::ByteBuffer* last) override {
    absl::MutexLock lock(&mu_);
    for (auto& [token, open] : open_) {
      if (open) CloseLocked(token, status, last);
    }
  }
  double CloseUnbound(double, double) override { return std::numeric_limits<double>::infinity(); }

  // The oldest message not taken yet, waiting up to `seconds` of real time for one (a safety net
  // against a hung test: the protocol itself never waits on real time here); none: timed out.
  std::optional<Sent> Next(double seconds = 30) {
    absl::MutexLock lock(&mu_);
    auto any = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !queue_.empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&any), absl::Seconds(seconds))) return std::nullopt;
    Sent next = std::move(queue_.front());
    queue_.pop_front();
    return next;
  }
  bool closed(const std::string& token) const {
    absl::MutexLock lock(&mu_);
    return closed_.count(token) > 0;
  }
  grpc::Status close_status(const std::string& token) const {
    absl::MutexLock lock(&mu_);
    auto it = closed_.find(token);
    return it == closed_.end() ? grpc::Status::OK : it->second;
  }

 private:
  void PushLocked(const std::string& token, const grpc::ByteBuffer* message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Sent sent{token, {}};
    if (BufferToMessage(*message, &sent.message)) queue_.push_back(std::move(sent));
  }
  void CloseLocked(const std::string& token, const grpc::Status& status,
                   const grpc::ByteBuffer* last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!open_[token]) return;
    if (last != nullptr) PushLocked(token, last);
    open_[token] = false;
    closed_[token] = status;
  }

  mutable absl::Mutex mu_;
  std::map<std::string, bool> open_ ABSL_GUARDED_BY(mu_);
  std::deque<Sent> queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, grpc::Status> closed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashdraft
