#include "coordinator/rendezvous_store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace flashdraft {

absl::Status RendezvousStore::CheckRoomLocked(const std::string& key, size_t value_bytes) const {
  if (key.empty() || key.size() > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("store key of ", key.size(), " bytes (1 to ", limits_.max_key_bytes, ")"));
  }
  if (value_bytes > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store value of ", value_bytes, " bytes (at most ", limits_.max_value_bytes, ")"));
  }
  auto it = values_.find(key);
  const size_t freed = it == values_.end() ? 0 : key.size() + it->second.size();
  if (it == values_.end() && values_.size() >= limits_.max_keys) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the store holds its maximum of ", limits_.max_keys, " keys"));
  }
  if (total_bytes_ - freed + key.size() + value_bytes > limits_.max_total_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the store holds its maximum of ", limits_.max_total_bytes, " bytes"));
  }
  return absl::OkStatus();
}

void RendezvousStore::PutLocked(const std::string& key, std::string value) {
  auto [it, inserted] = values_.try_emplace(key);
  total_bytes_ -= inserted ? 0 : key.size() + it->second.size();
  total_bytes_ += key.size() + value.size();
  it->second = std::move(value);
}

absl::Status RendezvousStore::Set(const std::string& key, std::string value) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRoomLocked(key, value.size()); !s.ok()) return s;
  PutLocked(key, std::move(value));
  return absl::OkStatus();
}

bool RendezvousStore::Get(const std::string& key, std::string* value) const {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  *value = it->second;
  return true;
}

absl::StatusOr<int64_t> RendezvousStore::Add(const std::string& key, int64_t delta) {
  absl::MutexLock lock(&mu_);
  int64_t current = 0;
  if (auto it = values_.find(key); it != values_.end() && !absl::SimpleAtoi(it->second, &current)) {
    return absl::InvalidArgumentError(
        absl::StrCat("store key '", key.substr(0, 64), "' does not hold an integer"));
  }
  int64_t next = 0;
  if (__builtin_add_overflow(current, delta, &next)) {
    return absl::InvalidArgumentError(
        absl::StrCat("store counter '", key.substr(0, 64), "' would overflow"));
  }
  std::string text = std::to_string(next);
  if (absl::Status s = CheckRoomLocked(key, text.size()); !s.ok()) return s;
  PutLocked(key, std::move(text));
  return next;
}

bool RendezvousStore::Check(const std::vector<std::string>& keys) const {
  absl::MutexLock lock(&mu_);
  for (const auto& k : keys) {
    if (values_.find(k) == values_.end()) return false;
  }
  return true;
}

bool RendezvousStore::Delete(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  total_bytes_ -= key.size() + it->second.size();
  values_.erase(it);
  return true;
}

int64_t RendezvousStore::NumKeys() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(values_.size());
}

size_t RendezvousStore::DeletePrefix(const std::string& prefix) {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    total_bytes_ -= it->first.size() + it->second.size();
    it = values_.erase(it);
    ++n;
  }
  return n;
}

}  // namespace flashdraft
