// FeederPool's regeneration (data.regenerate with feeders): the data set's chats are answered by
// the feeders, a few lines in flight per feeder, before the job plans its first step.
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/security.h"
#include "coordinator/feeder_pool.h"
#include "glog/logging.h"

namespace flashdraft {
namespace {

// Lines a feeder has in flight: one generating and the next ones already there when it answers,
// few enough that the last lines of a data set spread over every feeder.
constexpr size_t kLinesInFlight = 4;
// Feeders a line may lose (each lost, or refused, while it held the line) before the regeneration
// fails naming the line: a line that breaks every feeder must not take them all down in turn.
constexpr int kMaxLineAttempts = 3;

}  // namespace

absl::Status RegeneratedTokens(const v1::RegeneratedLine& answer, std::vector<int64_t>& ids,
                               std::vector<int64_t>& mask) {
  const size_t n = static_cast<size_t>(answer.input_ids_size());
  if (n == 0 || answer.loss_mask().size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(n, " input_ids and ", answer.loss_mask().size(),
                                                   " loss_mask bytes: one of each is needed"));
  }
  for (int i = 0; i < answer.input_ids_size(); ++i) {
    if (answer.input_ids(i) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("input_ids[", i, "] = ", answer.input_ids(i)));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const int m = static_cast<unsigned char>(answer.loss_mask()[i]);
    if (m > 1) return absl::InvalidArgumentError(absl::StrCat("loss_mask[", i, "] = ", m));
  }
  ids.assign(answer.input_ids().begin(), answer.input_ids().end());
  mask.assign(answer.loss_mask().begin(), answer.loss_mask().end());
  return absl::OkStatus();
}

FeederPool::Feeder* FeederPool::RoomForLineLocked() {
  Feeder* best = nullptr;
  for (auto& [token, f] : feeders_) {
    if (f.link == nullptr || f.lines.size() >= kLinesInFlight) continue;
    if (best == nullptr || f.lines.size() < best->lines.size() ||
        (f.lines.size() == best->lines.size() && f.joined < best->joined)) {
      best = &f;
    }
  }
  return best;
}

void FeederPool::SendLinesLocked() {
  Regeneration& r = *regeneration_;
  while (!r.queue.empty()) {
    Feeder* f = RoomForLineLocked();
    if (f == nullptr) return;
    const uint64_t line = r.queue.front();
    r.queue.pop_front();
    f->lines.insert(line);
    v1::FeedMessage m;  // encoded when sent: the data set's text is held once, by the caller
    *m.mutable_regenerate() = (*r.lines)[r.open.at(line)];
    f->link->Send(MessageToBuffer(m));
  }
}

void FeederPool::RequeueLineLocked(uint64_t line, const std::string& why) {
  Regeneration& r = *regeneration_;
  if (++r.attempts[line] >= kMaxLineAttempts && r.failure.ok()) {
    r.failure = absl::AbortedError(
        absl::StrCat("line ", line, " of the data file: ", kMaxLineAttempts,
                     " feeders were lost or refused while they regenerated it (the last: ", why,
                     "); their logs say why"));
  }
  r.queue.push_front(line);
}

absl::Status FeederPool::AwaitAnswersLocked(
    double no_feeder_timeout_seconds, double& none_since,
    std::deque<std::pair<std::string, v1::RegeneratedLine>>& answers) {
  SendLinesLocked();
  const bool none_live = CountLiveLocked() == 0;
  if (none_live && none_since < 0) {
    none_since = clock_.Now();
    LOG(WARNING) << "paused: no feeder is live to regenerate the replies (up to "
                 << no_feeder_timeout_seconds << " s)";
  } else if (!none_live) {
    none_since = -1;
  }
  auto ready = [this, &none_since]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Regeneration& r = *regeneration_;
    return !failure_.ok() || !r.failure.ok() || !r.answers.empty() ||
           (!r.queue.empty() && RoomForLineLocked() != nullptr) ||
           (none_since < 0 && CountLiveLocked() == 0);
  };
  const double deadline = none_since < 0 ? std::numeric_limits<double>::infinity()
                                         : none_since + no_feeder_timeout_seconds;
  clock_.AwaitUntil(mu_, absl::Condition(&ready), deadline);
  if (!failure_.ok()) return failure_;
  if (!regeneration_->failure.ok()) return regeneration_->failure;
  if (none_since >= 0 && CountLiveLocked() == 0 && clock_.Now() >= deadline) {
    return absl::DeadlineExceededError(absl::StrCat("no feeder was live for ",
                                                    no_feeder_timeout_seconds,
                                                    " s while the replies were regenerated"));
  }
  answers.swap(regeneration_->answers);
  return absl::OkStatus();
}

// An answer `answered` refused: the feeder that sent it goes, and the line with its others.
void FeederPool::RefuseAnswer(const std::string& token, uint64_t line, const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    auto it = feeders_.find(token);
    if (it == feeders_.end()) {
      RequeueLineLocked(line, why);  // lost already
      return;
    }
    it->second.lines.insert(line);  // Lost puts it back, with the feeder's others
    if (it->second.link != nullptr) {
      it->second.link->Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, why));
    }
  }
  Lost(token, why);
}

absl::Status FeederPool::Regenerate(
    const std::vector<v1::RegenerateWork>& lines, double no_feeder_timeout_seconds,
    const std::function<absl::Status(v1::RegeneratedLine&)>& answered,
    const std::function<void(size_t accepted)>& progress) {
  auto r = std::make_unique<Regeneration>();
  r->lines = &lines;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (r->open.emplace(lines[i].line(), i).second) r->queue.push_back(lines[i].line());
  }
  const size_t total = r->open.size();
  {
    absl::MutexLock lock(&mu_);
    regeneration_ = std::move(r);
  }
  size_t accepted = 0;
  double none_since = -1;
  absl::Status result;
  while (result.ok() && accepted < total) {
    std::deque<std::pair<std::string, v1::RegeneratedLine>> answers;
    {
      absl::MutexLock lock(&mu_);
      result = AwaitAnswersLocked(no_feeder_timeout_seconds, none_since, answers);
    }
    for (auto& [token, answer] : answers) {
      const uint64_t line = answer.line();
      // Outside the lock: it writes the kept replies.
      if (const absl::Status s = answered(answer); !s.ok()) {
        RefuseAnswer(token, line,
                     absl::StrCat("its answer for line ", line, " was refused: ", s.message()));
        continue;
      }
      {
        absl::MutexLock lock(&mu_);
        regeneration_->open.erase(line);
      }
      ++accepted;
      if (progress) progress(accepted);
    }
  }
  absl::MutexLock lock(&mu_);
  regeneration_.reset();
  for (auto& [token, f] : feeders_) f.lines.clear();
  return result;
}

void FeederPool::OnRegenerated(const std::string& token, v1::RegeneratedLine line) {
  absl::MutexLock lock(&mu_);
  auto it = feeders_.find(token);
  if (it == feeders_.end()) return;
  it->second.heard = clock_.Now();
  if (regeneration_ == nullptr || it->second.lines.erase(line.line()) == 0) {
    LOG_EVERY_N(WARNING, 100) << "feeder '" << Untrusted(it->second.id) << "' answered line "
                              << line.line() << ", which it does not hold: dropped";
    return;
  }
  regeneration_->answers.emplace_back(token, std::move(line));
}

}  // namespace flashdraft
