// A worker's side of target feeders (docs/ARCHITECTURE.md, "Feeders"): fetches a shard that came
// as a ShardRef from the feeder that computed it. The messages it gets are those the Train stream
// would have carried (Microbatch header, then tensor chunks), handed over raw as they arrive.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/security.h"
#include "flashdraft/v1/shard_ref.pb.h"

namespace flashdraft {

class ShardFetcher {
 public:
  virtual ~ShardFetcher() = default;
  // Calls `on_message` with each message of the shard, in order; it returns false to stop (the
  // fetch then fails with DATA_LOSS). An error when the feeder cannot be reached, refuses, or the
  // shard does not come in time. The call runs under `ctx` (the caller may TryCancel it from
  // another thread; the fetcher sets its deadline).
  virtual absl::Status Fetch(const v1::ShardRef& ref, grpc::ClientContext* ctx,
                             const std::function<bool(const grpc::ByteBuffer&)>& on_message) = 0;
};

// Over gRPC, one channel per feeder address, with the job's client security (its job secret; its
// CA and client certificate under TLS).
class FeederClient : public ShardFetcher {
 public:
  FeederClient(ClientSecurity security, double timeout_seconds)
      : security_(std::move(security)), timeout_seconds_(timeout_seconds) {}
  absl::Status Fetch(const v1::ShardRef& ref, grpc::ClientContext* ctx,
                     const std::function<bool(const grpc::ByteBuffer&)>& on_message) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelTo(const std::string& address)
      ABSL_LOCKS_EXCLUDED(mu_);

  const ClientSecurity security_;
  const double timeout_seconds_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flashdraft
