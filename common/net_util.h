// Small network helpers shared by the processes (no gRPC, no LibTorch).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace flashdraft {

// The local address this host uses to reach `coordinator` ("host:port" or "[v6]:port"): where
// the Gloo device binds when cluster.collective_interface is empty, so that workers on several
// hosts reach each other instead of each offering its loopback address. A UDP connect sends no
// packet; it only asks the kernel for the route.
absl::StatusOr<std::string> LocalAddressToward(const std::string& coordinator);

}  // namespace flashdraft
