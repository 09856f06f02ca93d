// Whether a worker may join the job, from its JoinRequest alone (names, protocol, collectives,
// model shape, numerics reported at all). Pure: MembershipController::Join asks it before the
// membership and numerics decide.
#pragma once

#include <string>

#include "flashdraft/v1/coordinator.pb.h"
#include "model/drafter_config.h"

namespace flashdraft {

// Peer-chosen names (worker ids, hosts, devices) are at most this long, printable ASCII.
constexpr size_t kMaxPeerNameChars = 128;

// Why `request` is refused by a job that sums gradients over `backend` for `drafter`; empty:
// nothing against it.
std::string CapabilityRefusal(const v1::JoinRequest& request, const std::string& backend,
                              const DrafterModelConfig& drafter);

// The first field in which a worker's model shape differs from the job's, as "name a != b";
// empty when they agree.
std::string ModelShapeDifference(const v1::ModelShape& shape, const DrafterModelConfig& drafter);

}  // namespace flashdraft
