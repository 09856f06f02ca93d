// A c10d Store over the coordinator's gRPC channel: the collective's rendezvous needs no extra port
// and rides the authenticated connection (docs/SECURITY.md). Blocking reads poll with backoff until
// the store's timeout; the coordinator never blocks on them.
#pragma once

#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "flashdraft/v1/coordinator.grpc.pb.h"
#include "worker/torch_compat.h"

namespace flashdraft {

class GrpcStore : public c10d::Store {
 public:
  GrpcStore(std::shared_ptr<v1::Coordinator::Stub> stub, std::string session_token,
            std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
#if FLASHDRAFT_STORE_HAS_CLONE
  // The same store for another thread (the stub is thread-safe).
  c10::intrusive_ptr<c10d::Store> clone() override;
#endif

 private:
  v1::StoreReply Call(v1::StoreRequest request);

  std::shared_ptr<v1::Coordinator::Stub> stub_;
  std::string token_;
};

}  // namespace flashdraft
