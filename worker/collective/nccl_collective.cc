#include "worker/collective/nccl_collective.h"

#include <cstring>
#include <map>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda_api.h"
#include "common/status_macros.h"

// Returns the CUDA error of `expr` (a cudaError_t) as a Status naming `what`.
#define FD_CUDA_RETURN(expr, what) FD_RETURN_IF_ERROR(CudaCheck(what, (expr)))

namespace flashdraft {
namespace {

constexpr const char* kUniqueIdKey = "nccl_unique_id";

// The loaded libraries; Create loads both before anything else calls them.
const CudaApi& Cu() { return **LoadCuda(); }
const NcclApi& Nc() { return **LoadNccl(); }
constexpr auto kPoll = std::chrono::microseconds(50);

absl::Status CudaCheck(const char* what, cudaError_t e) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("CUDA ", what, " failed: ", CudaErrorText(Cu(), e)));
}

absl::Status NcclError(const std::string& what, ncclResult_t r, ncclComm_t comm) {
  const char* last = Nc().GetLastError(comm);
  return absl::UnavailableError(
      absl::StrCat("NCCL ", what, " failed: ", Nc().GetErrorString(r),
                   last != nullptr && *last ? absl::StrCat(" (", last, ")") : std::string()));
}

absl::StatusOr<ncclDataType_t> NcclType(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return ncclFloat32;
    case torch::kFloat64:
      return ncclFloat64;
    case torch::kFloat16:
      return ncclFloat16;
    case torch::kBFloat16:
      return ncclBfloat16;
    case torch::kInt64:
      return ncclInt64;
    case torch::kInt32:
      return ncclInt32;
    case torch::kUInt8:
      return ncclUint8;
    case torch::kInt8:
      return ncclInt8;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL cannot sum tensors of dtype ", c10::toString(t)));
  }
}

size_t Bytes(const torch::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// Pinned host memory and device memory of the same size: a host tensor's way through NCCL.
struct DeviceBuffer {
  void* host = nullptr;
  void* device = nullptr;
  size_t bytes = 0;
};

void FreeBuffer(const DeviceBuffer& b) {
  if (b.host != nullptr) Cu().FreeHost(b.host);
  if (b.device != nullptr) Cu().Free(b.device);
}

}  // namespace

struct NcclCollective::Impl {
  ~Impl() {
    Abort();
    if (stream != nullptr) {
      Cu().SetDevice(device);
      Cu().StreamSynchronize(stream);  // aborted kernels end; the buffers are then free to go
      Cu().StreamDestroy(stream);
    }
    absl::MutexLock lock(&mu);
    for (auto& [bytes, b] : free_buffers) FreeBuffer(b);
    for (const DeviceBuffer& b : abandoned) FreeBuffer(b);
  }

  // Aborts the communicator once; later operations and waits end with ABORTED.
  void Abort() {
    absl::MutexLock lock(&mu);
    if (comm != nullptr) {
      Nc().CommAbort(comm);
      comm = nullptr;
    }
    aborted = true;
  }

  // NCCL's asynchronous error on the communicator (OK while it is healthy).
  absl::Status AsyncError(const std::string& what) {
    absl::MutexLock lock(&mu);
    if (aborted) return absl::AbortedError(absl::StrCat("NCCL ", what, ": communicator aborted"));
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = Nc().CommGetAsyncError(comm, &async);
    if (r != ncclSuccess) return NcclError(what, r, comm);
    if (async != ncclSuccess && async != ncclInProgress) return NcclError(what, async, comm);
    return absl::OkStatus();
  }

  // The communicator is non-blocking: a call may return ncclInProgress while NCCL finishes it in
  // the background. Polls it to the end: DEADLINE_EXCEEDED past `deadline` on the clock (< 0: the
  // timeout from now), ABORTED when abort() says so. Needs mu held.
  absl::Status Settle(const std::string& what, ncclResult_t r, const AbortCheck& abort = nullptr,
                      double deadline = -1) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (deadline < 0) deadline = clock->Now() + timeout.count() / 1000.0;
    while (r == ncclInProgress) {
      if (abort && abort()) return absl::AbortedError(absl::StrCat("NCCL ", what, " abandoned"));
      if (clock->Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrFormat("NCCL %s still in progress after %.0f s", what, timeout.count() / 1e3));
      }
      std::this_thread::sleep_for(kPoll);
      ncclResult_t async = ncclSuccess;
      const ncclResult_t q = Nc().CommGetAsyncError(comm, &async);
      r = q != ncclSuccess ? q : async;
    }
    return r == ncclSuccess ? absl::OkStatus() : NcclError(what, r, comm);
  }

  absl::StatusOr<DeviceBuffer> Acquire(size_t bytes) {
    {
      absl::MutexLock lock(&mu);
      auto it = free_buffers.lower_bound(bytes);
      if (it != free_buffers.end()) {
        DeviceBuffer b = it->second;
        free_buffers.erase(it);
        return b;
      }
    }
    DeviceBuffer b;
    b.bytes = std::max<size_t>(bytes, 256);
    absl::Status s = CudaCheck("cudaHostAlloc", Cu().HostAlloc(&b.host, b.bytes, 0));
    if (s.ok()) s = CudaCheck("cudaMalloc", Cu().Malloc(&b.device, b.bytes));
    if (!s.ok()) {
      FreeBuffer(b);
      return absl::ResourceExhaustedError(
          absl::StrCat(s.message(), " (a staging buffer of ", b.bytes, " bytes)"));
    }
    return b;
  }

  void Release(const DeviceBuffer& b) {
    absl::MutexLock lock(&mu);
    free_buffers.emplace(b.bytes, b);
  }

  void Abandon(std::vector<DeviceBuffer> buffers) {
    absl::MutexLock lock(&mu);
    abandoned.insert(abandoned.end(), buffers.begin(), buffers.end());
  }

  int device = 0;
  cudaStream_t stream = nullptr;
  std::chrono::milliseconds timeout{300000};
  const Clock* clock = &RealClock::Get();
  // NCCL calls on the communicator (collectives start on autograd's threads too) and the pool.
  absl::Mutex mu;
  ncclComm_t comm ABSL_GUARDED_BY(mu) = nullptr;
  bool aborted ABSL_GUARDED_BY(mu) = false;
  std::multimap<size_t, DeviceBuffer> free_buffers ABSL_GUARDED_BY(mu);
  // Buffers of work dropped before it finished: freed once the stream is drained.
  std::vector<DeviceBuffer> abandoned ABSL_GUARDED_BY(mu);
};

namespace {

using Impl = NcclCollective::Impl;

// One started operation: its completion event on the collective's stream, the device tensors it
// works on in place (kept alive), and the host tensors it copies back into when it completes.
class NcclWork : public CollectiveWork {
 public:
  NcclWork(std::shared_ptr<Impl> impl, std::string what)
      : impl_(std::move(impl)), what_(std::move(what)) {}
  ~NcclWork() override {
    if (done_ != nullptr) Cu().EventDestroy(done_);
    if (ready_ != nullptr) Cu().EventDestroy(ready_);
    if (!finished_) {
      impl_->Abandon(std::move(buffers_));
    } else {
      for (const DeviceBuffer& b : buffers_) impl_->Release(b);
    }
  }

  // Before the operation: the collective's stream waits for what LibTorch queued on the default
  // stream (the operands' producers), and host operands are staged.
  absl::Status Begin() {
    FD_CUDA_RETURN(Cu().SetDevice(impl_->device), "cudaSetDevice");
    FD_CUDA_RETURN(Cu().EventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    FD_CUDA_RETURN(Cu().EventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    FD_CUDA_RETURN(Cu().EventRecord(ready_, nullptr), "cudaEventRecord");
    FD_CUDA_RETURN(Cu().StreamWaitEvent(impl_->stream, ready_, 0), "cudaStreamWaitEvent");
    return absl::OkStatus();
  }

  // The device address of `t` for the operation: its own memory when it is a CUDA tensor, else a
  // staging buffer (filled from `t` when `copy_in`; copied back into `t` when `copy_back`).
  absl::StatusOr<char*> Operand(const torch::Tensor& t, bool copy_in, bool copy_back) {
    if (!t.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat("NCCL ", what_, ": tensor not contiguous"));
    }
    if (t.is_cuda()) {
      keep_.push_back(t);
      return static_cast<char*>(t.data_ptr());
    }
    const size_t n = Bytes(t);
    absl::StatusOr<DeviceBuffer> b = impl_->Acquire(n);
    if (!b.ok()) return b.status();
    buffers_.push_back(*b);
    if (copy_in && n > 0) {
      std::memcpy(b->host, t.data_ptr(), n);
      FD_CUDA_RETURN(Cu().MemcpyAsync(b->device, b->host, n, cudaMemcpyHostToDevice, impl_->stream),
                     "cudaMemcpyAsync");
    }
    if (copy_back) back_.push_back({t, b->host, b->device, n});
    return static_cast<char*>(b->device);
  }

  // Copies `n` bytes at `src` (device) into `out` after the operation: on the device for a CUDA
  // tensor, through a staging buffer for a host tensor.
  absl::Status CopyOut(const torch::Tensor& out, const char* src, size_t n) {
    if (out.is_cuda()) {
      keep_.push_back(out);
      FD_CUDA_RETURN(
          Cu().MemcpyAsync(out.data_ptr(), src, n, cudaMemcpyDeviceToDevice, impl_->stream),
          "cudaMemcpyAsync");
      return absl::OkStatus();
    }
    absl::StatusOr<DeviceBuffer> b = impl_->Acquire(n);
    if (!b.ok()) return b.status();
    buffers_.push_back(*b);
    back_.push_back({out, b->host, src, n});
    return absl::OkStatus();
  }

  // After the operation: the copies back to pinned memory, then the completion event.
  absl::Status End() {
    for (const Back& b : back_) {
      if (b.bytes == 0) continue;
      FD_CUDA_RETURN(
          Cu().MemcpyAsync(b.pinned, b.device, b.bytes, cudaMemcpyDeviceToHost, impl_->stream),
          "cudaMemcpyAsync");
    }
    FD_CUDA_RETURN(Cu().EventRecord(done_, impl_->stream), "cudaEventRecord");
    started_ = true;
    return absl::OkStatus();
  }

  void Fail(absl::Status status) { status_ = std::move(status); }

  absl::Status Wait(const AbortCheck& abort) override {
    if (finished_ || !status_.ok() || !started_) return status_;
    const double deadline = impl_->clock->Now() + impl_->timeout.count() / 1000.0;
    while (true) {
      const cudaError_t q = Cu().EventQuery(done_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) return status_ = CudaCheck("cudaEventQuery", q);
      if (absl::Status s = impl_->AsyncError(what_); !s.ok()) return status_ = s;
      if (abort && abort()) {
        return status_ = absl::AbortedError(absl::StrCat("NCCL ", what_, " abandoned"));
      }
      if (impl_->clock->Now() > deadline) {
        impl_->Abort();  // the peers are gone or stuck: end the kernels
        return status_ = absl::DeadlineExceededError(absl::StrFormat(
                   "NCCL %s did not finish within %.0f s (cluster.collective_timeout_seconds)",
                   what_, impl_->timeout.count() / 1e3));
      }
      std::this_thread::sleep_for(kPoll);
    }
    for (const Back& b : back_) {
      if (b.bytes > 0) std::memcpy(b.tensor.data_ptr(), b.pinned, b.bytes);
    }
    // LibTorch's later kernels on the default stream read the results after the operation.
    if (!keep_.empty()) Cu().StreamWaitEvent(nullptr, done_, 0);
    back_.clear();
    keep_.clear();
    finished_ = true;
    return absl::OkStatus();
  }

 private:
  struct Back {
    torch::Tensor tensor;
    void* pinned;
    const void* device;
    size_t bytes;
  };
  std::shared_ptr<Impl> impl_;
  std::string what_;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  std::vector<torch::Tensor> keep_;
  std::vector<DeviceBuffer> buffers_;
  std::vector<Back> back_;
  bool started_ = false, finished_ = false;
  absl::Status status_;
};

// Runs `issue` (the NCCL calls, under the communicator's lock) between Begin and End; any error
// becomes the work's.
template <typename Fn>
std::unique_ptr<CollectiveWork> Launch(std::unique_ptr<NcclWork> work, Fn issue) {
  absl::Status s = work->Begin();
  if (s.ok()) s = issue(*work);
  if (s.ok()) s = work->End();
  if (!s.ok()) work->Fail(std::move(s));
  return work;
}

}  // namespace

absl::StatusOr<std::string> ExchangeUniqueId(c10d::Store& store, int rank, int world_size,
                                             const std::string& id, size_t id_size,
                                             const Clock& clock, double timeout_seconds,
                                             const AbortCheck& abort) {
  const double deadline = clock.Now() + timeout_seconds;
  try {
    if (rank == 0) {
      store.set(kUniqueIdKey, std::vector<uint8_t>(id.begin(), id.end()));
      return id;
    }
    while (!store.check({kUniqueIdKey})) {
      if (abort && abort()) {
        return absl::AbortedError("forming the NCCL communicator abandoned (a newer epoch)");
      }
      if (clock.Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrFormat("rank %d of %d: rank 0 never published the NCCL unique id (%.0f s)",
                            rank, world_size, timeout_seconds));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const std::vector<uint8_t> bytes = store.get(kUniqueIdKey);
    if (bytes.size() != id_size) {
      return absl::DataLossError(absl::StrCat("the NCCL unique id in the store has ", bytes.size(),
                                              " bytes, expected ", id_size));
    }
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("NCCL unique id through the store: ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::Create(
    c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, const NcclOptions& options,
    const AbortCheck& abort) {
  FD_RETURN_IF_ERROR(CudaDeviceUsable());
  FD_RETURN_IF_ERROR(LoadNccl().status());
  if (options.device < 0 || options.device >= CudaDeviceCount()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA device ", options.device, " does not exist (", CudaDeviceCount(), " visible)"));
  }
  const Clock& clock = *options.clock;
  const double deadline = clock.Now() + options.timeout.count() / 1000.0;
  auto impl = std::make_shared<Impl>();
  impl->device = options.device;
  impl->timeout = options.timeout;
  impl->clock = options.clock;
  FD_RETURN_IF_ERROR(CudaCheck("cudaSetDevice", Cu().SetDevice(options.device)));
  FD_RETURN_IF_ERROR(CudaCheck("cudaStreamCreate",
                               Cu().StreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking)));

  // The unique id: made by rank 0, read by the others from the epoch's store.
  ncclUniqueId id;
  std::string mine;
  if (rank == 0) {
    const ncclResult_t r = Nc().GetUniqueId(&id);
    if (r != ncclSuccess) return NcclError("ncclGetUniqueId", r, nullptr);
    mine.assign(reinterpret_cast<const char*>(&id), sizeof(id));
  }
  FD_ASSIGN_OR_RETURN(const std::string shared,
                      ExchangeUniqueId(*store, rank, world_size, mine, sizeof(id), clock,
                                       options.timeout.count() / 1000.0, abort));
  std::memcpy(&id, shared.data(), sizeof(id));

  // Non-blocking, so that a superseded epoch or the timeout can stop the wait for the peers.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  {
    absl::MutexLock lock(&impl->mu);
    const std::string what = absl::StrCat("forming the communicator (rank ", rank, " of ",
                                          world_size, ", cuda:", options.device, ")");
    absl::Status s = impl->Settle(
        what, Nc().CommInitRankConfig(&impl->comm, world_size, id, rank, &config), abort, deadline);
    if (!s.ok()) {
      if (impl->comm != nullptr) Nc().CommAbort(impl->comm);
      impl->comm = nullptr;
      return s;
    }
  }
  auto c = std::unique_ptr<NcclCollective>(new NcclCollective());
  c->impl_ = std::move(impl);
  c->rank_ = rank;
  c->world_size_ = world_size;
  return c;
}

NcclCollective::~NcclCollective() {
  if (impl_) impl_->Abort();
}

std::unique_ptr<CollectiveWork> NcclCollective::StartAllReduceSum(torch::Tensor flat) {
  auto work = std::make_unique<NcclWork>(impl_, "allreduce");
  return Launch(std::move(work), [&](NcclWork& w) -> absl::Status {
    FD_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(flat.scalar_type()));
    FD_ASSIGN_OR_RETURN(char* p, w.Operand(flat, /*copy_in=*/true, /*copy_back=*/true));
    absl::MutexLock lock(&impl_->mu);
    if (impl_->aborted) return absl::AbortedError("NCCL allreduce: communicator aborted");
    return impl_->Settle("allreduce", Nc().AllReduce(p, p, static_cast<size_t>(flat.numel()), type,
                                                     ncclSum, impl_->comm, impl_->stream));
  });
}

std::unique_ptr<CollectiveWork> NcclCollective::StartAllToAll(torch::Tensor send,
                                                              torch::Tensor recv,
                                                              std::vector<int64_t> send_rows,
                                                              std::vector<int64_t> recv_rows) {
  auto work = std::make_unique<NcclWork>(impl_, "alltoall");
  return Launch(std::move(work), [&](NcclWork& w) -> absl::Status {
    const int64_t rows_in = send.dim() == 0 ? 0 : send.size(0);
    const int64_t rows_out = recv.dim() == 0 ? 0 : recv.size(0);
    const size_t row_bytes =
        rows_in > 0 ? Bytes(send) / rows_in : (rows_out > 0 ? Bytes(recv) / rows_out : 0);
    if (static_cast<int>(send_rows.size()) != world_size_ ||
        static_cast<int>(recv_rows.size()) != world_size_) {
      return absl::InvalidArgumentError("NCCL alltoall: one row count per rank");
    }
    FD_ASSIGN_OR_RETURN(char* s, w.Operand(send, /*copy_in=*/true, /*copy_back=*/false));
    FD_ASSIGN_OR_RETURN(char* r, w.Operand(recv, /*copy_in=*/false, /*copy_back=*/true));
    absl::MutexLock lock(&impl_->mu);
    if (impl_->aborted) return absl::AbortedError("NCCL alltoall: communicator aborted");
    ncclResult_t res = Nc().GroupStart();
    size_t so = 0, ro = 0;
    for (int p = 0; p < world_size_ && res == ncclSuccess; ++p) {
      const size_t sn = static_cast<size_t>(send_rows[p]) * row_bytes;
      const size_t rn = static_cast<size_t>(recv_rows[p]) * row_bytes;
      if (sn > 0) res = Nc().Send(s + so, sn, ncclUint8, p, impl_->comm, impl_->stream);
      if (res == ncclSuccess && rn > 0) {
        res = Nc().Recv(r + ro, rn, ncclUint8, p, impl_->comm, impl_->stream);
      }
      so += sn;
      ro += rn;
    }
    const ncclResult_t end = Nc().GroupEnd();
    return impl_->Settle("alltoall", res != ncclSuccess ? res : end);
  });
}

std::unique_ptr<CollectiveWork> NcclCollective::StartAllGather(std::vector<torch::Tensor> outputs,
                                                               torch::Tensor input) {
  auto work = std::make_unique<NcclWork>(impl_, "allgather");
  return Launch(std::move(work), [&](NcclWork& w) -> absl::Status {
    if (static_cast<int>(outputs.size()) != world_size_) {
      return absl::InvalidArgumentError("NCCL allgather: one output per rank");
    }
    const size_t n = Bytes(input);
    FD_ASSIGN_OR_RETURN(char* in, w.Operand(input, /*copy_in=*/true, /*copy_back=*/false));
    // NCCL gathers into one [W·n] buffer; each rank's slice then goes to its output.
    torch::Tensor gathered =
        torch::empty({static_cast<int64_t>(n) * world_size_}, input.options().dtype(torch::kUInt8));
    FD_ASSIGN_OR_RETURN(char* all, w.Operand(gathered, /*copy_in=*/false, /*copy_back=*/false));
    {
      absl::MutexLock lock(&impl_->mu);
      if (impl_->aborted) return absl::AbortedError("NCCL allgather: communicator aborted");
      FD_RETURN_IF_ERROR(impl_->Settle(
          "allgather", Nc().AllGather(in, all, n, ncclUint8, impl_->comm, impl_->stream)));
    }
    for (int r = 0; r < world_size_; ++r) {
      if (Bytes(outputs[r]) != n || !outputs[r].is_contiguous()) {
        return absl::InvalidArgumentError("NCCL allgather: outputs must be shaped like the input");
      }
      FD_RETURN_IF_ERROR(w.CopyOut(outputs[r], all + r * n, n));
    }
    return absl::OkStatus();
  });
}

std::unique_ptr<CollectiveWork> NcclCollective::StartBroadcast(torch::Tensor tensor, int root) {
  auto work = std::make_unique<NcclWork>(impl_, "broadcast");
  return Launch(std::move(work), [&](NcclWork& w) -> absl::Status {
    FD_ASSIGN_OR_RETURN(char* p, w.Operand(tensor, /*copy_in=*/rank_ == root,
                                           /*copy_back=*/rank_ != root));
    absl::MutexLock lock(&impl_->mu);
    if (impl_->aborted) return absl::AbortedError("NCCL broadcast: communicator aborted");
    return impl_->Settle("broadcast", Nc().Broadcast(p, p, Bytes(tensor), ncclUint8, root,
                                                     impl_->comm, impl_->stream));
  });
}

absl::Status NcclCollective::Barrier() {
  torch::Tensor one = torch::ones({1}, torch::kFloat32);
  return StartAllReduceSum(one)->Wait(nullptr);
}

}  // namespace flashdraft
