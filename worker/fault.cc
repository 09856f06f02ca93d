#include "worker/fault.h"

#include <chrono>
#include <csignal>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"

namespace flashdraft {

absl::StatusOr<FaultPlan> ParseFault(const char* env) {
  FaultPlan plan;
  if (env == nullptr || *env == 0) return plan;
  if (absl::StartsWith(env, "slow-feeder:")) return plan;  // the feeders' (feeder/feeder.h)
  const std::vector<std::string> parts = absl::StrSplit(env, ':');
  if (parts.size() != 3 || !absl::StartsWith(parts[1], "step=") ||
      !absl::StartsWith(parts[2], "rank=") ||
      (parts[0] != "forward" && parts[0] != "reduce" && parts[0] != "upload" &&
       parts[0] != "stall" && parts[0] != "corrupt") ||
      !absl::SimpleAtoi(parts[1].substr(5), &plan.step) ||
      !absl::SimpleAtoi(parts[2].substr(5), &plan.rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("FLASHDRAFT_FAULT='", env,
                     "': expected <forward|reduce|upload|stall|corrupt>:step=<n>:rank=<r>"));
  }
  plan.point = parts[0];
  plan.armed = true;
  return plan;
}

bool FaultDue(const FaultPlan& plan, const char* point, uint64_t step, int rank, uint64_t epoch) {
  return plan.armed && plan.point == point && plan.step == step && plan.rank == rank && epoch == 1;
}

void MaybeFault(const FaultPlan& plan, const char* point, uint64_t step, int rank, uint64_t epoch) {
  const bool stall = std::string(point) == "forward" && FaultDue(plan, "stall", step, rank, epoch);
  if (!stall && (std::string(point) == "corrupt" || !FaultDue(plan, point, step, rank, epoch))) {
    return;
  }
  if (stall) {
    LOG(WARNING) << "FLASHDRAFT_FAULT: the training thread of rank " << rank
                 << " stops for good in forward of step " << step;
    google::FlushLogFiles(google::GLOG_INFO);
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  LOG(WARNING) << "FLASHDRAFT_FAULT: killing this worker (rank " << rank << ") at " << point
               << " of step " << step;
  google::FlushLogFiles(google::GLOG_INFO);
  raise(SIGKILL);
}

}  // namespace flashdraft
