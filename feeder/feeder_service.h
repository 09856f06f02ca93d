// The Feeder gRPC service (proto/flashdraft/v1/feeder.proto): a worker fetches a shard by its
// ticket and receives, as raw ByteBuffers, the very messages the coordinator's Train stream would
// have carried (Microbatch header, then the tensors' chunks: no copy, the chunks are the store's
// slices). A fetch of a shard still being computed waits without holding a thread: the reply
// starts from the compute thread that completes it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

#include "common/security.h"
#include "feeder/feeder_metrics.h"
#include "feeder/shard_store.h"

namespace flashdraft {

// Every call is checked with `security` (the job secret); the bytes sent are counted in `metrics`
// (optional). All three outlive the service.
std::unique_ptr<grpc::Service> NewFeederService(ShardStore& store, ServerSecurity& security,
                                                FeederMetrics* metrics = nullptr);

}  // namespace flashdraft
