// The coordinator's key-value store for c10d rendezvous, served over the job's authenticated gRPC
// channel (no extra port). Lookups never block here: clients poll until their own deadline, so no
// gRPC reaction ever waits. Bounded (key and value sizes, key count, total bytes) so that a peer
// cannot grow it without end; each membership epoch's group keeps its keys under "epoch/<e>/",
// dropped once the epoch is over.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace flashdraft {

struct StoreLimits {
  size_t max_key_bytes = 512;
  size_t max_value_bytes = 1 << 20;  // Gloo's rendezvous values are a few hundred bytes
  size_t max_keys = 1 << 16;
  size_t max_total_bytes = 64 << 20;
};

class RendezvousStore {
 public:
  explicit RendezvousStore(StoreLimits limits = {}) : limits_(limits) {}

  // INVALID_ARGUMENT for a key or value over the limits, RESOURCE_EXHAUSTED when the store is
  // full.
  absl::Status Set(const std::string& key, std::string value);
  // False when absent.
  bool Get(const std::string& key, std::string* value) const;
  // Adds to an integer counter stored as its decimal text (as c10d stores do) and returns the new
  // value; INVALID_ARGUMENT when the value is not an integer or the sum overflows.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  bool Check(const std::vector<std::string>& keys) const;
  bool Delete(const std::string& key);
  int64_t NumKeys() const;
  // Deletes every key that starts with `prefix`; how many.
  size_t DeletePrefix(const std::string& prefix);

 private:
  // OK when `key` may take a value of `value_bytes` bytes (replacing what it holds).
  absl::Status CheckRoomLocked(const std::string& key, size_t value_bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores `value` under `key` (CheckRoomLocked said it fits), keeping total_bytes_.
  void PutLocked(const std::string& key, std::string value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StoreLimits limits_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  size_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // keys and values
};

}  // namespace flashdraft
