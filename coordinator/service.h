// The coordinator's gRPC face (flashdraft.v1.Coordinator, callback API): one reactor per stream,
// one write in flight per stream, no blocking inside reactions. Everything a reactor receives is
// handed to the Coordinator, which decides; this file only moves and parses bytes.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/service_type.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/queued_writer.h"
#include "common/tensor_codec.h"
#include "flashdraft/v1/coordinator.pb.h"

namespace flashdraft {

class Coordinator;
struct FetchEntry;  // coordinator/coordinator.h

// The Train stream of one worker: an outbound queue with one write in flight; reads dispatch to
// the coordinator, which never blocks in them. The stream is raw (ByteBuffers): outgoing messages
// are serialized CoordinatorMessages whose tensor chunks point at the coordinator's buffers
// (common/chunk_wire.h), incoming ones are parsed here.
class TrainSession
    : public QueuedWriter<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>> {
 public:
  explicit TrainSession(Coordinator* coordinator);
  void OnReadDone(bool ok) override;
  void OnDone() override;

 private:
  void Dispatch();

  Coordinator* coordinator_;
  grpc::ByteBuffer in_bytes_;
  v1::WorkerMessage in_;
  std::string token_;  // empty until the first message
};

// FetchTensors' answer: the tensors of `entries`, in order, as chunks of at most `max_chunk_bytes`
// (each a slice of its mapped file), one write in flight; it deletes itself when the call is done.
// The service serves it; tests serve it without a Coordinator, with small chunks.
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewFetchReactor(
    std::vector<FetchEntry> entries, size_t max_chunk_bytes = kDefaultMaxChunkBytes);

// The service, answering through `coordinator` (which must outlive it).
std::unique_ptr<grpc::Service> NewCoordinatorService(Coordinator* coordinator);

}  // namespace flashdraft
