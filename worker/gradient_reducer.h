// Sums gradients across ranks in buckets while backward is still running (DESIGN.md §4, the
// bucketed all-reduce of issue 5), the way c10d's DDP reducer does:
//  - parameters are grouped, in reverse registration order (about the order backward produces
//    their gradients), into flat buckets of at most `bucket_bytes` per dtype;
//  - every parameter's .grad is an alias of its slice of its bucket, so autograd accumulates
//    straight into the bucket (no copy in, no copy out);
//  - a hook after each parameter's AccumulateGrad counts the bucket down; a bucket whose gradients
//    are all there starts its all-reduce on the collective's threads at once, while backward goes
//    on with the next layers. Buckets start in bucket order on every rank (collectives must match),
//    so a bucket that is ready early waits for the ones before it.
// Finish() starts what has not started (parameters that got no gradient, or a rank whose
// microbatch was empty and ran no backward: its zeros take part) and waits for all buckets.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "worker/collective/collective.h"

namespace torch::autograd {
struct Node;
}

namespace flashdraft {

class GradientReducer {
 public:
  // `collective` must outlive the reducer. With one rank nothing is hooked and nothing is reduced.
  GradientReducer(std::vector<torch::Tensor> params, Collective* collective, size_t bucket_bytes);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Before a step's backward: makes every parameter's .grad its bucket alias again (zeros for a
  // gradient that was undefined, a copy of one that was replaced) and rearms the buckets. One
  // backward per Prepare.
  void Prepare();
  // After backward (or instead of it): starts the buckets not started yet and waits for all. The
  // parameters' gradients then hold the sums over ranks.
  absl::Status Finish();

  size_t num_buckets() const { return buckets_.size(); }
  // How many buckets of the last step started before Finish(), i.e. overlapped with backward.
  int started_during_backward() const { return started_during_backward_; }

 private:
  struct Bucket {
    torch::Tensor flat;
    std::vector<size_t> params;  // indices into params_
    size_t pending = 0;          // gradients not accumulated yet this step
    std::unique_ptr<CollectiveWork> work;
  };
  void OnGradient(size_t param);
  void StartReadyBuckets();  // mu_ held

  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> aliases_;  // params_[i].grad() when untouched
  std::vector<size_t> bucket_of_;
  std::vector<bool> seen_;
  std::vector<Bucket> buckets_;
  Collective* collective_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  std::mutex mu_;
  size_t next_to_start_ = 0;
  bool in_backward_ = false;
  int started_during_backward_ = 0;
  absl::Status error_;
};

}  // namespace flashdraft
