// Fault injection for the fault tests: FLASHDRAFT_FAULT="<point>:step=<s>:rank=<r>" makes the
// worker that is rank r of the first membership epoch fail at that point of step s, as a real
// fault would:
//   forward  SIGKILL after its first shard's forward (kill -9 while computing)
//   reduce   SIGKILL while its gradient exchange runs
//   upload   SIGKILL inside the checkpoint upload of the state after s steps, after one tensor
//   stall    its training thread stops for good inside forward while the rest of the process
//            (heartbeats) goes on: a stuck kernel, a deadlock
//   corrupt  the checkpoint upload of the state after s steps carries a chunk with a wrong CRC-32C
//            (a broken worker; the process lives on)
// Unset or a feeder's fault (slow-feeder:..., feeder/feeder.h): nothing happens; a malformed value
// stops the worker at start rather than being ignored. Only the first epoch fires, so that a
// restarted or re-formed worker trains normally.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace flashdraft {

struct FaultPlan {
  std::string point;
  uint64_t step = 0;
  int rank = 0;
  bool armed = false;
};

absl::StatusOr<FaultPlan> ParseFault(const char* env);
// Whether (point, step, rank, epoch) is the planned fault.
bool FaultDue(const FaultPlan& plan, const char* point, uint64_t step, int rank, uint64_t epoch);
// Fires the planned fault (forward, reduce, upload: SIGKILL; stall) when it is due.
void MaybeFault(const FaultPlan& plan, const char* point, uint64_t step, int rank, uint64_t epoch);

}  // namespace flashdraft
