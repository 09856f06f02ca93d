// FLASHDRAFT_FAULT as a feeder reads it (worker/fault.h has the workers' faults; a launch passes
// the variable to every process): "slow-feeder:ms=N" makes each shard's forward take at least N ms
// per sample, standing in for a device's capture time (bench/feeders_bench.sh).
#pragma once

#include "absl/status/statusor.h"

namespace flashdraft {

// N of "slow-feeder:ms=N"; 0 when unset or a worker's fault; an error naming the value when a
// slow-feeder value is malformed.
absl::StatusOr<int> ParseFeederFault(const char* env);

}  // namespace flashdraft
