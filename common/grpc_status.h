// Conversion between absl::Status and grpc::Status. The codes are the same canonical codes, so the
// mapping is one to one and round-trips.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace flashdraft {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace flashdraft
