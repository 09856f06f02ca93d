// A unary call made again while its server cannot be reached yet: a process that starts before its
// coordinator (a worker, a feeder) joins once the coordinator listens. Protocol logic without a
// network: the attempt is a function, the clock can be faked.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include <optional>

#include "absl/functional/function_ref.h"
#include "common/clock.h"

namespace flashdraft {

// Calls `attempt` with a fresh context (wait_for_ready, a deadline `attempt_seconds` ahead) until
// it succeeds or fails with other than UNAVAILABLE/DEADLINE_EXCEEDED, or `timeout_seconds` of
// `clock` have passed since the first attempt: the last attempt's status. nullopt when
// `give_up()`, asked before each attempt, says so (a SIGTERM while joining).
std::optional<grpc::Status> CallUntilReachable(
    const Clock& clock, double timeout_seconds,
    absl::FunctionRef<grpc::Status(grpc::ClientContext&)> attempt,
    absl::FunctionRef<bool()> give_up, double attempt_seconds = 1.0);

// Whether a failed attempt is worth another: the server is not up (yet) or did not answer in time.
bool IsUnreachable(const grpc::Status& status);

}  // namespace flashdraft
