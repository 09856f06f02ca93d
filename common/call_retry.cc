#include "common/call_retry.h"

#include <chrono>

namespace flashdraft {

bool IsUnreachable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

std::optional<grpc::Status> CallUntilReachable(
    const Clock& clock, double timeout_seconds,
    absl::FunctionRef<grpc::Status(grpc::ClientContext&)> attempt,
    absl::FunctionRef<bool()> give_up, double attempt_seconds) {
  const double start = clock.Now();
  while (true) {
    if (give_up()) return std::nullopt;
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::microseconds(static_cast<int64_t>(attempt_seconds * 1e6)));
    grpc::Status s = attempt(ctx);
    if (s.ok() || !IsUnreachable(s) || clock.Now() - start > timeout_seconds) return s;
  }
}

}  // namespace flashdraft
