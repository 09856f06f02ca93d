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

#include "absl/status/status.h"
#include "common/blocking_queue.h"
#include "common/chunk_wire.h"
#include "common/tensor_codec.h"
#include "flashdraft/v1/coordinator.pb.h"
#include "model/wire_tensor.h"
#include "worker/coordinator_link.h"
#include "worker/worker_metrics.h"

namespace flashdraft {

struct InboxItem {
  enum Kind { kBatch, kCommit, kReform, kShutdown, kError } kind = kError;
  v1::Microbatch header;                         // kBatch
  std::map<std::string, torch::Tensor> tensors;  // kBatch
  uint64_t step = 0;                             // kBatch, kCommit
  std::string text;                              // kShutdown: the reason; kError: what broke
  bool job_finished = false;                     // kShutdown: the job trained all its steps
  bool checkpoint = false;  // kCommit: the epoch's rank 0 uploads its state after the step
  uint64_t epoch = 0;       // kCommit: the membership epoch it belongs to
  v1::Reform reform;        // kReform
};

class SessionInbox {
 public:
  // newest_epoch() once the session is over (a Shutdown came or the stream broke).
  static constexpr uint64_t kSessionOver = ~uint64_t{0};

  SessionInbox();

  // Received tensors in page-locked memory (worker.device: cuda), before ReadAll starts.
  void PinReceiveBuffers() { sink_.pinned = true; }

  // Counts the bytes read from the stream into `metrics` as they arrive (before ReadAll).
  void ReportTo(WorkerMetrics* metrics) { metrics_ = metrics; }

  // Reads `link` until a Shutdown, the end of the stream or a malformed message; the last two end
  // in a kError item. On the reader thread.
  void ReadAll(CoordinatorLink& link);

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
  // One message. False when reading ends (a Shutdown; an error is pushed as kError).
  bool Take(const grpc::ByteBuffer& buffer);
  // Adds a tensor chunk (fed to the assembler by `add_to`) to the pending microbatch.
  template <typename AddTo>
  bool AddChunk(const AddTo& add_to);
  void Fail(std::string why);
  void PushBatch();  // pending_, complete

  BlockingQueue<InboxItem> queue_;
  std::atomic<uint64_t> newest_epoch_{0};
  std::atomic<bool> stream_lost_{false};
  std::atomic<int64_t> queued_batches_{0};
  WorkerMetrics* metrics_ = nullptr;
  // The reader thread's own (reused from message to message).
  ReceivedChunk chunk_;
  v1::CoordinatorMessage message_;
  InboxItem pending_;       // the microbatch being assembled
  uint32_t remaining_ = 0;  // its tensors still to come
  TorchTensorSink sink_;
  TensorAssembler assembler_;
};

}  // namespace flashdraft
