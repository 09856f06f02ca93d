#include "worker/gradient_reducer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace flashdraft {

GradientReducer::GradientReducer(std::vector<torch::Tensor> params, Collective* collective,
                                 size_t bucket_bytes)
    : params_(std::move(params)), collective_(collective) {
  if (collective_->world_size() == 1) return;
  // Buckets per (dtype, device), filled in reverse registration order.
  std::map<std::pair<int, std::string>, size_t> open;  // key -> index of the bucket being filled
  std::vector<size_t> bucket_bytes_used;
  bucket_of_.assign(params_.size(), 0);
  for (size_t k = params_.size(); k-- > 0;) {
    const torch::Tensor& p = params_[k];
    if (!p.requires_grad()) continue;
    const auto key = std::make_pair(static_cast<int>(p.scalar_type()), p.device().str());
    const size_t bytes = static_cast<size_t>(p.numel()) * p.element_size();
    auto it = open.find(key);
    if (it == open.end() || (bucket_bytes_used[it->second] > 0 &&
                             bucket_bytes_used[it->second] + bytes > bucket_bytes)) {
      buckets_.emplace_back();
      bucket_bytes_used.push_back(0);
      it = open.insert_or_assign(key, buckets_.size() - 1).first;
    }
    buckets_[it->second].params.push_back(k);
    bucket_bytes_used[it->second] += bytes;
    bucket_of_[k] = it->second;
  }
  aliases_.resize(params_.size());
  for (Bucket& b : buckets_) {
    int64_t numel = 0;
    for (size_t k : b.params) numel += params_[k].numel();
    const torch::Tensor& first = params_[b.params.front()];
    b.flat = torch::zeros({numel}, first.options().requires_grad(false));
    int64_t offset = 0;
    for (size_t k : b.params) {
      // An alias, not an autograd view: the optimizer's zero_grad detaches and zeroes it in place.
      torch::Tensor flat = b.flat;
      aliases_[k] = torch::from_blob(
          static_cast<char*>(b.flat.data_ptr()) + offset * b.flat.element_size(),
          params_[k].sizes(), [flat](void*) mutable { flat.reset(); }, b.flat.options());
      offset += params_[k].numel();
    }
  }
  seen_.assign(params_.size(), false);
  for (Bucket& b : buckets_) {
    for (size_t k : b.params) {
      std::shared_ptr<torch::autograd::Node> acc =
          torch::autograd::impl::grad_accumulator(params_[k]);
      hook_keys_.push_back(
          acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
              [this, k](const torch::autograd::variable_list& outputs,
                        const torch::autograd::variable_list&) {
                OnGradient(k);
                return outputs;
              })));
      // The parameter holds its accumulator weakly; keep it (and so the hook) alive.
      accumulators_.push_back(std::move(acc));
    }
  }
}

GradientReducer::~GradientReducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  // Buckets still in flight (a failed step) must finish before their memory goes.
  for (Bucket& b : buckets_) {
    if (b.work) (void)b.work->Wait();
  }
}

void GradientReducer::Prepare() {
  if (buckets_.empty()) return;
  torch::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(mu_);
  for (Bucket& b : buckets_) {
    if (b.work) (void)b.work->Wait();
    b.work.reset();
    b.pending = b.params.size();
    for (size_t k : b.params) {
      torch::Tensor& grad = params_[k].mutable_grad();
      if (!grad.defined()) {
        aliases_[k].zero_();
      } else if (!grad.is_same(aliases_[k])) {
        aliases_[k].copy_(grad);
      }
      grad = aliases_[k];
      seen_[k] = false;
    }
  }
  next_to_start_ = 0;
  started_during_backward_ = 0;
  in_backward_ = true;
  error_ = absl::OkStatus();
}

void GradientReducer::OnGradient(size_t k) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!in_backward_) return;  // a backward outside Prepare/Finish (tests, tools): not ours
  Bucket& b = buckets_[bucket_of_[k]];
  if (seen_[k]) {
    error_ = absl::InternalError(
        absl::StrCat("parameter ", k,
                     " received a second gradient in one step; the reducer expects one "
                     "backward per step"));
    return;
  }
  seen_[k] = true;
  // Something replaced the alias (it should not): bring the gradient into the bucket.
  torch::Tensor& grad = params_[k].mutable_grad();
  if (!grad.is_same(aliases_[k])) {
    torch::NoGradGuard no_grad;
    aliases_[k].copy_(grad);
    grad = aliases_[k];
  }
  if (--b.pending == 0) StartReadyBuckets();
}

void GradientReducer::StartReadyBuckets() {
  while (next_to_start_ < buckets_.size() && buckets_[next_to_start_].pending == 0) {
    Bucket& b = buckets_[next_to_start_++];
    b.work = collective_->StartAllReduceSum(b.flat);
    ++started_during_backward_;
  }
}

absl::Status GradientReducer::Finish() {
  if (buckets_.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  in_backward_ = false;
  while (next_to_start_ < buckets_.size()) {
    Bucket& b = buckets_[next_to_start_++];
    b.work = collective_->StartAllReduceSum(b.flat);
  }
  absl::Status status = error_;
  for (Bucket& b : buckets_) {
    absl::Status s = b.work->Wait();
    b.work.reset();
    if (status.ok() && !s.ok()) status = s;
  }
  if (!status.ok()) return status;
  // The sums are in the buckets; a gradient replaced after its hook would not see them.
  for (size_t k = 0; k < params_.size(); ++k) {
    if (aliases_[k].defined() && !params_[k].grad().is_same(aliases_[k])) {
      return absl::InternalError(
          absl::StrCat("parameter ", k, "'s gradient was replaced during the step"));
    }
  }
  return absl::OkStatus();
}

}  // namespace flashdraft
