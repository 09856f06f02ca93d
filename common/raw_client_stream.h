// A client call of a method by its name, carrying raw ByteBuffers (the protobuf wire bytes of its
// messages), with a blocking interface over gRPC's public callback API (grpc::GenericStub; no
// grpc::internal). Tensor chunks then go from gRPC's receive buffers straight into tensors
// (common/chunk_wire.h). Works for streaming and unary methods alike: a server-streaming call is
// one Write, WritesDone, then Reads.
//
// Reading keeps up to kReadAhead messages received ahead of the reader, so the next message is
// already on its way while the last one is parsed; past that gRPC's flow control holds the sender
// back. Read is for one thread; Write may be called from several (one write is in flight at a
// time).
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace flashdraft {

class RawClientStream : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static constexpr size_t kReadAhead = 2;

  // Starts the call of `method` ("/package.Service/Method") on `channel` with `context` (deadline,
  // cancellation), which must outlive this object.
  RawClientStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                  grpc::ClientContext* context);
  // Waits for the call to end: the owner ends it first (WritesDone and the server's end, or
  // context->TryCancel()).
  ~RawClientStream() override;

  // The next message; false once the call has no more.
  bool Read(grpc::ByteBuffer* out) ABSL_LOCKS_EXCLUDED(mu_);
  // Hands `message` to gRPC and waits until it is written; false when the call is over.
  bool Write(grpc::ByteBuffer message) ABSL_LOCKS_EXCLUDED(write_mu_, mu_);
  // No more writes (half-close); waits until gRPC took it.
  void WritesDone() ABSL_LOCKS_EXCLUDED(write_mu_, mu_);
  // Waits for the end of the call and returns its status. No Read or Write may start after it.
  grpc::Status Finish() ABSL_LOCKS_EXCLUDED(mu_);

  void OnReadDone(bool ok) ABSL_LOCKS_EXCLUDED(mu_) override;
  void OnWriteDone(bool ok) ABSL_LOCKS_EXCLUDED(mu_) override;
  void OnWritesDoneDone(bool ok) ABSL_LOCKS_EXCLUDED(mu_) override;
  void OnDone(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_) override;

 private:
  void ReleaseHold() ABSL_LOCKS_EXCLUDED(mu_);
  // Conditions of the waits (absl::Mutex evaluates them under mu_ whenever it is released).
  bool ReadableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !ready_.empty() || reads_over_;
  }
  bool WriteSettledLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !write_pending_; }
  bool WritesDoneSettledLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !writes_done_pending_ || done_;
  }

  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one writer at a time, for the whole write
  absl::Mutex mu_;
  // The read in flight writes here; gRPC owns it between StartRead and OnReadDone, which hands
  // its message over under mu_.
  grpc::ByteBuffer reading_;
  std::deque<grpc::ByteBuffer> ready_ ABSL_GUARDED_BY(mu_);  // received, not yet Read
  bool read_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_over_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ByteBuffer writing_ ABSL_GUARDED_BY(write_mu_);  // the write in flight reads from here
  bool write_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool write_ok_ ABSL_GUARDED_BY(mu_) = true;
  bool writes_done_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashdraft
