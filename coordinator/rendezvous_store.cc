#include "coordinator/rendezvous_store.h"

#include <cstdlib>

namespace flashdraft {

void RendezvousStore::Set(const std::string& key, std::string value) {
  std::lock_guard<std::mutex> lock(mu_);
  values_[key] = std::move(value);
}

bool RendezvousStore::Get(const std::string& key, std::string* value) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  *value = it->second;
  return true;
}

int64_t RendezvousStore::Add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string& v = values_[key];
  const int64_t next = (v.empty() ? 0 : std::strtoll(v.c_str(), nullptr, 10)) + delta;
  v = std::to_string(next);
  return next;
}

bool RendezvousStore::Check(const std::vector<std::string>& keys) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& k : keys) {
    if (values_.find(k) == values_.end()) return false;
  }
  return true;
}

bool RendezvousStore::Delete(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.erase(key) > 0;
}

int64_t RendezvousStore::NumKeys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(values_.size());
}

}  // namespace flashdraft
