#include "worker/gradient_reducer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flashdraft {

GradientReducer::GradientReducer(std::vector<torch::Tensor> params, Collective* collective,
                                 GradientReducerOptions options)
    : params_(std::move(params)), options_(options), collective_(collective) {
  if (!options_.ordered && collective_->world_size() == 1) return;
  absl::MutexLock lock(&mu_);  // nothing else runs yet; for the annotations
  // Buckets per (dtype, device), filled in reverse registration order.
  std::map<std::pair<int, std::string>, size_t> open;  // key -> index of the bucket being filled
  std::vector<size_t> bucket_bytes_used;
  bucket_of_.assign(params_.size(), 0);
  offset_in_bucket_.assign(params_.size(), -1);
  for (size_t k = params_.size(); k-- > 0;) {
    const torch::Tensor& p = params_[k];
    if (!p.requires_grad()) continue;
    const auto key = std::make_pair(static_cast<int>(p.scalar_type()), p.device().str());
    const size_t bytes = static_cast<size_t>(p.numel()) * p.element_size();
    auto it = open.find(key);
    if (it == open.end() || (bucket_bytes_used[it->second] > 0 &&
                             bucket_bytes_used[it->second] + bytes > options_.bucket_bytes)) {
      buckets_.emplace_back();
      bucket_bytes_used.push_back(0);
      it = open.insert_or_assign(key, buckets_.size() - 1).first;
    }
    Bucket& b = buckets_[it->second];
    b.options = p.options().requires_grad(false);
    bucket_of_[k] = it->second;
    offset_in_bucket_[k] = b.numel;
    b.numel += p.numel();
    bucket_bytes_used[it->second] += bytes;
  }
  num_buckets_ = buckets_.size();
  const int64_t world = collective_->world_size();
  for (Bucket& b : buckets_) b.slice = options_.ordered ? (b.numel + world - 1) / world : b.numel;
  seen_.assign(params_.size(), false);
  for (size_t k = 0; k < params_.size(); ++k) {
    if (offset_in_bucket_[k] < 0) continue;
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

GradientReducer::~GradientReducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

torch::Tensor& GradientReducer::Slot(Bucket& b, int slot) {
  while (static_cast<int>(b.slots.size()) <= slot) {
    const int64_t n = b.slice * (options_.ordered ? collective_->world_size() : 1);
    b.slots.push_back(torch::zeros({n}, b.options));
  }
  return b.slots[slot];
}

const torch::Tensor& GradientReducer::Alias(int slot, size_t k) {
  if (static_cast<int>(aliases_.size()) <= slot) aliases_.resize(slot + 1);
  std::vector<torch::Tensor>& aliases = aliases_[slot];
  if (aliases.empty()) {
    aliases.resize(params_.size());
    for (size_t p = 0; p < params_.size(); ++p) {
      if (offset_in_bucket_[p] < 0) continue;
      // An alias, not an autograd view: the optimizer's zero_grad detaches and zeroes it in place.
      torch::Tensor flat = Slot(buckets_[bucket_of_[p]], slot);
      aliases[p] = torch::from_blob(
          static_cast<char*>(flat.data_ptr()) + offset_in_bucket_[p] * flat.element_size(),
          params_[p].sizes(), [flat](void*) mutable { flat.reset(); }, flat.options());
    }
  }
  return aliases[k];
}

absl::Status GradientReducer::BeginStep(int64_t num_shards, const std::vector<int64_t>& offsets) {
  if (!options_.ordered) {
    return absl::FailedPreconditionError("BeginStep is for the ordered reduction");
  }
  const int world = collective_->world_size();
  bool valid = static_cast<int>(offsets.size()) == world + 1 && offsets.front() == 0 &&
               offsets.back() == num_shards;
  for (size_t r = 1; valid && r < offsets.size(); ++r) valid = offsets[r] > offsets[r - 1];
  if (!valid) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard layout [", absl::StrJoin(offsets, ", "), "] does not give each of ",
                     world, " ranks at least one of ", num_shards, " shards"));
  }
  absl::MutexLock lock(&mu_);
  for (Bucket& b : buckets_) {
    b.work.reset();  // a failed step's: dropping it does not wait
    b.merged = true;
  }
  num_shards_ = num_shards;
  offsets_ = offsets;
  step_nodes_.clear();
  nodes_per_rank_.clear();
  for (int r = 0; r < world; ++r) {
    const std::vector<ShardNode> cover = ShardTreeCover(num_shards, offsets[r], offsets[r + 1]);
    step_nodes_.insert(step_nodes_.end(), cover.begin(), cover.end());
    nodes_per_rank_.push_back(static_cast<int64_t>(cover.size()));
  }
  next_shard_ = offsets_[collective_->rank()];
  stack_ = ShardStack(num_shards);
  pending_adds_.clear();
  next_to_start_ = 0;
  started_during_backward_ = 0;
  bytes_sent_ = 0;
  in_backward_ = false;
  error_ = absl::OkStatus();
  return absl::OkStatus();
}

void GradientReducer::Prepare() {
  if (num_buckets_ == 0) return;
  torch::NoGradGuard no_grad;
  absl::MutexLock lock(&mu_);
  if (options_.ordered) {
    if (num_shards_ == 0 || next_shard_ >= offsets_[collective_->rank() + 1]) {
      error_ = absl::FailedPreconditionError(
          "a shard beyond this rank's range (BeginStep first, one Prepare per own shard)");
      in_backward_ = false;
      return;
    }
    // The previous shard's tree additions in buckets whose gradients did not all arrive.
    for (Bucket& b : buckets_) {
      if (!b.merged) MergeShard(b);
    }
    current_slot_ = stack_.size();
    pending_adds_ = stack_.Push({next_shard_, next_shard_ + 1});
    ++next_shard_;
  } else {
    for (Bucket& b : buckets_) b.work.reset();  // a failed step's: dropping it does not wait
    current_slot_ = 0;
    next_to_start_ = 0;
    started_during_backward_ = 0;
    bytes_sent_ = 0;
    error_ = absl::OkStatus();
  }
  for (Bucket& b : buckets_) {
    Slot(b, current_slot_).zero_();
    b.merged = false;
    b.pending = 0;
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    if (offset_in_bucket_[k] < 0) continue;
    params_[k].mutable_grad() = Alias(current_slot_, k);
    ++buckets_[bucket_of_[k]].pending;
    seen_[k] = false;
  }
  in_backward_ = true;
}

void GradientReducer::OnGradient(size_t k) {
  absl::MutexLock lock(&mu_);
  if (!in_backward_) return;  // a backward outside Prepare/Finish (tests, tools): not ours
  Bucket& b = buckets_[bucket_of_[k]];
  if (seen_[k]) {
    error_ = absl::InternalError(
        absl::StrCat("parameter ", k,
                     " received a second gradient in one shard; the reducer expects one "
                     "backward per Prepare"));
    return;
  }
  seen_[k] = true;
  // Something replaced the alias (it should not): bring the gradient into the bucket.
  torch::Tensor& grad = params_[k].mutable_grad();
  const torch::Tensor& alias = Alias(current_slot_, k);
  if (!grad.is_same(alias)) {
    torch::NoGradGuard no_grad;
    alias.copy_(grad);
    grad = alias;
  }
  if (--b.pending > 0) return;
  if (!options_.ordered) return StartReadyBuckets();
  MergeShard(b);
  if (next_shard_ == offsets_[collective_->rank() + 1]) StartReadyBuckets();
}

void GradientReducer::MergeShard(Bucket& b) {
  torch::NoGradGuard no_grad;
  for (const auto& [into, from] : pending_adds_) Slot(b, into).add_(Slot(b, from));
  b.merged = true;
}

void GradientReducer::StartReadyBuckets() {
  while (next_to_start_ < buckets_.size() && buckets_[next_to_start_].pending == 0 &&
         (!options_.ordered || buckets_[next_to_start_].merged)) {
    StartBucket(buckets_[next_to_start_++]);
    if (in_backward_) ++started_during_backward_;
  }
}

void GradientReducer::StartBucket(Bucket& b) {
  torch::NoGradGuard no_grad;
  const int64_t world = collective_->world_size();
  const int64_t element = Slot(b, 0).element_size();
  if (!options_.ordered) {
    b.work = collective_->StartAllReduceSum(b.slots[0]);
    bytes_sent_ += static_cast<uint64_t>(2 * (world - 1) * b.numel / world * element);
    return;
  }
  // The rank's tree nodes, slice-major: rows [q·m, (q+1)·m) go to rank q.
  const int64_t m = stack_.size();
  b.send = torch::empty({world * m, b.slice}, b.slots[0].options());
  auto send = b.send.view({world, m, b.slice});
  for (int64_t i = 0; i < m; ++i) send.select(1, i).copy_(b.slots[i].view({world, b.slice}));
  b.recv = torch::empty({static_cast<int64_t>(step_nodes_.size()), b.slice}, b.slots[0].options());
  b.work =
      collective_->StartAllToAll(b.send, b.recv, std::vector<int64_t>(world, m), nodes_per_rank_);
  bytes_sent_ += static_cast<uint64_t>((world - 1) * m * b.slice * element);
}

absl::Status GradientReducer::Finish(const AbortCheck& abort) {
  if (num_buckets_ == 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (options_.ordered) return FinishOrdered(abort);
  in_backward_ = false;
  while (next_to_start_ < buckets_.size()) StartBucket(buckets_[next_to_start_++]);
  absl::Status status = error_;
  for (Bucket& b : buckets_) {
    absl::Status s = b.work->Wait(abort);
    b.work.reset();
    if (status.ok() && !s.ok()) status = s;
    if (absl::IsAborted(s)) return s;
  }
  if (!status.ok()) return status;
  // The sums are in the buckets; a gradient replaced after its hook would not see them.
  for (size_t k = 0; k < params_.size(); ++k) {
    if (offset_in_bucket_[k] >= 0 && !params_[k].grad().is_same(Alias(0, k))) {
      return absl::InternalError(
          absl::StrCat("parameter ", k, "'s gradient was replaced during the step"));
    }
  }
  return absl::OkStatus();
}

absl::Status GradientReducer::FinishOrdered(const AbortCheck& abort) {
  torch::NoGradGuard no_grad;
  in_backward_ = false;
  const int world = collective_->world_size(), rank = collective_->rank();
  if (num_shards_ == 0) return absl::FailedPreconditionError("Finish before BeginStep");
  const int64_t expected = offsets_[rank + 1] - offsets_[rank];
  if (next_shard_ != offsets_[rank + 1]) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " computed ",
                                                      expected - (offsets_[rank + 1] - next_shard_),
                                                      " of its ", expected, " shards"));
  }
  for (Bucket& b : buckets_) {
    if (!b.merged) MergeShard(b);
  }
  while (next_to_start_ < buckets_.size()) StartBucket(buckets_[next_to_start_++]);
  absl::Status status = error_;
  std::vector<std::unique_ptr<CollectiveWork>> gathers;
  for (Bucket& b : buckets_) {
    absl::Status s = b.work->Wait(abort);
    b.work.reset();
    if (absl::IsAborted(s)) return s;
    if (status.ok() && !s.ok()) status = s;
    if (!status.ok()) continue;  // a failed exchange: starting more collectives would only hang
    // This rank's slice: the tree over everyone's nodes, in the tree's own order.
    ShardStack tree(num_shards_);
    std::vector<torch::Tensor> rows;
    for (size_t i = 0; i < step_nodes_.size(); ++i) {
      rows.push_back(b.recv[static_cast<int64_t>(i)]);
      for (const auto& [into, from] : tree.Push(step_nodes_[i])) {
        rows[into].add_(rows[from]);
        rows.pop_back();
      }
    }
    CHECK(tree.size() == 1 && tree.nodes()[0] == (ShardNode{0, num_shards_}));
    std::vector<torch::Tensor> outputs;
    const torch::Tensor all = b.slots[0].view({world, b.slice});
    for (int r = 0; r < world; ++r) outputs.push_back(all[r]);
    gathers.push_back(collective_->StartAllGather(std::move(outputs), rows[0]));
    bytes_sent_ += static_cast<uint64_t>((world - 1) * b.slice * b.slots[0].element_size());
  }
  for (auto& g : gathers) {
    absl::Status s = g->Wait(abort);
    if (absl::IsAborted(s)) return s;
    if (status.ok() && !s.ok()) status = s;
  }
  for (Bucket& b : buckets_) b.send = b.recv = torch::Tensor();
  num_shards_ = 0;
  if (!status.ok()) return status;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (offset_in_bucket_[k] >= 0) params_[k].mutable_grad() = Alias(0, k);
  }
  return absl::OkStatus();
}

}  // namespace flashdraft
