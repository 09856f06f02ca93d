#include "worker/coordinator_link.h"

#include "common/chunk_wire.h"

namespace flashdraft {

GrpcCoordinatorLink::GrpcCoordinatorLink(const std::shared_ptr<grpc::Channel>& channel)
    : stream_(channel, "/flashdraft.v1.Coordinator/Train", &context_) {}

bool GrpcCoordinatorLink::Write(const v1::WorkerMessage& message) {
  return stream_.Write(MessageToBuffer(message));
}

}  // namespace flashdraft
