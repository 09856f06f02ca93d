#include "feeder/feeder_fault.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace flashdraft {

absl::StatusOr<int> ParseFeederFault(const char* env) {
  if (env == nullptr || !absl::StartsWith(env, "slow-feeder")) return 0;
  absl::string_view value = env;
  int ms = 0;
  if (!absl::ConsumePrefix(&value, "slow-feeder:ms=") || !absl::SimpleAtoi(value, &ms) || ms < 0 ||
      ms > 600000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FLASHDRAFT_FAULT='", env, "': expected slow-feeder:ms=<milliseconds, 0 to 600000>"));
  }
  return ms;
}

}  // namespace flashdraft
