// The worker's end of its Train stream as the session logic sees it: raw messages in (tensor
// chunks stay in gRPC's buffers until they are assembled), WorkerMessages out. The session's
// protocol (worker/worker_session.h) runs over this interface, so tests drive it with a fake link
// instead of a network; GrpcCoordinatorLink is the real one.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/raw_client_stream.h"
#include "flashdraft/v1/coordinator.pb.h"

namespace flashdraft {

class CoordinatorLink {
 public:
  virtual ~CoordinatorLink() = default;
  // The next message from the coordinator; false once the stream has no more. One reader thread.
  virtual bool Read(grpc::ByteBuffer* out) = 0;
  // Writes one message (from any thread, one at a time); false once the stream is gone.
  virtual bool Write(const v1::WorkerMessage& message) = 0;
  // No more writes from this side (half-close).
  virtual void WritesDone() = 0;
  // Abandons the stream: a blocked Read returns false.
  virtual void Cancel() = 0;
  // Waits for the end of the stream. No Read or Write may start after it.
  virtual void Finish() = 0;
};

// The Train stream of a gRPC channel.
class GrpcCoordinatorLink : public CoordinatorLink {
 public:
  explicit GrpcCoordinatorLink(const std::shared_ptr<grpc::Channel>& channel);
  bool Read(grpc::ByteBuffer* out) override { return stream_.Read(out); }
  bool Write(const v1::WorkerMessage& message) override;
  void WritesDone() override { stream_.WritesDone(); }
  void Cancel() override { context_.TryCancel(); }
  void Finish() override { stream_.Finish(); }

 private:
  grpc::ClientContext context_;  // before stream_, which uses it until it is destroyed
  RawClientStream stream_;
};

}  // namespace flashdraft
