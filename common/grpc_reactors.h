// Callback-API reactors that delete themselves when their call is done.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/status.h>

#include <utility>

namespace flashdraft {

// A streaming call answered at once with a status (unauthenticated, malformed): the reactor a
// method returns instead of serving it.
template <typename Reactor>
struct Refusal : Reactor {
  explicit Refusal(grpc::Status status) { this->Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

// A server stream whose writes go one after another, each started from the previous one's
// OnWriteDone (so the subclass's write state needs no lock); a failed write ends the call.
class SequentialWriteReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
      return;
    }
    WriteNext();
  }
  void OnDone() override { delete this; }

 protected:
  // Starts the next write, or finishes the call.
  virtual void WriteNext() = 0;
};

}  // namespace flashdraft
