#include "common/health.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace flashdraft {

void HealthState::Alive(double valid_for, absl::string_view watcher) {
  absl::MutexLock lock(&mu_);
  const double now = clock_.Now();
  reported_at_ = now;
  live_until_ = std::isinf(valid_for) ? kForever : now + std::max(0.0, valid_for);
  watcher_ = std::string(watcher);
  stuck_.clear();
}

void HealthState::Stuck(absl::string_view why) {
  absl::MutexLock lock(&mu_);
  stuck_ = why.empty() ? "stuck" : std::string(why);
}

void HealthState::Ready(bool ready, absl::string_view why) {
  absl::MutexLock lock(&mu_);
  ready_ = ready;
  ready_why_ = std::string(why);
}

ProbeAnswer HealthState::LiveLocked() const {
  if (!stuck_.empty()) return {503, stuck_};
  const double now = clock_.Now();
  if (now > live_until_) {
    return {503,
            absl::StrFormat("no progress report from %s for %.1f s", watcher_, now - reported_at_)};
  }
  return {200, "ok"};
}

ProbeAnswer HealthState::Healthz() const {
  absl::MutexLock lock(&mu_);
  return LiveLocked();
}

ProbeAnswer HealthState::Readyz() const {
  absl::MutexLock lock(&mu_);
  ProbeAnswer live = LiveLocked();
  if (live.status != 200) return live;
  if (!ready_) return {503, absl::StrCat("not ready: ", ready_why_)};
  return {200, ready_why_.empty() ? "ok" : absl::StrCat("ok: ", ready_why_)};
}

}  // namespace flashdraft
