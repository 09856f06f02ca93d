#include "feeder/shard_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"

namespace flashdraft {
namespace {

std::string Describe(const ShardKey& key) {
  return absl::StrCat("step ", key.step, " shard ", key.shard, " of ", key.num_shards);
}

bool SameSamples(const v1::ShardWork& a, const v1::ShardWork& b) {
  if (a.samples_size() != b.samples_size()) return false;
  for (int i = 0; i < a.samples_size(); ++i) {
    if (a.samples(i).index() != b.samples(i).index() ||
        a.samples(i).length() != b.samples(i).length()) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status ShardStore::Assign(v1::ShardWork work, uint64_t feature_bytes) {
  if (work.ticket().empty()) return absl::InvalidArgumentError("ShardWork without a ticket");
  if (!work.has_header()) {
    return absl::InvalidArgumentError(absl::StrCat("ShardWork ", work.ticket(), " has no header"));
  }
  const ShardKey key{work.header().step(), work.header().shard(), work.header().num_shards()};
  v1::CoordinatorMessage header;
  *header.mutable_microbatch() = work.header();
  {
    absl::MutexLock lock(&mu_);
    if (!shutdown_.ok()) return shutdown_;
    if (key.step < released_below_) {
      return absl::FailedPreconditionError(absl::StrCat(
          Describe(key), " assigned after its step was released (", released_below_, ")"));
    }
    if (tickets_.count(work.ticket())) {
      return absl::AlreadyExistsError(absl::StrCat("ticket ", work.ticket(), " assigned twice"));
    }
    auto [it, added] = entries_.try_emplace(key);
    if (!added && !SameSamples(it->second.work, work)) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(key), " assigned again with other samples"));
    }
    tickets_[work.ticket()] = Ticket{key, MessageToBuffer(header)};
    if (added) {
      it->second.bytes = feature_bytes;
      it->second.work = std::move(work);
      queue_.insert(key);
    }
  }
  return absl::OkStatus();
}

void ShardStore::Release(uint64_t committed_steps) {
  Fired fired;
  {
    absl::MutexLock lock(&mu_);
    if (committed_steps <= released_below_) return;
    released_below_ = committed_steps;
    for (auto it = entries_.begin(); it != entries_.end() && it->first.step < committed_steps;) {
      EraseLocked(it++);
    }
    for (auto it = tickets_.begin(); it != tickets_.end();) {
      it = it->second.key.step < committed_steps ? tickets_.erase(it) : std::next(it);
    }
    fired = TakeSettledLocked();
  }
  Fire(std::move(fired));
}

void ShardStore::EraseLocked(std::map<ShardKey, Entry>::iterator it) {
  Entry& e = it->second;
  switch (e.state) {
    case State::kQueued:
      queue_.erase(it->first);
      break;
    case State::kComputing:
      e.released = true;  // Complete drops it and frees its bytes
      return;
    case State::kReady:
      held_bytes_ -= e.bytes;
      break;
    case State::kFailed:
      break;
  }
  entries_.erase(it);
}

void ShardStore::Shutdown(const absl::Status& why) {
  Fired fired;
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = why.ok() ? absl::CancelledError("the feeder shut down") : why;
    fired = TakeSettledLocked();
  }
  Fire(std::move(fired));
}

bool ShardStore::CanStartLocked() const {
  if (!shutdown_.ok()) return true;
  if (queue_.empty()) return false;
  const ShardKey& oldest = *queue_.begin();
  // entries_ is ordered by step: its first entry is the oldest step this feeder has.
  if (oldest.step == entries_.begin()->first.step) return true;
  return held_bytes_ == 0 || held_bytes_ + entries_.at(oldest).bytes <= max_bytes_;
}

std::optional<ShardStore::Pending> ShardStore::NextToCompute() {
  absl::MutexLock lock(&mu_, absl::Condition(this, &ShardStore::CanStartLocked));
  return StartLocked();
}

std::optional<ShardStore::Pending> ShardStore::TryNextToCompute() {
  absl::MutexLock lock(&mu_);
  if (!CanStartLocked()) return std::nullopt;
  return StartLocked();
}

std::optional<ShardStore::Pending> ShardStore::StartLocked() {
  if (!shutdown_.ok()) return std::nullopt;
  const ShardKey key = *queue_.begin();
  queue_.erase(queue_.begin());
  Entry& e = entries_.at(key);
  e.state = State::kComputing;
  held_bytes_ += e.bytes;
  return Pending{key, e.work};
}

void ShardStore::Complete(const ShardKey& key,
                          absl::StatusOr<std::vector<grpc::ByteBuffer>> chunks) {
  Fired fired;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.state != State::kComputing) return;
    Entry& e = it->second;
    held_bytes_ -= e.bytes;
    ++computed_;
    if (e.released) {
      entries_.erase(it);
    } else if (!chunks.ok()) {
      e.state = State::kFailed;
      e.error = chunks.status();
      e.bytes = 0;
    } else {
      e.state = State::kReady;
      e.chunks = *std::move(chunks);
      e.bytes = 0;
      for (const grpc::ByteBuffer& b : e.chunks) e.bytes += b.Length();
      held_bytes_ += e.bytes;
    }
    fired = TakeSettledLocked();
  }
  Fire(std::move(fired));
}

std::optional<absl::StatusOr<std::vector<grpc::ByteBuffer>>> ShardStore::AnswerLocked(
    const std::string& ticket, uint64_t step) const {
  auto t = tickets_.find(ticket);
  if (t == tickets_.end()) {
    if (!shutdown_.ok()) return shutdown_;
    if (step < released_below_) {
      return absl::NotFoundError(absl::StrCat("no shard has ticket '", ticket, "': step ", step,
                                              " was released"));
    }
    return std::nullopt;  // its ShardWork is on its way
  }
  auto e = entries_.find(t->second.key);
  if (e == entries_.end() || e->second.released) {
    return absl::FailedPreconditionError(absl::StrCat(Describe(t->second.key), " was released"));
  }
  if (e->second.state == State::kFailed) return e->second.error;
  if (e->second.state == State::kReady) {
    std::vector<grpc::ByteBuffer> messages;
    messages.reserve(1 + e->second.chunks.size());
    messages.push_back(t->second.header);
    messages.insert(messages.end(), e->second.chunks.begin(), e->second.chunks.end());
    return messages;
  }
  if (!shutdown_.ok()) return shutdown_;
  return std::nullopt;
}

ShardStore::Fired ShardStore::TakeSettledLocked() {
  Fired fired;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    auto answer = AnswerLocked(it->second.ticket, it->second.step);
    if (!answer) {
      ++it;
      continue;
    }
    fired.emplace_back(std::move(it->second.ready), *std::move(answer));
    it = waiters_.erase(it);
  }
  return fired;
}

void ShardStore::Fire(Fired fired) {
  for (auto& [ready, answer] : fired) ready(std::move(answer));
}

uint64_t ShardStore::WhenReady(const std::string& ticket, uint64_t step, Ready ready) {
  std::optional<absl::StatusOr<std::vector<grpc::ByteBuffer>>> answer;
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_waiter_++;
    answer = AnswerLocked(ticket, step);
    if (!answer) waiters_[id] = Waiter{ticket, step, std::move(ready)};
  }
  if (answer) ready(*std::move(answer));
  return id;
}

bool ShardStore::CancelWait(uint64_t id) {
  absl::MutexLock lock(&mu_);
  return waiters_.erase(id) > 0;
}

ShardStore::Stats ShardStore::stats() const {
  absl::MutexLock lock(&mu_);
  return Stats{held_bytes_, queue_.size(), computed_, waiters_.size()};
}

}  // namespace flashdraft
