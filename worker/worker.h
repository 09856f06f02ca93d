// The worker process (DESIGN.md §2): joins the coordinator, forms the Gloo group through the
// coordinator's store, fetches the frozen target tensors, then trains on one thread: for each of
// its shards of a step forward + backward, then the gradient reduction, ack, wait for the commit,
// optimizer step. gRPC threads only move bytes into a queue.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace flashdraft {

struct WorkerOptions {
  std::string coordinator = "127.0.0.1:7600";
  std::string worker_id;
  double connect_timeout_seconds = 60;
  // After losing the coordinator (or being dropped from the job), join again for this long.
  double reconnect_timeout_seconds = 120;
};

absl::Status RunWorker(const WorkerOptions& options);

}  // namespace flashdraft
