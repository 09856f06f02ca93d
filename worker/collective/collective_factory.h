// Which collective a membership epoch's group is (cluster.backend): Gloo, or NCCL where this
// binary has the GPU path. The one place that knows whether it has (FLASHDRAFT_WITH_CUDA), so that
// the session (worker/worker_session.h) forms its groups through a CollectiveFactory that tests
// replace, as c10d picks a Backend by name.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "worker/collective/collective.h"

namespace flashdraft {

// Forms one epoch's group over `store` (already under the epoch's prefix) as `rank` of
// `world_size`. ABORTED when abort() says so (a newer epoch came), UNAVAILABLE or
// DEADLINE_EXCEEDED when the group could not form, another error when it never can.
using CollectiveFactory = std::function<absl::StatusOr<std::unique_ptr<Collective>>(
    c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, const AbortCheck& abort)>;

struct CollectiveFactoryOptions {
  std::string backend = "gloo";  // cluster.backend: gloo | nccl
  // Every collective call's limit (cluster.collective_timeout_seconds).
  std::chrono::milliseconds timeout{300000};
  // Gloo: the network interface of collective traffic (cluster.collective_interface); empty: bind
  // to `address` (empty too: loopback).
  std::string interface;
  std::string address;
  // NCCL: this worker's GPU, an ordinal among the visible ones; its waits run on `clock`.
  int cuda_device = 0;
  const Clock* clock = &RealClock::Get();
};

// The factory of `options.backend`. INVALID_ARGUMENT naming any other backend. Without the GPU
// path, an NCCL group fails to form with FAILED_PRECONDITION saying how to build one.
absl::StatusOr<CollectiveFactory> MakeCollectiveFactory(const CollectiveFactoryOptions& options);

// The backends this binary can form, comma-separated ("gloo" or "gloo,nccl"): what a worker offers
// at Join (the coordinator refuses one without the job's).
const char* BuiltCollectiveBackends();

}  // namespace flashdraft
