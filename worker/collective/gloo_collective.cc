#include "worker/collective/gloo_collective.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

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

// A started c10d collective, or the error that kept it from starting. Keeps the tensors it works
// on alive until it is waited for.
class GlooWork : public CollectiveWork {
 public:
  GlooWork(const char* what, c10::intrusive_ptr<c10d::Work> work, absl::Status start,
           std::vector<torch::Tensor> keep = {})
      : what_(what), work_(std::move(work)), status_(std::move(start)), keep_(std::move(keep)) {}
  absl::Status Wait(const AbortCheck& abort) override {
    if (work_ && status_.ok()) {
      if (abort) {
        // Poll, so that a superseded group's collective cannot block the training thread.
        while (!work_->isCompleted()) {
          if (abort()) return absl::AbortedError(absl::StrCat("gloo ", what_, " abandoned"));
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
      try {
        work_->wait();
      } catch (const std::exception& e) {
        status_ = WorkError(what_, e);
      }
      work_.reset();
    }
    keep_.clear();
    return status_;
  }

 private:
  const char* what_;
  c10::intrusive_ptr<c10d::Work> work_;
  absl::Status status_;
  std::vector<torch::Tensor> keep_;
};

// Starts a c10d collective; an exception while starting becomes the work's error.
template <typename Fn>
std::unique_ptr<CollectiveWork> Start(const char* what, std::vector<torch::Tensor> keep, Fn fn) {
  try {
    return std::make_unique<GlooWork>(what, fn(), absl::OkStatus(), std::move(keep));
  } catch (const std::exception& e) {
    return std::make_unique<GlooWork>(what, c10::intrusive_ptr<c10d::Work>(), WorkError(what, e));
  }
}

std::unique_ptr<CollectiveWork> Done(const char* what) {
  return std::make_unique<GlooWork>(what, c10::intrusive_ptr<c10d::Work>(), absl::OkStatus());
}

// One group's rendezvous, shared by the thread that forms it and the caller, who may give up
// first (the thread then finishes alone).
struct Rendezvous {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group ABSL_GUARDED_BY(mu);  // null: it failed
  std::string error ABSL_GUARDED_BY(mu);
};

// Forms the group (blocks until every rank came or the timeout); null with `error` set when it
// could not.
c10::intrusive_ptr<c10d::ProcessGroupGloo> FormGroup(c10::intrusive_ptr<c10d::Store> store,
                                                     int rank, int world_size,
                                                     const GlooOptions& options,
                                                     std::string* error) {
  try {
    auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
    opts->devices.push_back(
        options.interface.empty()
            ? c10d::ProcessGroupGloo::createDeviceForHostname(
                  options.address.empty() ? "127.0.0.1" : options.address)
            : c10d::ProcessGroupGloo::createDeviceForInterface(options.interface));
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, opts);
  } catch (const std::exception& e) {
    *error = e.what();
    return {};
  }
}

// Waits until the rendezvous is done (true) or abort() says to give up (false), asked every
// millisecond with the lock released.
bool AwaitRendezvous(Rendezvous& r, const AbortCheck& abort) {
  while (true) {
    {
      absl::MutexLock lock(&r.mu);
      if (!abort) {
        r.mu.Await(absl::Condition(&r.done));
        return true;
      }
      if (r.mu.AwaitWithTimeout(absl::Condition(&r.done), absl::Milliseconds(1))) return true;
    }
    if (abort()) return false;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCollective>> GlooCollective::Create(
    c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, const GlooOptions& options,
    const AbortCheck& abort) {
  // The rendezvous runs on a thread of its own; an abandoned one finishes (or times out) there.
  auto rendezvous = std::make_shared<Rendezvous>();
  std::thread([rendezvous, store, rank, world_size, options] {
    std::string error;
    c10::intrusive_ptr<c10d::ProcessGroupGloo> group =
        FormGroup(store, rank, world_size, options, &error);
    absl::MutexLock lock(&rendezvous->mu);
    rendezvous->group = std::move(group);
    rendezvous->error = std::move(error);
    rendezvous->done = true;
  }).detach();
  if (!AwaitRendezvous(*rendezvous, abort)) {
    return absl::AbortedError(
        absl::StrCat("forming the Gloo group (rank ", rank, " of ", world_size, ") abandoned"));
  }
  absl::MutexLock lock(&rendezvous->mu);
  if (!rendezvous->group) {
    return absl::UnavailableError(absl::StrCat("cannot form the Gloo process group (rank ", rank,
                                               " of ", world_size, "): ", rendezvous->error));
  }
  auto c = std::unique_ptr<GlooCollective>(new GlooCollective());
  c->rank_ = rank;
  c->world_size_ = world_size;
  c->group_ = std::move(rendezvous->group);
  return c;
}

std::unique_ptr<CollectiveWork> GlooCollective::StartAllReduceSum(torch::Tensor flat) {
  if (world_size_ == 1 || flat.numel() == 0) return Done("allreduce");
  return Start("allreduce", {flat}, [&] {
    std::vector<torch::Tensor> tensors = {flat};
    return group_->allreduce(tensors);
  });
}

std::unique_ptr<CollectiveWork> GlooCollective::StartAllToAll(torch::Tensor send,
                                                              torch::Tensor recv,
                                                              std::vector<int64_t> send_rows,
                                                              std::vector<int64_t> recv_rows) {
  if (world_size_ == 1) {
    return Start("alltoall", {}, [&] {
      recv.copy_(send);
      return c10::intrusive_ptr<c10d::Work>();
    });
  }
  return Start("alltoall", {send, recv},
               [&] { return group_->alltoall_base(recv, send, recv_rows, send_rows); });
}

std::unique_ptr<CollectiveWork> GlooCollective::StartAllGather(std::vector<torch::Tensor> outputs,
                                                               torch::Tensor input) {
  if (world_size_ == 1) {
    return Start("allgather", {}, [&] {
      outputs.at(0).copy_(input);
      return c10::intrusive_ptr<c10d::Work>();
    });
  }
  std::vector<torch::Tensor> keep = outputs;
  keep.push_back(input);
  return Start("allgather", std::move(keep), [&] {
    std::vector<std::vector<torch::Tensor>> out = {outputs};
    std::vector<torch::Tensor> in = {input};
    return group_->allgather(out, in);
  });
}

std::unique_ptr<CollectiveWork> GlooCollective::StartBroadcast(torch::Tensor tensor, int root) {
  if (world_size_ == 1) return Done("broadcast");
  return Start("broadcast", {tensor}, [&] {
    std::vector<torch::Tensor> tensors = {tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    return group_->broadcast(tensors, opts);
  });
}

absl::Status GlooCollective::Barrier() {
  if (world_size_ == 1) return absl::OkStatus();
  return RunWork("barrier", [&] { return group_->barrier(); });
}

}  // namespace flashdraft
