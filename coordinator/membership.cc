#include "coordinator/membership.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/random_token.h"

namespace flashdraft {

const char* MemberStateName(MemberState state) {
  switch (state) {
    case MemberState::kJoined:
      return "joined";
    case MemberState::kReady:
      return "ready";
    case MemberState::kActive:
      return "active";
  }
  return "?";
}

Membership::Membership(MembershipOptions options, const Clock& clock)
    : options_(options), clock_(clock) {}

absl::StatusOr<std::string> Membership::Admit(const std::string& worker_id) {
  if (static_cast<int>(members_.size()) >= options_.max_workers) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the job is full (", options_.max_workers, " workers)"));
  }
  std::string token = RandomToken();
  MemberInfo& m = members_[token];
  m.token = token;
  m.worker_id = worker_id;
  m.state = MemberState::kJoined;
  m.since = m.last_heard = clock_.Now();
  m.order = next_order_++;
  return token;
}

absl::Status Membership::Bind(const std::string& token) {
  auto it = members_.find(token);
  if (it == members_.end()) {
    return absl::NotFoundError("unknown or expired session token (join again)");
  }
  if (it->second.state != MemberState::kJoined) {
    return absl::AlreadyExistsError("this session token has a Train stream already");
  }
  it->second.state = MemberState::kReady;
  it->second.since = it->second.last_heard = clock_.Now();
  return absl::OkStatus();
}

bool Membership::Valid(const std::string& token) const { return members_.count(token) > 0; }

void Membership::Heard(const std::string& token) {
  auto it = members_.find(token);
  if (it != members_.end()) it->second.last_heard = clock_.Now();
}

bool Membership::Remove(const std::string& token) {
  auto it = members_.find(token);
  if (it == members_.end()) return false;
  const bool was_active = it->second.state == MemberState::kActive;
  members_.erase(it);
  if (was_active) lost_active_ = true;
  return was_active;
}

bool Membership::SetMetricsAddress(const std::string& token, const std::string& address) {
  auto it = members_.find(token);
  if (it == members_.end() || it->second.metrics_address == address) return false;
  it->second.metrics_address = address;
  return true;
}

void Membership::Progress(const std::string& token, uint64_t progress, const std::string& phase,
                          uint64_t step, bool busy) {
  auto it = members_.find(token);
  if (it == members_.end()) return;
  MemberInfo& m = it->second;
  m.last_heard = clock_.Now();
  if (progress != m.progress || m.progress_at == 0) m.progress_at = m.last_heard;
  m.progress = progress;
  m.phase = phase;
  m.step = step;
  m.busy = busy;
}

absl::Status Membership::RequestLeave(const std::string& token, const std::string& reason) {
  auto it = members_.find(token);
  if (it == members_.end()) return absl::NotFoundError("no such worker in the job");
  if (it->second.leave_reason.empty())
    it->second.leave_reason = reason.empty() ? "drained" : reason;
  return absl::OkStatus();
}

std::vector<std::string> Membership::Leaving() const {
  std::vector<std::string> out;
  for (const MemberInfo& m : Members()) {
    if (!m.leave_reason.empty()) out.push_back(m.token);
  }
  return out;
}

std::string Membership::TokenOfRank(int rank) const {
  return rank >= 0 && rank < world_size() ? ranks_[rank] : std::string();
}

std::string Membership::TokenOfWorker(const std::string& worker_id) const {
  for (const auto& [token, m] : members_) {
    if (m.worker_id == worker_id) return token;
  }
  return {};
}

std::vector<Expiry> Membership::Expired() const {
  const double now = clock_.Now();
  std::vector<Expiry> gone;
  for (const auto& [token, m] : members_) {
    if (m.state == MemberState::kJoined) {
      if (now >= m.since + options_.bind_timeout_seconds) {
        gone.push_back({token, absl::StrCat("no Train stream within ",
                                            options_.bind_timeout_seconds, " s of joining")});
      }
    } else if (now >= m.last_heard + options_.heartbeat_timeout_seconds) {
      gone.push_back({token, absl::StrCat("no message for ", options_.heartbeat_timeout_seconds,
                                          " s (heartbeat timeout)")});
    } else if (m.state == MemberState::kActive && m.busy && m.progress_at > 0 &&
               now >= m.progress_at + options_.stall_timeout_seconds) {
      gone.push_back({token, absl::StrFormat("its training thread has been stuck in %s of step "
                                             "%d for %.0f s (cluster.stall_timeout_seconds)",
                                             m.phase, m.step, now - m.progress_at)});
    }
  }
  return gone;
}

double Membership::NextExpiry() const {
  double next = std::numeric_limits<double>::infinity();
  for (const auto& [token, m] : members_) {
    if (m.state == MemberState::kJoined) {
      next = std::min(next, m.since + options_.bind_timeout_seconds);
      continue;
    }
    next = std::min(next, m.last_heard + options_.heartbeat_timeout_seconds);
    if (m.state == MemberState::kActive && m.busy && m.progress_at > 0) {
      next = std::min(next, m.progress_at + options_.stall_timeout_seconds);
    }
  }
  return next;
}

bool Membership::Changed() const {
  if (lost_active_ || reform_requested_ || epoch_ == 0) return true;
  return Count(MemberState::kReady) > 0 && world_size() < options_.max_workers;
}

int Membership::Available() const {
  return std::min(options_.max_workers, Count(MemberState::kActive) + Count(MemberState::kReady));
}

EpochPlan Membership::NextEpoch() {
  EpochPlan plan;
  plan.epoch = ++epoch_;
  // Survivors in their old rank order, then ready workers in join order.
  for (const std::string& token : ranks_) {
    if (members_.count(token) && members_[token].state == MemberState::kActive) {
      plan.tokens.push_back(token);
    }
  }
  std::vector<std::string> ready;
  for (const auto& [token, m] : members_) {
    if (m.state == MemberState::kReady) ready.push_back(token);
  }
  std::sort(ready.begin(), ready.end(), [&](const std::string& a, const std::string& b) {
    return members_[a].order < members_[b].order;
  });
  bool survivors_trained = false, newcomer = false;
  for (const std::string& token : plan.tokens) survivors_trained |= members_[token].trained;
  for (const std::string& token : ready) {
    if (static_cast<int>(plan.tokens.size()) >= options_.max_workers) break;
    plan.tokens.push_back(token);
    newcomer = true;
  }
  plan.needs_state_sync = survivors_trained && newcomer;
  const double now = clock_.Now();
  for (auto& [token, m] : members_) m.rank = -1;
  for (size_t r = 0; r < plan.tokens.size(); ++r) {
    MemberInfo& m = members_[plan.tokens[r]];
    if (m.state != MemberState::kActive) m.since = now;
    m.state = MemberState::kActive;
    m.rank = static_cast<int>(r);
  }
  ranks_ = plan.tokens;
  lost_active_ = false;
  reform_requested_ = false;
  return plan;
}

void Membership::Committed() {
  for (const std::string& token : ranks_) {
    auto it = members_.find(token);
    if (it != members_.end()) it->second.trained = true;
  }
}

int Membership::RankOf(const std::string& token) const {
  auto it = members_.find(token);
  return it == members_.end() ? -1 : it->second.rank;
}

const MemberInfo* Membership::Find(const std::string& token) const {
  auto it = members_.find(token);
  return it == members_.end() ? nullptr : &it->second;
}

std::vector<MemberInfo> Membership::Members() const {
  std::vector<MemberInfo> out;
  for (const auto& [token, m] : members_) out.push_back(m);
  std::sort(out.begin(), out.end(),
            [](const MemberInfo& a, const MemberInfo& b) { return a.order < b.order; });
  return out;
}

int Membership::Count(MemberState state) const {
  int n = 0;
  for (const auto& [token, m] : members_) n += m.state == state;
  return n;
}

}  // namespace flashdraft
