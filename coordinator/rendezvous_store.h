// The coordinator's key-value store for c10d rendezvous, served over the authenticated gRPC channel
// (no extra port). Lookups never block here: clients poll until their own deadline, so no gRPC
// reaction ever waits.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace flashdraft {

class RendezvousStore {
 public:
  void Set(const std::string& key, std::string value);
  // False when absent.
  bool Get(const std::string& key, std::string* value) const;
  // Adds to an integer counter stored as its decimal text (as c10d stores do); returns the new
  // value.
  int64_t Add(const std::string& key, int64_t delta);
  bool Check(const std::vector<std::string>& keys) const;
  bool Delete(const std::string& key);
  int64_t NumKeys() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashdraft
