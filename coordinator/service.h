// The coordinator's gRPC face (flashdraft.v1.Coordinator, callback API): one reactor per stream,
// one write in flight per stream, no blocking inside reactions. Everything a reactor receives is
// handed to the part that decides (MembershipController, TensorCatalog, RendezvousStore); this
// file only authenticates, moves and parses bytes.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/service_type.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/queued_writer.h"
#include "common/security.h"
#include "common/tensor_codec.h"
#include "coordinator/membership_controller.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/stream_registry.h"
#include "coordinator/tensor_catalog.h"
#include "flashdraft/v1/coordinator.pb.h"

namespace flashdraft {

// What the service answers through; all outlive it.
struct ServiceParts {
  ServerSecurity* security;
  MembershipController* controller;
  StreamRegistry* streams;
  const TensorCatalog* catalog;
  RendezvousStore* store;
  std::function<void(v1::StatusReply*)> status;
};

// The Train stream of one worker: an outbound queue with one write in flight; reads dispatch to
// the controller, which never blocks in them. The stream is raw (ByteBuffers): outgoing messages
// are serialized CoordinatorMessages whose tensor chunks point at the coordinator's buffers
// (common/chunk_wire.h), incoming ones are parsed here.
class TrainSession
    : public QueuedWriter<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>> {
 public:
  TrainSession(MembershipController* controller, StreamRegistry* streams);
  void OnReadDone(bool ok) override;
  void OnDone() override;

 private:
  void Dispatch();
  // The stream is over: the worker it was bound to (if any) is lost with `why`.
  void Ended(const std::string& why);

  MembershipController* controller_;
  StreamRegistry* streams_;
  grpc::ByteBuffer in_bytes_;
  v1::WorkerMessage in_;
  std::string token_;  // empty until the first message
};

// FetchTensors' answer: the tensors of `entries`, in order, as chunks of at most `max_chunk_bytes`
// (each a slice of its mapped file), one write in flight; it deletes itself when the call is done.
// The service serves it; tests serve it without a Coordinator, with small chunks.
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewFetchReactor(
    std::vector<FetchEntry> entries, size_t max_chunk_bytes = kDefaultMaxChunkBytes);

// The service, answering through `parts`.
std::unique_ptr<grpc::Service> NewCoordinatorService(ServiceParts parts);

}  // namespace flashdraft
