// The coordinator's FeederControl service (proto/flashdraft/v1/feeder.proto, callback API):
// JoinFeeder, and one FeedSession per Feed stream with one write in flight. Like service.h it only
// authenticates, parses and hands over to the FeederPool, which decides.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

#include "common/security.h"
#include "coordinator/feeder_pool.h"

namespace flashdraft {

// Both outlive the service.
std::unique_ptr<grpc::Service> NewFeederControlService(FeederPool& pool, ServerSecurity& security);

}  // namespace flashdraft
