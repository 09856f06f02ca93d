#include "worker/collective/gloo_collective.h"

#include "absl/strings/str_cat.h"

namespace flashdraft {
namespace {

absl::Status WorkError(const char* what, const std::exception& e) {
  return absl::UnavailableError(absl::StrCat("gloo ", what, " failed: ", e.what()));
}

// Runs a c10d call and waits for it, turning exceptions (timeouts, peers gone) into a Status.
template <typename Fn>
absl::Status RunWork(const char* what, Fn fn) {
  try {
    c10::intrusive_ptr<c10d::Work> work = fn();
    work->wait();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return WorkError(what, e);
  }
}

// A started c10d collective, or the error that kept it from starting.
class GlooWork : public CollectiveWork {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, absl::Status start)
      : work_(std::move(work)), status_(std::move(start)) {}
  absl::Status Wait() override {
    if (work_ && status_.ok()) {
      try {
        work_->wait();
      } catch (const std::exception& e) {
        status_ = WorkError("allreduce", e);
      }
      work_.reset();
    }
    return status_;
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  absl::Status status_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCollective>> GlooCollective::Create(
    c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, const GlooOptions& options) {
  auto c = std::unique_ptr<GlooCollective>(new GlooCollective());
  c->rank_ = rank;
  c->world_size_ = world_size;
  try {
    auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
    opts->devices.push_back(
        options.interface.empty()
            ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
            : c10d::ProcessGroupGloo::createDeviceForInterface(options.interface));
    c->group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, opts);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot form the Gloo process group (rank ", rank,
                                               " of ", world_size, "): ", e.what()));
  }
  return c;
}

std::unique_ptr<CollectiveWork> GlooCollective::StartAllReduceSum(torch::Tensor flat) {
  if (world_size_ == 1 || flat.numel() == 0) {
    return std::make_unique<GlooWork>(c10::intrusive_ptr<c10d::Work>(), absl::OkStatus());
  }
  try {
    std::vector<torch::Tensor> tensors = {std::move(flat)};
    return std::make_unique<GlooWork>(group_->allreduce(tensors), absl::OkStatus());
  } catch (const std::exception& e) {
    return std::make_unique<GlooWork>(c10::intrusive_ptr<c10d::Work>(), WorkError("allreduce", e));
  }
}

absl::Status GlooCollective::Barrier() {
  if (world_size_ == 1) return absl::OkStatus();
  return RunWork("barrier", [&] { return group_->barrier(); });
}

}  // namespace flashdraft
