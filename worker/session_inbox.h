// What the coordinator sends a worker, turned into whole items for the training thread. The reader
// thread runs ReadAll: it parses each message and assembles tensor chunks (CRC + one copy straight
// out of gRPC's buffers, while they are still in this core's cache; a separate decoder thread
// measured slower) into microbatches; the training thread Pops them.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/blocking_queue.h"
#include "common/chunk_wire.h"
#include "common/tensor_codec.h"
#include "flashdraft/v1/coordinator.pb.h"
#include "model/wire_tensor.h"
#include "worker/coordinator_link.h"
#include "worker/feeder_client.h"
#include "worker/worker_metrics.h"

namespace flashdraft {

struct InboxItem {
  // kShardLost: a shard that came as a ShardRef could not be fetched from its feeder (`text`);
  // the step cannot train in this epoch.
  enum Kind { kBatch, kCommit, kReform, kShutdown, kError, kShardLost } kind = kError;
  v1::Microbatch header;                         // kBatch
  std::map<std::string, torch::Tensor> tensors;  // kBatch
  uint64_t step = 0;                             // kBatch, kCommit, kShardLost
  std::string text;                              // kShutdown: the reason; kError: what broke
  bool job_finished = false;                     // kShutdown: the job trained all its steps
  bool checkpoint = false;  // kCommit: the epoch's rank 0 uploads its state after the step
  uint64_t epoch = 0;       // kCommit, kShardLost: the membership epoch it belongs to
  v1::Reform reform;        // kReform
};

class SessionInbox {
 public:
  // newest_epoch() once the session is over (a Shutdown came or the stream broke).
  static constexpr uint64_t kSessionOver = ~uint64_t{0};

  SessionInbox() = default;

  // Received tensors in page-locked memory (worker.device: cuda), before ReadAll starts.
  void PinReceiveBuffers() {
    stream_.sink.pinned = true;
    fetched_.sink.pinned = true;
  }

  // Counts the bytes read from the stream into `metrics` as they arrive (before ReadAll).
  void ReportTo(WorkerMetrics* metrics) { metrics_ = metrics; }

  // Fetches the shards that come as ShardRefs (before ReadAll; without one such a shard is lost).
  void FetchShardsWith(ShardFetcher* fetcher) { fetcher_ = fetcher; }

  // Reads `link` until a Shutdown, the end of the stream or a malformed message; the last two end
  // in a kError item. On the reader thread; shards that come as ShardRefs are fetched on a thread
  // of its own, in stream order, so that a fetch never holds back a Commit or a Reform (a Reform
  // cancels the fetch of an older epoch's shard).
  void ReadAll(CoordinatorLink& link) ABSL_LOCKS_EXCLUDED(fetch_mu_);

  // The next item; blocks. After the last one (a kShutdown or kError) it blocks for good.
  InboxItem Pop() {
    InboxItem item = *queue_.Pop();
    if (item.kind == InboxItem::kBatch) --queued_batches_;
    return item;
  }

  // Microbatches assembled and not popped yet (metrics).
  int64_t queued_batches() const { return queued_batches_; }

  // The newest membership epoch announced so far (read while a collective blocks: an older
  // epoch's collective is abandoned at once).
  uint64_t newest_epoch() const { return newest_epoch_; }
  // The stream ended without a Shutdown.
  bool stream_lost() const { return stream_lost_; }

 private:
  // A microbatch being put together from its header and chunks: one for the Train stream (the
  // reader thread's), one for fetched shards (the fetch thread's).
  struct Assembly {
    Assembly() : assembler(sink.allocator()) {}
    ReceivedChunk chunk;
    v1::CoordinatorMessage message;
    InboxItem pending;
    uint32_t remaining = 0;  // its tensors still to come
    TorchTensorSink sink;
    TensorAssembler assembler;
  };

  // One message. False when reading ends (a Shutdown; an error is pushed as kError).
  bool Take(const grpc::ByteBuffer& buffer) ABSL_LOCKS_EXCLUDED(fetch_mu_);
  // Adds a tensor chunk (fed to the assembler by `add_to`) to `a`'s microbatch; true in `*pushed`
  // when that completed it.
  template <typename AddTo>
  absl::Status AddChunk(Assembly& a, const AddTo& add_to, bool* pushed = nullptr);
  absl::Status BeginBatch(Assembly& a, const v1::Microbatch& header, bool* pushed = nullptr);
  void PushBatch(Assembly& a);
  void Fail(std::string why);
  // A shard by reference: queued for the fetch thread.
  absl::Status TakeShardRef(const v1::ShardRef& ref);
  // A Reform: the newest epoch, and the fetch of an older epoch's shard cancelled.
  void NewEpoch(uint64_t epoch) ABSL_LOCKS_EXCLUDED(fetch_mu_);

  // The fetch thread: each ShardRef in turn, into the queue as a kBatch or a kShardLost.
  void FetchLoop();
  void FetchShard(const v1::ShardRef& ref) ABSL_LOCKS_EXCLUDED(fetch_mu_);
  // One message of a fetched shard: its header (the ref's, once), then its chunks.
  absl::Status TakeFetched(const grpc::ByteBuffer& buffer, const v1::ShardRef& ref,
                           bool& header_seen, bool* pushed);
  void StopFetching() ABSL_LOCKS_EXCLUDED(fetch_mu_);

  BlockingQueue<InboxItem> queue_;
  std::atomic<uint64_t> newest_epoch_{0};
  std::atomic<bool> stream_lost_{false};
  std::atomic<int64_t> queued_batches_{0};
  WorkerMetrics* metrics_ = nullptr;
  ShardFetcher* fetcher_ = nullptr;
  Assembly stream_;                   // the reader thread's
  Assembly fetched_;                  // the fetch thread's
  BlockingQueue<v1::ShardRef> refs_;  // to fetch, in stream order; closed when reading ends
  absl::Mutex fetch_mu_;
  grpc::ClientContext* active_fetch_ ABSL_GUARDED_BY(fetch_mu_) = nullptr;
  uint64_t active_epoch_ ABSL_GUARDED_BY(fetch_mu_) = 0;
  bool fetching_stopped_ ABSL_GUARDED_BY(fetch_mu_) = false;
};

}  // namespace flashdraft
